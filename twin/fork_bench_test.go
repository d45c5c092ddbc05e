package twin_test

import (
	"fmt"

	"testing"
	"time"

	"github.com/doppel-dev/doppel/trace"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/twin"
)

// writesOn answers a retail session after n calls that each moved its state hash (n ≤ the writes the traces hold).
func writesOn(b *testing.B, rt *twin.Runtime, traces [][]trace.Call, n int) *twin.Session {
	s, _, err := rt.Open(twin.SessionSpec{Seed: 11})
	if err != nil {
		b.Fatal(err)
	}
	done := 0
	for _, calls := range traces {
		for _, c := range calls {
			if done == n {
				return s
			}
			before := s.StateHash()
			if call(b, s, c).StateHash != before {
				done++
			}
		}
	}
	// The traces' writes conflict with each other in one session before 100: move users' addresses for the rest.
	seen := map[string]bool{}
	for _, calls := range traces {
		for _, c := range calls {
			u, _ := c.Args["user_id"].(string)
			if done == n {
				return s
			}
			if u == "" || seen[u] {
				continue
			}
			seen[u] = true
			args := fmt.Sprintf(`{"user_id": %q, "address1": "1 Fork Road", "address2": "Suite %d", "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"}`, u, done)
			before := s.StateHash()
			if call(b, s, trace.Call{Tool: "modify_user_address", RawArgs: args}).StateHash != before {
				done++
			}
		}
	}
	if done < n {
		b.Fatalf("only %d writes", done)
	}
	return s
}

func report(b *testing.B, lat []time.Duration) {
	sorted := latency.Sorted(lat)
	b.ReportMetric(float64(latency.Percentile(sorted, 50).Nanoseconds())/1000, "p50-µs")
	b.ReportMetric(float64(latency.Percentile(sorted, 99).Nanoseconds())/1000, "p99-µs")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkFork forks a retail session after 0, 10 and 100 writes (the fork copies the session's overlay maps, so
// its cost follows the writes), beside the baseline of opening a fresh session on the same world in the same run.
func BenchmarkFork(b *testing.B) {
	rt, traces := domain(b, "retail")
	b.Run("baseline-open", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, _, err := rt.Open(twin.SessionSpec{Seed: int64(i)}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		report(b, lat)
	})
	for _, n := range []int{0, 10, 100} {
		s := writesOn(b, rt, traces, n)
		b.Run(fmt.Sprintf("after-%d-writes", n), func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				start := time.Now()
				f, err := s.Fork()
				if err != nil {
					b.Fatal(err)
				}
				_ = f.StateHash()
				lat = append(lat, time.Since(start))
			}
			report(b, lat)
		})
	}
}

// BenchmarkDiff diffs a retail session after 100 writes against its opening world and against a fork that took one
// more write, beside the baseline of computing the session's state hash in the same run.
func BenchmarkDiff(b *testing.B) {
	rt, traces := domain(b, "retail")
	s := writesOn(b, rt, traces, 100)
	b.Run("baseline-state-hash", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			f, _ := s.Fork()
			f.PutRow("orders", "#W0000000", nil) // dirty one bucket, as a call would
			start := time.Now()
			_ = f.StateHash()
			lat = append(lat, time.Since(start))
		}
		report(b, lat)
	})
	b.Run("after-100-writes-vs-opening", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		var changes int
		for i := 0; i < b.N; i++ {
			start := time.Now()
			d, err := s.Diff(nil)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			changes = len(d)
		}
		report(b, lat)
		b.ReportMetric(float64(changes), "rows-changed")
	})
}
