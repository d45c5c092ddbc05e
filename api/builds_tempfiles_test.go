package api_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/schema"
)

// Issue #13: parts over the in-memory threshold (8 KiB) are spooled to temp files while the form is read; every
// answer of the build route, success included, leaves none behind.
func TestBuildFormLeavesNoTempFiles(t *testing.T) {
	tools, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) <= 8<<10 {
		t.Fatalf("the tools file (%d bytes) no longer spills to disk", len(tools))
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	f := newBuildFixture(t, schema.DriverSQLite)
	big := strings.Repeat("# a comment\n", 1000) // over 8 KiB too
	tests := []struct {
		name   string
		slug   string
		parts  []part
		status int
	}{
		{"accepted", f.env.Slug, []part{{"tools", "tools.json", string(tools)}, {"code", "get_order_details.star", big + "def handle(args, world):\n    return {}\n"}}, http.StatusAccepted},
		{"bad tools", f.env.Slug, []part{{"tools", "tools.json", string(tools) + "]"}}, http.StatusUnprocessableEntity},
		{"bad code", f.env.Slug, []part{{"code", "get_order_details.star", big + "def handle(:\n"}}, http.StatusUnprocessableEntity},
		{"no such environment", "nope", []part{{"tools", "tools.json", string(tools)}}, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, ct := multipartBody(t, tt.parts...)
			w := f.do(http.MethodPost, "/v1/envs/"+tt.slug+"/builds", f.key, body, ct)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			entries, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("left behind: %s", e.Name())
			}
		})
	}
}
