package infer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/trace"
)

// dataDir holds the real tau-bench traces (see /work/shared/data/README.md).
func dataDir() string {
	if d := os.Getenv("DOPPEL_TEST_DATA"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "shared", "data")
}

func loadTraces(t testing.TB, name string) []trace.Trace {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dataDir(), name))
	if err != nil {
		t.Skipf("tau data not available: %v", err)
	}
	var b trace.Batch
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return b.Traces
}

func loadToolDefs(t testing.TB, name string) []ToolDef {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dataDir(), name))
	if err != nil {
		t.Skipf("tau data not available: %v", err)
	}
	defs, err := ParseToolDefs(raw)
	if err != nil {
		t.Fatalf("ParseToolDefs(%s): %v", name, err)
	}
	return defs
}

func formatCheck(r *SelfCheckReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d/%d calls agree (%.2f%%), unanswered %d, fidelity %v\n", r.Mode, r.Agree, r.Calls, r.AgreementPct, r.Unanswered, r.Fidelity)
	fmt.Fprintf(&b, "%-32s %-12s %-8s %-9s %6s %6s %8s  %s\n", "tool", "binding", "rung", "kind", "calls", "agree", "pct", "fidelity")
	for _, t := range r.Tools {
		fmt.Fprintf(&b, "%-32s %-12s %-8s %-9s %6d %6d %7.2f%%  %v\n", t.Name, t.Binding, t.Rung, t.Kind, t.Calls, t.Agree, t.AgreementPct, t.Fidelity)
	}
	return b.String()
}
