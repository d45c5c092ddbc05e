// Package sampledata reads the recorded sample traces and tool definitions kept gzip-compressed in testdata/.
package sampledata

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/doppel-dev/doppel/trace"
)

// Root is the repository's root: the nearest directory at or above the working directory (a test's package
// directory) that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("sampledata: no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// Read returns the decompressed bytes of testdata/<name>.gz.
func Read(name string) ([]byte, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "testdata", name+".gz")
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

// Batch decodes a trace file (a collect body) of testdata/.
func Batch(name string) (trace.Batch, error) {
	var b trace.Batch
	data, err := Read(name)
	if err != nil {
		return b, err
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&b); err != nil {
		return b, fmt.Errorf("decode %s: %w", name, err)
	}
	return b, nil
}

// Traces reads the dev traces of a tau domain ("retail", "airline").
func Traces(domain string) ([]trace.Trace, error) {
	b, err := Batch("tau-" + domain + "-dev.json")
	return b.Traces, err
}

// MustRead is Read for a test: it fails tb on an error.
func MustRead(tb testing.TB, name string) []byte {
	tb.Helper()
	data, err := Read(name)
	if err != nil {
		tb.Fatalf("sample data: %v", err)
	}
	return data
}

// File writes the decompressed testdata/<name>.gz under a temporary directory of tb, named name, and returns its
// path: for code that reads files (doppel collect, doppel bench --traces).
func File(tb testing.TB, name string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, MustRead(tb, name), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}
