// Package taudata reads the gzip-compressed tau trace batches that tests and benchmarks share (infer/testdata).
package taudata

import (
	"bytes"
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
	data, err := read(root, "tau-"+domain+"-dev.json.gz")
	if err != nil {
		return nil, err
	}
	var b trace.Batch
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&b); err != nil {
		return nil, fmt.Errorf("decode tau-%s-dev: %w", domain, err)
	}
	return b.Traces, nil
}

// ToolsJSON reads the tool definitions of a tau domain ({"tools": [{name, description, parameters}]}) from
// infer/testdata under root.
func ToolsJSON(root, domain string) ([]byte, error) {
	return read(root, "tau-"+domain+"-tools.json.gz")
}

// read answers the uncompressed content of infer/testdata/name under root.
func read(root, name string) ([]byte, error) {
	path := filepath.Join(root, "infer", "testdata", name)
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
		return nil, fmt.Errorf("gunzip %s: %w", path, err)
	}
	return data, nil
}
