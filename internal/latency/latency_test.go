package latency

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	sorted := Sorted(d)
	if d[0] != 100*time.Millisecond {
		t.Fatal("Sorted changed its input")
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}, {0, time.Millisecond}}
	for _, tc := range tests {
		if got := Percentile(sorted, tc.p); got != tc.want {
			t.Errorf("Percentile(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(sorted[:1], 99); got != time.Millisecond {
		t.Errorf("Percentile of one = %v", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile of none = %v", got)
	}
}

func TestOffer(t *testing.T) {
	const n, rate = 50, 10000
	var mu sync.Mutex
	dues := make(map[int]time.Time)
	Offer(context.Background(), rate, n, func(i int, due time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := dues[i]; dup {
			t.Errorf("call %d made twice", i)
		}
		dues[i] = due
	})
	if len(dues) != n {
		t.Fatalf("%d calls made, want %d", len(dues), n)
	}
	for i := 1; i < n; i++ {
		if d := dues[i].Sub(dues[i-1]); d != time.Second/rate {
			t.Fatalf("call %d is due %v after call %d, want %v", i, d, i-1, time.Second/rate)
		}
	}
	// With no limit, the calls stop when the context ends, and every call made has returned by then.
	ctx, cancel := context.WithCancel(context.Background())
	var made, running atomic.Int64
	Offer(ctx, rate, 0, func(i int, _ time.Time) {
		running.Add(1)
		defer running.Add(-1)
		if made.Add(1) == 20 {
			cancel()
		}
	})
	if made.Load() < 20 || running.Load() != 0 {
		t.Fatalf("made %d calls, %d still running after Offer returned", made.Load(), running.Load())
	}
}
