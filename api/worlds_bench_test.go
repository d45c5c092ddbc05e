package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/trace"
)

// writes drives a session through n calls that each move its state hash: the retail traces' writes, then (as they
// start to conflict in one session) address changes of the traces' users.
func (p *plane) writes(b *testing.B, s session, traces []trace.Trace, n int) {
	done := 0
	try := func(tool string, args json.RawMessage) {
		before := p.stateHash(s)
		if code, out := p.call(s, tool, args); code != http.StatusOK {
			b.Fatalf("%s: %d %v", tool, code, out)
		}
		if p.stateHash(s) != before {
			done++
		}
	}
	for _, tr := range traces {
		for _, c := range trace.Calls(tr) {
			if done < n {
				try(c.Tool, json.RawMessage(c.RawArgs))
			}
		}
	}
	seen := map[string]bool{}
	for _, tr := range traces {
		for _, c := range trace.Calls(tr) {
			u, _ := c.Args["user_id"].(string)
			if done >= n || u == "" || seen[u] {
				continue
			}
			seen[u] = true
			try("modify_user_address", json.RawMessage(fmt.Sprintf(`{"user_id": %q, "address1": "1 Fork Road", "address2": "Suite %d", "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"}`, u, done)))
		}
	}
	if done < n {
		b.Fatalf("only %d writes", done)
	}
}

func reportLatency(b *testing.B, lat []time.Duration) {
	sorted := latency.Sorted(lat)
	b.ReportMetric(ms(latency.Percentile(sorted, 50)), "p50-ms")
	b.ReportMetric(ms(latency.Percentile(sorted, 99)), "p99-ms")
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkForkREST forks a retail session through the REST route (auth, the twin's copy-on-write fork, the new
// session row and token) after 0, 10 and 100 writes, and diffs it against its opening world after 100 writes,
// beside the baseline of opening a fresh session through the same handler in the same run. SQLite metadata, the
// in-process twin reached directly.
func BenchmarkForkREST(b *testing.B) {
	bundle, traces := retailBundle(b)
	p := newPlane(b, schema.DriverSQLite, bundle, planeOptions{local: true})
	timed := func(b *testing.B, f func()) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			f()
			lat = append(lat, time.Since(start))
		}
		reportLatency(b, lat)
	}
	b.Run("baseline-open", func(b *testing.B) {
		timed(b, func() { p.open(map[string]any{"seed": 1}) })
	})
	s := p.open(map[string]any{"seed": 1})
	done := 0
	for _, n := range []int{0, 10, 100} {
		if n > done {
			p.writes(b, s, traces, n-done)
			done = n
		}
		b.Run(fmt.Sprintf("fork-after-%d-writes", n), func(b *testing.B) {
			timed(b, func() { p.fork(s, s.Token, nil) })
		})
	}
	b.Run("diff-after-100-writes", func(b *testing.B) {
		timed(b, func() {
			if code, out := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/diff", s.Token, nil); code != http.StatusOK {
				b.Fatalf("diff: %d %v", code, out)
			}
		})
	})
}
