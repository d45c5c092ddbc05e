package ingest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Blobs written before S2, each of the first three tau-retail traces: by the gzip encoder, then by the zstd one.
const (
	gzipBlobFile = "testdata/batch-gzip-v1.blob"
	zstdBlobFile = "testdata/batch-zstd-v1.blob"
)

func TestDecodeBlobLegacy(t *testing.T) {
	p, err := Decode(readData(t, "tau-retail-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.Batch.Traces = p.Batch.Traces[:3]
	for _, file := range []string{gzipBlobFile, zstdBlobFile} {
		old, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBlob(old)
		if err != nil {
			t.Fatalf("DecodeBlob(%s): %v", file, err)
		}
		if !reflect.DeepEqual(*got, p.Batch) {
			t.Fatalf("%s does not read back as its batch", file)
		}
		lean, err := DecodeBlobCalls(old)
		if err != nil {
			t.Fatalf("DecodeBlobCalls(%s): %v", file, err)
		}
		checkLean(t, &p.Batch, lean)
	}
	// The same batch now encodes as S2 (larger than zstd, smaller than gzip), and reads back the same.
	blob, err := EncodeBlob(&p.Batch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(blob, []byte("\xff\x06\x00\x00S2sTwO\x80\x16\x00\x00"+BlobFormat)) {
		t.Fatalf("blob does not start with an S2 stream identifier and the chunk naming the format: %q", blob[:48])
	}
	back, err := DecodeBlob(blob)
	if err != nil || !reflect.DeepEqual(*back, p.Batch) {
		t.Fatalf("S2 round trip: %v", err)
	}
}

// A blob holds the body as it came: Decode and DecodeBlob of the blob read the same batch, whatever the body's
// spacing, escapes, key order, spellings and unknown fields.
func TestEncodeBodyBlob(t *testing.T) {
	body := []byte(`{ "traces": [ {"messages": [ {"content": "caf\u00e9 \"hi\"", "role": "user", "x": [1, {"y": null}]},
		{"toolCalls": [{"function": {"arguments": "{\"a\": 1}", "name": "f"}, "id": "c1"}], "role": "assistant", "content": null},
		{"role": "tool", "toolCallId": "c1", "content": "{}", "name": "f"} ], "id": "t\/1", "model": null} ],
		"project": "Caf\u00e9", "extra": true }`)
	p, err := Decode(body, Options{})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := EncodeBodyBlob(body)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeBlob(blob)
	if err != nil || !reflect.DeepEqual(*back, p.Batch) {
		t.Fatalf("DecodeBlob = %+v, %v; want %+v", back, err, p.Batch)
	}
	var js []byte
	if js, err = blobJSON(blob, nil); err != nil || !bytes.Equal(js, body) {
		t.Fatalf("the blob holds %q (%v), want the body", js, err)
	}
	again, _ := EncodeBodyBlob(body)
	if !bytes.Equal(again, blob) {
		t.Fatal("one body gave two blobs")
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
	body := []byte(`{"project":"p","traces":[{"id":"t","messages":[{"role":"user","content":"hi"}]}]}`)
	good, err := EncodeBodyBlob(body)
	if err != nil {
		t.Fatal(err)
	}
	s2Of := func(write func(w *s2.Writer)) []byte {
		var out bytes.Buffer
		w := s2.NewWriter(&out)
		write(w)
		w.Close()
		return out.Bytes()
	}
	legacy, err := os.ReadFile(zstdBlobFile)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Comment = "something else"
	zw.Write(body)
	zw.Close()
	for _, tc := range []struct {
		name string
		blob []byte
		want string
	}{
		{"empty", nil, "not a batch blob"},
		{"plain JSON", body, "not a batch blob"},
		{"other format", bytes.Replace(bytes.Clone(good), []byte("body v1"), []byte("body v9"), 1), `format "doppel collect body v9"`},
		{"no format chunk", s2Of(func(w *s2.Writer) { w.Write(body) }), "without the chunk naming its format"},
		{"S2 stream identifier alone", bytes.Clone(s2Magic), "without the chunk naming its format"},
		{"format chunk after data", s2Of(func(w *s2.Writer) {
			w.Write(body)
			w.Flush()
			w.AddSkippableBlock(blobFormatChunk, []byte(BlobFormat))
		}), "without the chunk naming its format"},
		{"truncated S2", good[:len(good)-3], "decompress"},
		{"damaged S2", bytes.Replace(bytes.Clone(good), []byte(`"project"`), []byte(`"projekt"`), 1), "decompress"},
		{"zstd format frame only", legacy[:8], "truncated format frame"},
		{"zstd of another format", bytes.Replace(bytes.Clone(legacy), []byte("batch v1"), []byte("batch v9"), 1), `format "doppel collect batch v9"`},
		{"truncated zstd", legacy[:len(legacy)-3], "decompress"},
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

// BenchmarkBlobCodecs compresses and decompresses the JSON of 50 tau-retail traces (the collect benchmark's batch)
// as collect stores a body now (S2) and, beside it in the same run, as the encoders before did: canonical JSON
// then zstd's fastest level, and before that gzip's: MB/s of JSON over wall time and over the CPU time of the
// benchmark's thread (cpu_MB/s, which other processes on a busy machine do not slow much), and the blob's size
// as a percentage of the JSON.
func BenchmarkBlobCodecs(b *testing.B) {
	p, err := Decode(readData(b, "tau-retail-dev.json"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	p.Batch.Traces = p.Batch.Traces[:50]
	js := AppendJSON(nil, &p.Batch)
	var buf []byte
	ze, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	for _, c := range []struct {
		name   string
		encode func() []byte
	}{
		{"s2", func() []byte { // collect compresses the body it received
			blob, err := EncodeBodyBlob(js)
			if err != nil {
				b.Fatal(err)
			}
			return blob
		}},
		{"zstd1", func() []byte {
			buf = AppendJSON(buf[:0], &p.Batch)
			return ze.EncodeAll(buf, legacyZstdHeader())
		}},
		{"gzip1", func() []byte {
			buf = AppendJSON(buf[:0], &p.Batch)
			var out bytes.Buffer
			zw.Reset(&out)
			zw.Comment = legacyFormat
			zw.Write(buf)
			zw.Close()
			return out.Bytes()
		}},
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
			var dst []byte
			for b.Loop() {
				got, err := blobJSON(blob, dst)
				if err != nil || len(got) != len(js) {
					b.Fatalf("%d bytes, %v", len(got), err)
				}
				dst = got[:0]
			}
			b.ReportMetric(float64(b.N*len(js))/1e6/(threadCPU(b)-cpu0).Seconds(), "cpu_MB/s")
		})
	}
}

// legacyZstdHeader is the skippable frame that started a zstd blob, naming legacyFormat.
func legacyZstdHeader() []byte {
	h := binary.LittleEndian.AppendUint32(nil, zstdSkippable)
	h = binary.LittleEndian.AppendUint32(h, uint32(len(legacyFormat)))
	return append(h, legacyFormat...)
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
