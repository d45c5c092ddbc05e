package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema/schematest"
)

// BenchmarkGroupFork: one sessions.fork with n (16 by default, and 1 beside it) of a tau-retail session that made
// a call, over loopback HTTP, one after another; p50/p99 of the whole call (16 sessions each), sessions/s, and a
// bare loopback round trip beside as the floor of the same run. The forks are left open (as a GRPO group is).
func BenchmarkGroupFork(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, tr := range transports {
			for _, n := range []int{16, 1} {
				b.Run(fmt.Sprintf("%s/%s/n=%d", driver, tr.name, n), func(b *testing.B) {
					p, srv, targets := loadPlane(b, driver, tr.local)
					hc := loadClient()
					raw := rawServer(b)
					// The parent has made one call of its recorded conversation.
					parent := targets[0]
					if code, err := post(hc, parent.url, parent.token, parent.body()); err != nil || code != http.StatusOK {
						b.Fatalf("parent call: %d %v", code, err)
					}
					url := srv.URL + "/v1/sessions/" + sessionOf(parent.url) + "/fork"
					body, _ := json.Marshal(map[string]any{"n": n})
					rounds := max(b.N, 100)
					lat := make([]time.Duration, 0, rounds)
					b.ResetTimer()
					began := time.Now()
					for range rounds {
						t0 := time.Now()
						code, err := post(hc, url, p.key, body)
						if err != nil || code != http.StatusCreated {
							b.Fatalf("group fork: %d %v", code, err)
						}
						lat = append(lat, time.Since(t0))
					}
					elapsed := time.Since(began)
					b.StopTimer()
					rawLat := make([]time.Duration, 0, rounds)
					for range rounds {
						t0 := time.Now()
						_, _ = post(hc, raw.URL, "", []byte(`{}`))
						rawLat = append(rawLat, time.Since(t0))
					}
					sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
					sort.Slice(rawLat, func(i, j int) bool { return rawLat[i] < rawLat[j] })
					b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
					b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
					b.ReportMetric(float64(rounds*n)/elapsed.Seconds(), "sessions/s")
					b.ReportMetric(ms(latency.Percentile(rawLat, 50)), "raw-p50-ms")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// sessionOf is the session id in a call URL (…/v1/sessions/<id>/call).
func sessionOf(callURL string) string {
	var id string
	for i := len(callURL) - len("/call") - 1; i >= 0; i-- {
		if callURL[i] == '/' {
			id = callURL[i+1 : len(callURL)-len("/call")]
			break
		}
	}
	return id
}
