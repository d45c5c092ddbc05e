package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema/schematest"
)

// The cost of the console's credential: the same tRPC read (envs.get) with a workspace key and with the web session
// cookie (JWT check, sign-out lookup, key and workspace read), interleaved in one run. Reports each one's p50/p99
// and the web session's p50 over the key's, the limit it is measured against.
func BenchmarkTRPCWebSession(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		b.Run(driver, func(b *testing.B) {
			f := newFixture(b, driver, nil)
			_, s := signIn(b, f.h, f.key, nil)
			if s.cookie == nil {
				b.Fatal("sign-in set no cookie")
			}
			path := "/trpc/envs.get?input=" + urlJSON(map[string]any{"slug": f.retail.Slug})
			one := func(web bool) time.Duration {
				r := httptest.NewRequest(http.MethodGet, path, nil)
				if web {
					r.AddCookie(s.cookie)
				} else {
					r.Header.Set("Authorization", "Bearer "+f.key)
				}
				w := httptest.NewRecorder()
				t := time.Now()
				f.h.ServeHTTP(w, r)
				d := time.Since(t)
				if w.Code != http.StatusOK {
					b.Fatalf("web %v: %d %s", web, w.Code, w.Body)
				}
				return d
			}
			var key, web []time.Duration
			for b.Loop() {
				key = append(key, one(false))
				web = append(web, one(true))
			}
			key, web = latency.Sorted(key), latency.Sorted(web)
			kp50, wp50 := latency.Percentile(key, 50), latency.Percentile(web, 50)
			b.ReportMetric(float64(kp50.Microseconds()), "key-p50-µs")
			b.ReportMetric(float64(latency.Percentile(key, 99).Microseconds()), "key-p99-µs")
			b.ReportMetric(float64(wp50.Microseconds()), "web-p50-µs")
			b.ReportMetric(float64(latency.Percentile(web, 99).Microseconds()), "web-p99-µs")
			b.ReportMetric(float64(wp50)/float64(kp50), "web/key-p50")
		})
	}
}
