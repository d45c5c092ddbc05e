package api_test

import (
	"net/http"
	"testing"
)

// TestDatabaseDownIs503: with the database gone, an authenticated route answers 503 unavailable (retryable),
// never a 500, on every driver.
func TestDatabaseDownIs503(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newBuildFixture(t, driver)
		if w := f.do(http.MethodGet, "/v1/envs", f.key, nil, ""); w.Code != http.StatusOK {
			t.Fatalf("before: %d %s", w.Code, w.Body)
		}
		if err := f.db.Close(); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/v1/envs", "/v1/envs/" + f.env.Slug, "/v1/envs/" + f.env.Slug + "/builds"} {
			envelope(t, f.do(http.MethodGet, path, f.key, nil, ""), http.StatusServiceUnavailable, "unavailable")
		}
	})
}
