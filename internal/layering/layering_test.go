// Package layering holds the test of the project's import rules.
package layering

import (
	"go/build"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/doppel-dev/doppel/"

// TestImportRules checks the layering the design asks for, on the packages' non-test files: transports do not
// reach into activities, workflows do not reach into drivers or the database, and the leaf packages stay leaves.
func TestImportRules(t *testing.T) {
	root := filepath.Join("..", "..") // tests run in their package's directory
	rules := []struct {
		pkg       string
		forbidden []string
	}{
		{"api", []string{"activities", "workflows", "driver", "worker", "journal"}},
		{"workflows", []string{"driver", "api", "toolplane", "store", "journal"}}, // orchestration: its I/O is in activities
		{"activities", []string{"api", "toolplane", "workflows"}},
		{"toolplane", []string{"api", "driver", "worker"}},
		{"agent", []string{"api", "activities", "workflows", "toolplane", "store", "schema", "driver", "worker", "journal", "llm"}},
		{"jsonvalue", nil}, // imports nothing of doppel
		{"faults", nil},    // fault draws are pure: a seed and a call index in, a fault out
		{"twinstate", nil},
		{"events", nil},    // event types and payloads: recorded by store, activities, toolplane; shown by api
		{"webhook", nil},   // signing, the SSRF guard and the sender: no database, no Temporal
		{"telemetry", nil}, // metrics and tracing: every layer may be handed it, so it imports none
		// OTLP decoding is pure: bodies in, spans out
		{"otlp", []string{"api", "activities", "workflows", "toolplane", "store", "schema", "driver", "worker", "journal", "blob"}},
		// build inputs are read and written by the API and by activities alike
		{"envinputs", []string{"api", "activities", "workflows", "toolplane", "driver", "worker", "journal"}},
		// metering reads the durable records and decides; it serves the layers above it
		{"usage", []string{"api", "toolplane", "workflows", "activities", "driver", "worker", "journal", "twin"}},
	}
	for _, r := range rules {
		p, err := build.ImportDir(filepath.Join(root, r.pkg), 0)
		if err != nil {
			t.Fatalf("%s: %v", r.pkg, err)
		}
		for _, imp := range p.Imports {
			rel, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if r.forbidden == nil || slices.Contains(r.forbidden, rel) {
				t.Errorf("%s imports %s", r.pkg, rel)
			}
		}
	}
}
