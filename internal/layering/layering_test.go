// Package layering holds the test of the project's import rules.
package layering

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/doppel-dev/doppel/"

// root is the module's directory (tests run in their package's directory).
var root = filepath.Join("..", "..")

// TestImportRules checks the layering the design asks for, on the packages' non-test files: transports do not
// reach into activities, workflows do not reach into drivers or the database, and the leaf packages stay leaves.
func TestImportRules(t *testing.T) {
	rules := []struct {
		pkg       string
		forbidden []string
	}{
		{"api", []string{"activities", "workflows", "workflows/wfclient", "query/flow", "driver", "worker", "journal"}},
		// orchestration: its I/O is in activities, its callers' side in workflows/wfclient
		{"workflows", []string{"driver", "api", "toolplane", "store", "journal", "workflows/wfclient", "query", "query/flow"}},
		{"query/flow", []string{"api", "driver", "worker", "journal", "workflows/wfclient"}},
		{"activities", []string{"api", "toolplane", "workflows", "workflows/wfclient", "query", "query/flow"}},
		{"toolplane", []string{"api", "driver", "worker", "activities", "workflows", "workflows/wfclient", "query", "query/flow"}},
		// the control plane's services: transports call them; they reach the database, never a transport or Temporal
		{"control", []string{"api", "driver", "worker", "activities", "workflows", "workflows/wfclient", "query", "query/flow", "journal"}},
		{"query", []string{"api", "activities", "workflows", "workflows/wfclient", "query/flow", "driver", "worker", "journal", "llm"}},
		{"jsonvalue", nil}, // imports nothing of doppel
		{"faults", nil},    // fault draws are pure: a seed and a call index in, a fault out
		{"twinstate", nil},
		{"events", nil},    // event types and payloads: recorded by store, activities, toolplane; shown by api
		{"webhook", nil},   // signing, the SSRF guard and the sender: no database, no Temporal
		{"telemetry", nil}, // metrics and tracing: every layer may be handed it, so it imports none
		// trace files are read alike by the CLI and the API: an io.Reader in, traces out
		{"ingest/tracefile", nil},
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

// TestNoTemporalClientInWorkflows: workflow code does not hold a Temporal client; starting workflows and sending
// them signals, updates and queries from outside is workflows/wfclient's.
func TestNoTemporalClientInWorkflows(t *testing.T) {
	for _, pkg := range []string{"workflows", "query/flow"} {
		p, err := build.ImportDir(filepath.Join(root, pkg), 0)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		for _, imp := range p.Imports {
			if imp == "go.temporal.io/sdk/client" || imp == "go.temporal.io/api/serviceerror" {
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
}

// TestNoGoroutinesInWorkflowPackages: the packages that hold workflow code start no goroutine (a workflow's
// concurrency is workflow.Go; background work that is not a workflow's belongs to its callers, e.g.
// workflows/wfclient's webhook dispatchers).
func TestNoGoroutinesInWorkflowPackages(t *testing.T) {
	for _, pkg := range []string{"workflows", "query/flow"} {
		p, err := build.ImportDir(filepath.Join(root, pkg), 0)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		fset := token.NewFileSet()
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					t.Errorf("%s: a go statement in a workflow package", fset.Position(g.Pos()))
				}
				return true
			})
		}
	}
}

// TestNoTemporalBelowTheTransports: the tool plane, the query service and the API reach Temporal only through
// interfaces they declare (filled by workflows/wfclient in cmd/doppel): no Temporal package, and none of doppel's
// workflows or activities, is among everything they import, directly or not (`go list -deps`).
func TestNoTemporalBelowTheTransports(t *testing.T) {
	for _, pkg := range []string{"toolplane", "query", "api"} {
		cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./"+pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, module+pkg) {
			t.Fatalf("go list -deps ./%s did not list the package itself: %q", pkg, deps)
		}
		for _, d := range deps {
			switch {
			case strings.HasPrefix(d, "go.temporal.io/"),
				slices.Contains([]string{"activities", "workflows", "workflows/wfclient", "query/flow", "worker"}, strings.TrimPrefix(d, module)):
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
}

// TestToolPlaneWithoutTemporal: the tool plane reaches Temporal only through the interfaces it declares
// (SessionOpener and the like), which the server wires to workflows/wfclient; it imports no Temporal package.
func TestToolPlaneWithoutTemporal(t *testing.T) {
	p, err := build.ImportDir(filepath.Join(root, "toolplane"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range p.Imports {
		if strings.HasPrefix(imp, "go.temporal.io/") {
			t.Errorf("toolplane imports %s", imp)
		}
	}
}
