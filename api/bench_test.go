package api_test

import (
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/schema/schematest"
)

// An authenticated environment read through the whole stack: request id, auth (key lookup),
// the store read, JSON encoding. Reports p50/p99 latency and requests per second.
func BenchmarkGetEnv(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		b.Run(driver, func(b *testing.B) {
			f := newFixture(b, driver, nil)
			var lat []time.Duration
			for b.Loop() {
				r := httptest.NewRequest("GET", "/v1/envs/retail", nil)
				r.Header.Set("Authorization", "Bearer "+f.key)
				w := httptest.NewRecorder()
				t := time.Now()
				f.h.ServeHTTP(w, r)
				lat = append(lat, time.Since(t))
				if w.Code != 200 {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			slices.Sort(lat)
			var total time.Duration
			for _, d := range lat {
				total += d
			}
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), "p99-µs")
			b.ReportMetric(float64(len(lat))/total.Seconds(), "req/s")
		})
	}
}
