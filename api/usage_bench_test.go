package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/usage"
)

// seedHistory gives the plane's workspace n sessions opened this period (spread over the last days, nine in ten
// closed), with three journaled calls each: the records GET /v1/usage and the gate read.
func seedHistory(b testing.TB, p *plane, n int) {
	ctx := context.Background()
	now := schema.Now()
	from, _ := usage.Bounds(now, usage.PeriodMonth)
	span := now.Sub(from)
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		var sessions []schema.Session
		var calls []schema.Call
		for i := lo; i < min(lo+batch, n); i++ {
			opened := from.Add(time.Duration(int64(span) / int64(n) * int64(i)))
			s := schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: p.env.ID, WorkspaceID: p.ws.ID, BuildID: p.build.ID,
				TokenHash: schema.NewID("h"), Status: schema.SessionClosed, CreatedAt: opened, LastUsedAt: opened,
				ExpiresAt: opened.Add(time.Hour), ClosedAt: new(opened.Add(time.Duration(i%600) * time.Second))}
			if i%10 == 0 {
				s.Status, s.ClosedAt = schema.SessionExpired, new(opened.Add(2*time.Hour))
			}
			sessions = append(sessions, s)
			for k := 1; k <= 3; k++ {
				calls = append(calls, schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: s.ID, Seq: int64(k), Tool: "get_order_details",
					Arguments: []byte("{}"), Fidelity: schema.FidelityBTwin, CreatedAt: opened.Add(time.Duration(k) * time.Second)})
			}
		}
		if _, err := p.db.NewInsert().Model(&sessions).Exec(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := p.db.NewInsert().Model(&calls).Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func get(hc *http.Client, url, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// bigPlans meter every workspace with limits the load never reaches: metering on, nothing refused.
var bigPlans = &usage.Plans{Default: "big", ByName: map[string]usage.Plan{
	"big": {TaskMinutes: 1 << 40, ToolCalls: 1 << 40, OpenSessions: 1 << 20},
}}

// BenchmarkUsageGet: GET /v1/usage over loopback HTTP, one after another, with 10,000 sessions (30,000 calls) in
// the period; beside it GET /v1/envs/{slug} (auth and one row) in the same run.
func BenchmarkUsageGet(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		b.Run(driver+"/sessions=10000", func(b *testing.B) {
			p := newPlane(b, driver, shopBundle(b), planeOptions{plans: bigPlans})
			seedHistory(b, p, 10000)
			srv := httptest.NewServer(p.h)
			b.Cleanup(srv.Close)
			hc := loadClient()
			n := max(b.N, 200)
			measure := func(url string) []time.Duration {
				lat := make([]time.Duration, 0, n)
				for range n {
					t0 := time.Now()
					if code, err := get(hc, url, p.key); err != nil || code != http.StatusOK {
						b.Fatalf("GET %s: %d %v", url, code, err)
					}
					lat = append(lat, time.Since(t0))
				}
				return latency.Sorted(lat)
			}
			measure(srv.URL + "/v1/usage") // warm
			b.ResetTimer()
			lat := measure(srv.URL + "/v1/usage")
			b.StopTimer()
			base := measure(srv.URL + "/v1/envs/" + p.env.Slug)
			b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
			b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
			b.ReportMetric(ms(latency.Percentile(base, 50)), "envget-p50-ms")
			b.ReportMetric(ms(latency.Percentile(base, 99)), "envget-p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkCallMetering: tool calls at 1,000/s over 64 sessions of a workspace with 10,000 sessions in the
// period, with metering off (no quota) and on (the gate before every open and call, re-reading the workspace's
// records every second in the background), in one run, beside the loopback floor.
func BenchmarkCallMetering(b *testing.B) {
	const rate = 1000
	for _, driver := range schematest.Drivers() {
		b.Run(driver, func(b *testing.B) {
			serverGC(b)
			bundle, traces := retailBundle(b)
			work := workload(traces)
			setup := func(plans *usage.Plans) []*loadTarget {
				p := newPlane(b, driver, bundle, planeOptions{journal: journal.CallOptions{}, plans: plans})
				seedHistory(b, p, 10000)
				srv := httptest.NewServer(p.h)
				b.Cleanup(srv.Close)
				targets := make([]*loadTarget, 64)
				for i := range targets {
					s := p.open(map[string]any{"seed": i})
					targets[i] = &loadTarget{url: srv.URL + "/v1/sessions/" + s.ID + "/call", token: s.Token, calls: work[i%len(work)]}
				}
				return targets
			}
			off, on := setup(nil), setup(bigPlans)
			hc := loadClient()
			raw := rawServer(b)
			n := max(b.N, 5*rate)
			run := func(targets []*loadTarget, n int) []time.Duration {
				send := func(i int) (int, error) {
					t := targets[i%len(targets)]
					return post(hc, t.url, t.token, t.body())
				}
				lat, bad, errs, _ := openLoop(n, rate, send)
				if bad > 0 {
					b.Errorf("%d of %d calls did not answer 200, first: %q", bad, n, errs)
				}
				return lat
			}
			run(off, rate/2) // warm both
			run(on, rate/2)
			// Off and on alternate in four rounds, so a neighbour's load on the machine falls on both alike.
			var offLat, onLat []time.Duration
			b.ResetTimer()
			for range 4 {
				offLat = append(offLat, run(off, n/4)...)
				onLat = append(onLat, run(on, n/4)...)
			}
			b.StopTimer()
			offLat, onLat = latency.Sorted(offLat), latency.Sorted(onLat)
			rawLat, _, _, _ := openLoop(n, rate, func(i int) (int, error) { return post(hc, raw.URL, "", off[0].calls[0]) })
			b.ReportMetric(ms(latency.Percentile(offLat, 50)), "off-p50-ms")
			b.ReportMetric(ms(latency.Percentile(offLat, 99)), "off-p99-ms")
			b.ReportMetric(ms(latency.Percentile(onLat, 50)), "on-p50-ms")
			b.ReportMetric(ms(latency.Percentile(onLat, 99)), "on-p99-ms")
			b.ReportMetric(ms(latency.Percentile(rawLat, 50)), "raw-p50-ms")
			b.ReportMetric(ms(latency.Percentile(rawLat, 99)), "raw-p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
