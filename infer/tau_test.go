package infer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// readData reads a sample file of the repository's testdata/ (stored gzip-compressed).
func readData(t testing.TB, name string) []byte {
	t.Helper()
	return sampledata.MustRead(t, name)
}

func loadTraces(t testing.TB, name string) []trace.Trace {
	t.Helper()
	var b trace.Batch
	if err := json.Unmarshal(readData(t, name), &b); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return b.Traces
}

func loadToolDefs(t testing.TB, name string) []ToolDef {
	t.Helper()
	defs, err := ParseToolDefs(readData(t, name))
	if err != nil {
		t.Fatalf("ParseToolDefs(%s): %v", name, err)
	}
	return defs
}

func formatCheck(r *SelfCheckReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (split %s, %d traces, %d tasks): %d/%d calls agree (%.2f%%) exact, %.2f%% shape, %.2f%% error; on the %d calls the world could know: %.2f%%; unanswered %d; arguments refused %d; fidelity %v\n",
		r.Mode, r.Split, r.Traces, r.Tasks, r.Agree, r.Calls, r.AgreementPct, r.ShapeAgreePct, r.ErrorAgreePct, r.Covered, r.CoveredAgreePct, r.Unanswered, r.ArgsRefused, r.Fidelity)
	fmt.Fprintf(&b, "%-32s %-12s %-8s %-9s %6s %8s %8s %8s %8s %10s  %s\n", "tool", "binding", "rung", "kind", "calls", "exact", "shape", "error", "covered", "known/twin", "fidelity")
	for _, t := range r.Tools {
		cov := "-"
		if t.Covered > 0 {
			cov = fmt.Sprintf("%.1f%%", 100*float64(t.CoveredAgree)/float64(t.Covered))
		}
		kt := "-"
		if t.Known > 0 {
			kt = fmt.Sprintf("%d/%d", t.Known, t.KnownTwin)
		}
		fmt.Fprintf(&b, "%-32s %-12s %-8s %-9s %6d %7.2f%% %7.2f%% %7.2f%% %8s %10s  %v\n", t.Name, t.Binding, t.Rung, t.Kind, t.Calls, t.AgreementPct, t.ShapeAgreePct, t.ErrorAgreePct, cov, kt, t.Fidelity)
	}
	return b.String()
}

// formatRepro prints a self-check's reproduction fidelity, overall and per tool.
func formatRepro(r *SelfCheckReport) string {
	rp := r.Reproduction
	if rp == nil {
		return "no reproduction measured\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "reproduction (%d traces from their first write): %d/%d calls agree (%.2f%%) exact, %.2f%% shape, %.2f%% error; state-changing calls %d, %d reproduced (%.2f%%)\n",
		rp.Traces, rp.Agree, rp.Calls, rp.AgreementPct, rp.ShapeAgreePct, rp.ErrorAgreePct, rp.StateChanging, rp.StateChangingAgree, rp.StateChangingAgreePct)
	fmt.Fprintf(&b, "%-36s %-5s %6s %8s %8s %8s\n", "tool", "write", "calls", "exact", "shape", "error")
	for _, t := range rp.Tools {
		fmt.Fprintf(&b, "%-36s %-5v %6d %7.2f%% %7.2f%% %7.2f%%\n", t.Name, t.Write, t.Calls, t.AgreementPct, t.ShapeAgreePct, t.ErrorAgreePct)
	}
	return b.String()
}
