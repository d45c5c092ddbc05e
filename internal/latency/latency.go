// Package latency summarises measured durations: the percentiles benchmarks and `doppel bench` report.
package latency

import (
	"math"
	"slices"
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
