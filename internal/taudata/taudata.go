// Package taudata reads the gzip-compressed tau trace batches that tests and benchmarks share (infer/testdata).
package taudata

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/doppel-dev/doppel/trace"
)

// Traces reads the dev traces of a tau domain ("retail", "airline") from infer/testdata, found from root, the
// repository's root relative to the caller's package directory (".." from a top-level package).
func Traces(root, domain string) ([]trace.Trace, error) {
	path := filepath.Join(root, "infer", "testdata", "tau-"+domain+"-dev.json.gz")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("gunzip %s: %w", path, err)
	}
	var b trace.Batch
	if err := json.NewDecoder(zr).Decode(&b); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return b.Traces, nil
}
