package latency

import (
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
