// Package taudata reads the gzip-compressed trace batches that tests and benchmarks share (infer/testdata): tau
// retail and airline, and BFCL multi-turn.
package taudata

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/doppel-dev/doppel/trace"
)

// Traces reads the dev traces of a tau domain ("retail", "airline") from infer/testdata, found from root, the
// repository's root relative to the caller's package directory (".." from a top-level package).
func Traces(root, domain string) ([]trace.Trace, error) {
	return decode(root, "tau-"+domain+"-dev.json")
}

// BFCL reads the BFCL multi-turn dev traces (268 traces of 134 tasks, each task run from its own starting world)
// from infer/testdata, found from root as Traces finds them.
func BFCL(root string) ([]trace.Trace, error) {
	return decode(root, "bfcl-multi-turn-dev.json")
}

// File answers a testdata file's bytes, decompressed: name is the file's name without ".gz"
// ("bfcl-multi-turn-tools.json", "tau-retail-tools.json").
func File(root, name string) ([]byte, error) {
	path := filepath.Join(root, "infer", "testdata", name+".gz")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("gunzip %s: %w", path, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

func decode(root, name string) ([]trace.Trace, error) {
	data, err := File(root, name)
	if err != nil {
		return nil, err
	}
	var b trace.Batch
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("decode %s: %w", name, err)
	}
	return b.Traces, nil
}
