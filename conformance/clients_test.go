package conformance

import (
	"net/http"
	"testing"
)

// TestClients: each generated client runs envs → tools → open → call → read → transcript → close against a real
// doppel, every response validated against the document the client was generated from.
func TestClients(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts doppel")
	}
	d := startDoppel(t)
	setup := newChecked(t, "setup (3.1)", readDocument(t, documents[0].file))
	slug := d.buildShop(t, &http.Client{Transport: setup})
	total := setup.report(t)
	for _, c := range []struct {
		name, doc string
		run       func(*testing.T, *doppel, string, *http.Client)
	}{
		{"ogen 3.1", documents[0].file, flowOgen31},
		{"ogen 3.0", documents[1].file, flowOgen30},
		{"oapi-codegen 3.0", documents[1].file, flowOapi30},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := newChecked(t, c.name, readDocument(t, c.doc))
			c.run(t, d, slug, &http.Client{Transport: v})
			total += v.report(t)
		})
	}
	t.Logf("%d responses validated in all", total)
}
