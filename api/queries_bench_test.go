package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
)

// BenchmarkQueryOverhead measures what a query costs beyond its model's time: the scripted stand-in model answers
// at once, so a query's latency is the workflow on a real Temporal (DOPPEL_TEST_TEMPORAL), its activities, the
// session open and close and the two tool calls on the tau-retail twin. The baseline, measured in the same run, is
// the same tool work done directly over REST: sessions.open, the same two calls, sessions.close. Sequential, one
// query at a time.
//
//	go test ./api -run '^$' -bench BenchmarkQueryOverhead -benchtime 1x
func BenchmarkQueryOverhead(b *testing.B) {
	addr := testenv.Temporal(b)
	model := newScriptedModel(b)
	p := newQueryPlane(b, schema.DriverSQLite, model.URL+"/v1", queryOptions{rate: -1}, addr)
	order := pendingOrder(b, p)
	instr := "order " + order + " with status pending"
	body := map[string]any{"input": "Please cancel my order " + order + ".", "seed": 11, "seed_instructions": instr}
	path := "/v1/envs/" + p.env.Slug + "/query"
	const n = 200
	query := func() time.Duration {
		start := time.Now()
		code, out := p.do(http.MethodPost, path, p.key, body)
		d := time.Since(start)
		if code != http.StatusOK || out["n_spans"].(float64) != 3 {
			b.Fatalf("query: %d %v", code, out)
		}
		return d
	}
	direct := func() time.Duration {
		start := time.Now()
		s := p.open(map[string]any{"seed": 11, "seed_instructions": instr})
		if code, out := p.call(s, "get_order_details", map[string]any{"order_id": order}); code != http.StatusOK {
			b.Fatalf("call: %d %v", code, out)
		}
		if code, out := p.call(s, "cancel_pending_order", map[string]any{"order_id": order, "reason": "no longer needed"}); code != http.StatusOK {
			b.Fatalf("call: %d %v", code, out)
		}
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, p.key, nil); code != http.StatusOK {
			b.Fatalf("close: %d %v", code, out)
		}
		return time.Since(start)
	}
	for range 10 { // warm the twin, the worker and the connections
		query()
		direct()
	}
	b.ResetTimer()
	for range b.N {
		var q, d []time.Duration
		began := time.Now()
		for range n {
			q = append(q, query())
		}
		qTook := time.Since(began)
		began = time.Now()
		for range n {
			d = append(d, direct())
		}
		dTook := time.Since(began)
		q, d = latency.Sorted(q), latency.Sorted(d)
		ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
		b.ReportMetric(ms(latency.Percentile(q, 50)), "query-p50-ms")
		b.ReportMetric(ms(latency.Percentile(q, 99)), "query-p99-ms")
		b.ReportMetric(float64(n)/qTook.Seconds(), "queries/s")
		b.ReportMetric(ms(latency.Percentile(d, 50)), "direct-p50-ms")
		b.ReportMetric(ms(latency.Percentile(d, 99)), "direct-p99-ms")
		b.ReportMetric(float64(n)/dTook.Seconds(), "direct/s")
		b.Logf("query (workflow + 3 instant model turns + 2 calls): p50 %s p99 %s, %.1f/s; direct REST open+2 calls+close: p50 %s p99 %s, %.1f/s",
			latency.Percentile(q, 50), latency.Percentile(q, 99), float64(n)/qTook.Seconds(),
			latency.Percentile(d, 50), latency.Percentile(d, 99), float64(n)/dTook.Seconds())
	}
}
