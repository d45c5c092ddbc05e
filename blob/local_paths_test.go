package blob_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/blob"
)

// Issue #13: the local store's errors say what failed and name the key, never where the store keeps its files:
// they reach build errors and /readyz.
func TestLocalErrorsNameNoPaths(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "blobs")
	s, err := blob.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("some bytes")
	if err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	var file string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			file = p
		}
		return nil
	})
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s succeeded", what)
			return
		}
		if strings.Contains(err.Error(), filepath.Dir(root)) {
			t.Errorf("%s: %q names the store's directory", what, err)
		}
	}
	if err := os.WriteFile(file, []byte("DPLBLOB1 not a blob"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, "k")
	check("Get of a corrupt file", err)
	_, err = s.Stat(ctx, "k")
	check("Stat of a corrupt file", err)

	// The directory gone, a file in its place.
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check("Ping", s.Ping(ctx))
	check("Put", s.Put(ctx, "k2", bytes.NewReader(data), int64(len(data)), ""))
	_, err = s.Get(ctx, "k")
	check("Get", err)
	check("Delete", s.Delete(ctx, "k"))
}
