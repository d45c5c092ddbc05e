// Package latency paces load and summarises measured durations: the schedule and percentiles benchmarks and
// `doppel bench` use.
package latency

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Percentile returns the p-th percentile (nearest rank) of sorted durations; 100 is the maximum, and no
// durations give 0.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Sorted returns a sorted copy of ds.
func Sorted(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

// Offer calls fn(i, due) for i = 0, 1, … on a fixed schedule of rate calls a second, each from its own goroutine
// so a slow call cannot slow the offered load, until n calls have gone out (n ≤ 0: no limit) or ctx ends; it
// returns once every call has returned. due is the call's place in the schedule. Go's timers may wake about a
// millisecond late on an idle machine: the calls then due all go out at once, so the offered rate holds, but a
// call's latency should be timed from when fn starts, with the lag behind due reported apart as the load
// generator's own.
func Offer(ctx context.Context, rate, n int, fn func(i int, due time.Time)) {
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; n <= 0 || i < n; i++ {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() { fn(i, due) })
	}
	wg.Wait()
}
