package blobtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/internal/latency"
)

// PutStats summarises a series of sequential PUTs of one size.
type PutStats struct {
	N    int
	Size int
	P50  time.Duration
	P99  time.Duration
	Mean time.Duration
	MBps float64 // payload megabytes (1e6 bytes) per second of summed PUT time
}

func (p PutStats) String() string {
	return fmt.Sprintf("%d PUTs of %d bytes: p50 %v p99 %v mean %v, %.1f MB/s", p.N, p.Size, p.P50, p.P99, p.Mean, p.MBps)
}

// MeasurePut times n sequential PUTs of size bytes each into s, under keys prefix/0 .. prefix/n-1 (left in place).
// Against MinIO this is the raw-PUT baseline that ingest benchmarks compare against.
func MeasurePut(ctx context.Context, s blob.Store, prefix string, size, n int) (PutStats, error) {
	if n <= 0 || size < 0 {
		return PutStats{}, fmt.Errorf("blobtest: MeasurePut needs n > 0 and size >= 0, got n=%d size=%d", n, size)
	}
	data := payload(size, 9)
	durs := make([]time.Duration, n)
	var total time.Duration
	for i := range n {
		key := fmt.Sprintf("%s/%d", prefix, i)
		start := time.Now()
		if err := s.Put(ctx, key, bytes.NewReader(data), int64(size), "application/octet-stream"); err != nil {
			return PutStats{}, fmt.Errorf("blobtest: PUT %d of %d: %w", i+1, n, err)
		}
		durs[i] = time.Since(start)
		total += durs[i]
	}
	return Summarize(size, durs, total), nil
}

// Summarize computes PutStats from per-operation durations; total is the summed time the operations took.
func Summarize(size int, durs []time.Duration, total time.Duration) PutStats {
	if len(durs) == 0 {
		return PutStats{Size: size}
	}
	sorted := slices.Clone(durs)
	slices.Sort(sorted)
	st := PutStats{
		N:    len(sorted),
		Size: size,
		P50:  latency.Percentile(sorted, 50),
		P99:  latency.Percentile(sorted, 99),
		Mean: total / time.Duration(len(sorted)),
	}
	if total > 0 {
		st.MBps = float64(size) * float64(len(sorted)) / 1e6 / total.Seconds()
	}
	return st
}
