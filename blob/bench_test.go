package blob_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
)

const benchSize = 1 << 20

func benchStores(b *testing.B) map[string]blob.Store {
	l, err := blob.NewLocal(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	return map[string]blob.Store{"local": l, "minio": blobtest.NewS3(b)}
}

func benchPayload() []byte {
	data := make([]byte, benchSize)
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	return data
}

func report(b *testing.B, durs []time.Duration, total time.Duration) {
	st := blobtest.Summarize(benchSize, durs, total)
	b.ReportMetric(float64(st.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(st.P99.Microseconds())/1000, "p99-ms")
}

// BenchmarkPut: sequential 1 MiB PUTs (MB/s from SetBytes, plus p50/p99 latency). On minio this is the
// raw-PUT limit ingest benchmarks compare against.
func BenchmarkPut(b *testing.B) {
	for _, name := range []string{"local", "minio"} {
		b.Run(name+"/1MiB", func(b *testing.B) {
			s := benchStores(b)[name]
			data := benchPayload()
			ctx := context.Background()
			b.SetBytes(benchSize)
			var durs []time.Duration
			var total time.Duration
			i := 0
			for b.Loop() {
				i++
				start := time.Now()
				if err := s.Put(ctx, fmt.Sprintf("bench/%d", i), bytes.NewReader(data), benchSize, ""); err != nil {
					b.Fatal(err)
				}
				d := time.Since(start)
				durs, total = append(durs, d), total+d
			}
			report(b, durs, total)
		})
	}
}

// BenchmarkPutMinioGoDirect is the same PUT through minio-go alone, to show the Store wrapper's overhead.
func BenchmarkPutMinioGoDirect(b *testing.B) {
	s := blobtest.NewS3(b)
	data := benchPayload()
	ctx := context.Background()
	b.SetBytes(benchSize)
	var durs []time.Duration
	var total time.Duration
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		_, err := s.Client().PutObject(ctx, s.Bucket(), fmt.Sprintf("bench/%d", i), bytes.NewReader(data), benchSize,
			minio.PutObjectOptions{ContentType: "application/octet-stream"})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		durs, total = append(durs, d), total+d
	}
	report(b, durs, total)
}

// BenchmarkGet: sequential 1 MiB GETs read to the end.
func BenchmarkGet(b *testing.B) {
	for _, name := range []string{"local", "minio"} {
		b.Run(name+"/1MiB", func(b *testing.B) {
			s := benchStores(b)[name]
			ctx := context.Background()
			if err := s.Put(ctx, "bench/get", bytes.NewReader(benchPayload()), benchSize, ""); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(benchSize)
			var durs []time.Duration
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				rc, err := s.Get(ctx, "bench/get")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, rc)
				rc.Close()
				if err != nil || n != benchSize {
					b.Fatalf("read %d bytes, %v", n, err)
				}
				d := time.Since(start)
				durs, total = append(durs, d), total+d
			}
			report(b, durs, total)
		})
	}
}

// TestMeasurePut checks the exported meter against a real store: it stores what it says and reports sane figures.
func TestMeasurePut(t *testing.T) {
	s, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st, err := blobtest.MeasurePut(context.Background(), s, "m", 4096, 20)
	if err != nil {
		t.Fatal(err)
	}
	if st.N != 20 || st.Size != 4096 || st.P50 <= 0 || st.P99 < st.P50 || st.MBps <= 0 {
		t.Fatalf("MeasurePut = %+v", st)
	}
	for _, k := range []string{"m/0", "m/19"} {
		if info, err := s.Stat(context.Background(), k); err != nil || info.Size != 4096 {
			t.Fatalf("Stat(%s) = %+v, %v", k, info, err)
		}
	}
	if _, err := blobtest.MeasurePut(context.Background(), s, "m", 1, 0); err == nil {
		t.Fatalf("MeasurePut with n=0 succeeded")
	}
}
