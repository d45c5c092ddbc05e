package api_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// Issue #13: a 413 says the real cap (huma's limit counts the byte that trips it), and a 415 names the content type
// it got and the ones the route takes.
func TestTooLargeAndUnsupportedSayWhy(t *testing.T) {
	t.Run("413 collect", func(t *testing.T) {
		fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{MaxRequestBytes: 1000}, nil)
		r := fx.post(t, []byte(`{"project": "p", "traces": [], "pad": "`+strings.Repeat("x", 2000)+`"}`))
		r.want(t, http.StatusRequestEntityTooLarge)
		if d, _ := r.body["detail"].(string); !strings.Contains(d, "1000 bytes") || strings.Contains(d, "1001") {
			t.Errorf("detail %q, want the cap of 1000 bytes", d)
		}
	})
	t.Run("413 default cap", func(t *testing.T) {
		f := newFixture(t, schema.DriverSQLite, nil)
		w := f.api.Do("POST", "/test/seed", bearer(f.key), "Content-Type: application/json",
			strings.NewReader(`{"seed": 1, "seed_instructions": "`+strings.Repeat("x", 400)+`"}`))
		m := envelope(t, w, http.StatusRequestEntityTooLarge, api.CodeTooLarge)
		if d, _ := m["detail"].(string); !strings.Contains(d, "255 bytes") || strings.Contains(d, "256") {
			t.Errorf("detail %q, want the cap of 255 bytes", d) // MaxBodyBytes 256: 256 bytes are refused
		}
	})
	t.Run("415", func(t *testing.T) {
		f := newFixture(t, schema.DriverSQLite, nil)
		w := f.api.Do("POST", "/v1/keys", bearer(f.key), "Content-Type: text/plain", bytes.NewReader([]byte(`name=x`)))
		m := envelope(t, w, http.StatusUnsupportedMediaType, api.CodeInvalid)
		d, _ := m["detail"].(string)
		for _, want := range []string{`"text/plain"`, "application/json"} {
			if !strings.Contains(d, want) {
				t.Errorf("detail %q does not name %s", d, want)
			}
		}
	})
}
