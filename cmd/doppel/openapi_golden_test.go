package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/doppel-dev/doppel/api"
)

var updateOpenAPI = flag.Bool("update-openapi", false, "rewrite testdata/openapi-3.1.golden.json and openapi-3.0.golden.json")

// TestOpenAPIGoldens: the OpenAPI 3.1 document `doppel openapi` prints and the 3.0 one served at /openapi-3.0.json
// are the committed goldens, byte for byte. A change that moves code changes neither; one that changes the API
// rewrites them with -update-openapi, in the commit that changes it.
func TestOpenAPIGoldens(t *testing.T) {
	var out bytes.Buffer
	if err := runOpenAPI(context.Background(), env{stdout: &out, stderr: io.Discard}); err != nil {
		t.Fatal(err)
	}
	opts, err := apiOptions(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	h, _ := api.New(opts)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/openapi-3.0.json", nil))
	if w.Code != 200 {
		t.Fatalf("/openapi-3.0.json: %d %s", w.Code, w.Body)
	}
	for _, g := range []struct {
		file string
		got  []byte
	}{
		{"testdata/openapi-3.1.golden.json", out.Bytes()},
		{"testdata/openapi-3.0.golden.json", w.Body.Bytes()},
	} {
		if *updateOpenAPI {
			if err := os.MkdirAll("testdata", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(g.file, g.got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(g.file)
		if err != nil {
			t.Fatalf("%v (run go test ./cmd/doppel -run TestOpenAPIGoldens -update-openapi)", err)
		}
		if !bytes.Equal(g.got, want) {
			t.Errorf("the document differs from %s (run with -update-openapi if the change is meant)", g.file)
		}
	}
}
