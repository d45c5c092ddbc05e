package ingest

import (
	"bytes"
	"compress/gzip"
	"os"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
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

// DecodeBlob reuses the memory of a blob's JSON for the next blob: a batch read earlier must not share it, so
// reading others after it leaves it as it was.
func TestDecodeBlobKeepsNoJSON(t *testing.T) {
	p, err := Decode(readData(t, "tau-retail-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	all := p.Batch.Traces
	var blobs [][]byte
	for i := 0; i+10 <= len(all) && i < 40; i += 10 {
		p.Batch.Traces = all[i : i+10]
		blob, err := EncodeBlob(&p.Batch)
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, blob)
	}
	first, err := DecodeBlob(blobs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := AppendJSON(nil, first)
	for range 3 {
		for _, blob := range blobs[1:] {
			if _, err := DecodeBlob(blob); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.Batch.Traces = all[:10]
	if got := AppendJSON(nil, first); !bytes.Equal(got, want) || !bytes.Equal(got, AppendJSON(nil, &p.Batch)) {
		t.Fatal("a batch read earlier changed as later blobs were read")
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

// BenchmarkBlobCodecs compresses and decompresses the canonical JSON of 50 tau-retail traces (the
// collect benchmark's batch) with the blob codec and, beside it in the same run, the gzip level the
// blobs used before: MB/s of JSON over wall time and over the CPU time of the benchmark's thread
// (cpu_MB/s, which other processes on a busy machine do not slow much), and the blob's size as a
// percentage of the JSON.
func BenchmarkBlobCodecs(b *testing.B) {
	p, err := Decode(readData(b, "tau-retail-dev.json"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	p.Batch.Traces = p.Batch.Traces[:50]
	js := AppendJSON(nil, &p.Batch)
	// The gzip encoder as it was: canonical JSON, then gzip at its fastest level (writer reused).
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	var buf []byte
	legacy := func() []byte {
		buf = AppendJSON(buf[:0], &p.Batch)
		var out bytes.Buffer
		zw.Reset(&out)
		zw.Comment = BlobFormat
		zw.Write(buf)
		zw.Close()
		return out.Bytes()
	}
	for _, c := range []struct {
		name   string
		encode func() []byte
	}{
		{"zstd", func() []byte {
			blob, err := EncodeBlob(&p.Batch)
			if err != nil {
				b.Fatal(err)
			}
			return blob
		}},
		{"gzip1", legacy},
	} {
		blob := c.encode()
		b.Run(c.name+"/encode", func(b *testing.B) {
			b.SetBytes(int64(len(js)))
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			for b.Loop() {
				c.encode()
			}
			b.ReportMetric(float64(b.N*len(js))/1e6/(threadCPU(b)-cpu0).Seconds(), "cpu_MB/s")
			b.ReportMetric(100*float64(len(blob))/float64(len(js)), "size_%")
		})
		b.Run(c.name+"/decode", func(b *testing.B) {
			b.SetBytes(int64(len(js)))
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			for b.Loop() {
				got, err := blobJSON(blob, nil)
				if err != nil || len(got) != len(js) {
					b.Fatalf("%d bytes, %v", len(got), err)
				}
			}
			b.ReportMetric(float64(b.N*len(js))/1e6/(threadCPU(b)-cpu0).Seconds(), "cpu_MB/s")
		})
	}
}

// threadCPU answers the CPU time of the calling OS thread (the caller locks its goroutine to it).
func threadCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rusageThread is Linux's RUSAGE_THREAD, which package syscall does not name.
const rusageThread = 1
