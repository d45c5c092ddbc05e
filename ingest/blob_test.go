package ingest

import (
	"bytes"
	"compress/gzip"
	"os"
	"reflect"
	"strings"
	"testing"
)

// A blob written by the gzip encoder (before zstd) from the first three tau-retail traces.
const gzipBlobFile = "testdata/batch-gzip-v1.blob"

func TestDecodeBlobGzip(t *testing.T) {
	old, err := os.ReadFile(gzipBlobFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(readData(t, "tau-retail-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.Batch.Traces = p.Batch.Traces[:3]
	got, err := DecodeBlob(old)
	if err != nil {
		t.Fatalf("DecodeBlob(gzip blob): %v", err)
	}
	if !reflect.DeepEqual(*got, p.Batch) {
		t.Fatal("the gzip blob does not read back as its batch")
	}
	// The same batch now encodes as zstd, and reads back the same.
	blob, err := EncodeBlob(&p.Batch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(blob, []byte{0x50, 0x2a, 0x4d, 0x18}) || !bytes.Contains(blob[:64], []byte(BlobFormat)) ||
		!bytes.Contains(blob[:64], []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Fatalf("blob does not start with the format frame and a zstd frame: % x", blob[:48])
	}
	back, err := DecodeBlob(blob)
	if err != nil || !reflect.DeepEqual(*back, p.Batch) {
		t.Fatalf("zstd round trip: %v", err)
	}
	if len(blob) >= len(old) {
		t.Errorf("zstd blob %d bytes, gzip blob %d", len(blob), len(old))
	}
}

func TestDecodeBlobRejects(t *testing.T) {
	p, err := Decode([]byte(`{"project":"p","traces":[{"id":"t","messages":[{"role":"user","content":"hi"}]}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	good, err := EncodeBlob(&p.Batch)
	if err != nil {
		t.Fatal(err)
	}
	otherFormat := bytes.Replace(bytes.Clone(good), []byte("batch v1"), []byte("batch v9"), 1)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Comment = "something else"
	zw.Write(AppendJSON(nil, &p.Batch))
	zw.Close()
	for _, tc := range []struct {
		name string
		blob []byte
		want string
	}{
		{"empty", nil, "neither a zstd nor a gzip batch blob"},
		{"plain JSON", AppendJSON(nil, &p.Batch), "neither a zstd nor a gzip batch blob"},
		{"format frame only", good[:8], "truncated format frame"},
		{"other format", otherFormat, `format "doppel collect batch v9"`},
		{"truncated zstd", good[:len(good)-3], "decompress"},
		{"gzip of another format", gz.Bytes(), `format "something else"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBlob(tc.blob)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeBlob = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Equal batches give equal blobs, also when encoded concurrently (pooled encoders keep no state
// between blobs).
func TestEncodeBlobDeterministic(t *testing.T) {
	p, err := Decode(readData(t, "tau-airline-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := EncodeBlob(&p.Batch)
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]byte, 8)
	errs := make([]error, len(got))
	done := make(chan int)
	for i := range got {
		go func() { got[i], errs[i] = EncodeBlob(&p.Batch); done <- i }()
	}
	for range got {
		<-done
	}
	for i := range got {
		if errs[i] != nil || !bytes.Equal(got[i], want) {
			t.Fatalf("blob %d differs (%v)", i, errs[i])
		}
	}
}
