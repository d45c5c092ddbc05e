package blob_test

import (
	"context"
	"io"
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
	rc, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != string(data) {
		t.Errorf("stored %q, want %q", got, data)
	}
	info, err := s.Stat(ctx, key)
	if err != nil || info.ContentType != "application/json" {
		t.Errorf("stat = %+v, %v", info, err)
	}
}
