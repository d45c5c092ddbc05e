package api_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/schema"
)

// Issue #13: /readyz answers anyone. It says which check failed and how, never where the server keeps its files.
func TestReadyzNamesNoPaths(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	root := filepath.Join(t.TempDir(), "srv-doppel-blobs")
	local, err := blob.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	// The blob directory replaced by a file: the store cannot write.
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checks := map[string]api.Checker{
		"blob": local.Ping,
		"db": func(context.Context) error {
			return fmt.Errorf("open database: %w", &fs.PathError{Op: "open", Path: "/var/lib/doppel/doppel.db", Err: syscall.EACCES})
		},
		"disk": func(context.Context) error {
			return &os.LinkError{Op: "rename", Old: "/var/lib/doppel/a", New: "/var/lib/doppel/b", Err: syscall.EXDEV}
		},
	}
	h, _ := api.New(api.Options{DB: f.db, Readiness: checks, ReadyTimeout: time.Second})
	w := doHandler(h, "GET", "/readyz")
	m := envelope(t, w, 503, api.CodeUnavailable)
	detail, _ := m["detail"].(string)
	for _, leak := range []string{filepath.Dir(root), "/var/lib/doppel"} {
		if strings.Contains(detail, leak) {
			t.Errorf("detail %q names %s", detail, leak)
		}
	}
	for _, want := range []string{"blob: ", "db: open database: open: permission denied", "disk: rename: invalid cross-device link"} {
		if !strings.Contains(detail, want) {
			t.Errorf("detail %q does not say %q", detail, want)
		}
	}
}
