package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/blob"
)

func TestPutContent(t *testing.T) {
	ctx := context.Background()
	s, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"tools": []}`)
	key, err := blob.PutContent(ctx, s, "uploads/", data, "application/json")
	if err != nil {
		t.Fatal(err)
	}
	if key != blob.ContentKey("uploads", data) {
		t.Errorf("key = %q, want the content address %q", key, blob.ContentKey("uploads", data))
	}
	again, err := blob.PutContent(ctx, s, "uploads", data, "application/json")
	if err != nil || again != key {
		t.Errorf("the same bytes again: key %q, %v; want %q", again, err, key)
	}
	if got := stored(t, s, key); string(got) != string(data) {
		t.Errorf("stored %q, want %q", got, data)
	}
	info, err := s.Stat(ctx, key)
	if err != nil || info.ContentType != "application/json" {
		t.Errorf("stat = %+v, %v", info, err)
	}
}

// PutContentFrom and PutContentSpooled store what their writer writes under the same content address
// PutContent gives those bytes; a writer that fails stores nothing. A spool that cannot be made (its directory
// is missing) falls back to writing twice.
func TestPutContentFrom(t *testing.T) {
	ctx := context.Background()
	s, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	type putFunc func(ctx context.Context, s blob.Putter, prefix string, write func(io.Writer) error, contentType string) (string, string, error)
	spooled := func(dir string) putFunc {
		return func(ctx context.Context, s blob.Putter, prefix string, write func(io.Writer) error, ct string) (string, string, error) {
			return blob.PutContentSpooled(ctx, s, prefix, dir, write, ct)
		}
	}
	big := bytes.Repeat([]byte(`{"row":"abcdefgh"},`), 1<<16) // past any pipe or copy buffer
	for _, put := range []struct {
		name string
		f    putFunc
	}{
		{"twice", blob.PutContentFrom},
		{"spooled", spooled(t.TempDir())},
		{"spool-missing-dir", spooled(filepath.Join(t.TempDir(), "absent"))},
	} {
		for _, tc := range []struct {
			name string
			data []byte
		}{{"small", []byte(`{"tools": []}`)}, {"empty", nil}, {"large", big}} {
			t.Run(put.name+"/"+tc.name, func(t *testing.T) {
				runs := 0
				write := func(w io.Writer) error {
					runs++
					for rest := tc.data; len(rest) > 0; rest = rest[min(len(rest), 1000):] {
						if _, err := w.Write(rest[:min(len(rest), 1000)]); err != nil {
							return err
						}
					}
					return nil
				}
				key, sum, err := put.f(ctx, s, "bundles/", write, "application/octet-stream")
				if err != nil {
					t.Fatal(err)
				}
				if want := map[string]int{"twice": 2, "spooled": 1, "spool-missing-dir": 2}[put.name]; runs != want {
					t.Errorf("write ran %d times, want %d", runs, want)
				}
				want := blob.ContentKey("bundles", tc.data)
				if key != want || !strings.HasSuffix(want, "/"+sum) {
					t.Errorf("key, sum = %q, %q; want the content address %q", key, sum, want)
				}
				if got := stored(t, s, key); !bytes.Equal(got, tc.data) {
					t.Errorf("stored %d bytes, want %d", len(got), len(tc.data))
				}
			})
		}
		fail := errors.New("no bundle")
		if _, _, err := put.f(ctx, s, "bundles/", func(io.Writer) error { return fail }, "application/octet-stream"); !errors.Is(err, fail) {
			t.Errorf("%s: a failing writer: err = %v, want %v", put.name, err, fail)
		}
	}
}

// stored answers the bytes s holds under key.
func stored(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
