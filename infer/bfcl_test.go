package infer

import "testing"

// TestSelfCheckBFCL is the self-check by task on the BFCL multi-turn dev sample, built with its tool
// definitions: 134 tasks, each from its own starting world, seen through its two traces only.
func TestSelfCheckBFCL(t *testing.T) {
	if testing.Short() {
		t.Skip("leave-one-task-out builds 134 twins")
	}
	tr := loadTraces(t, "bfcl-multi-turn-dev.json")
	defs := loadToolDefs(t, "bfcl-multi-turn-tools.json")
	sc, err := SelfCheck(tr, Options{Tools: defs})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(sc))
	t.Log("\n" + formatRepro(sc))
	if sc.Split != splitTask || sc.Tasks != 134 {
		t.Errorf("bfcl self-check: split %q over %d tasks, want by task over 134", sc.Split, sc.Tasks)
	}
	t.Logf("bfcl by task: exact %.2f%% shape %.2f%% error %.2f%%", sc.AgreementPct, sc.ShapeAgreePct, sc.ErrorAgreePct)
	// Floors under today's figures (issue 36: 56.07 % by task, 58.72 % reproduction; the goals, 60 % and 90 %, are
	// not met: see docs/reproduction.md), so what was learned is not lost unnoticed.
	if sc.AgreementPct < 55.5 {
		t.Errorf("bfcl by task: %.2f%% exact, floor 55.5%%", sc.AgreementPct)
	}
	if rp := sc.Reproduction; rp == nil || rp.AgreementPct < 58 {
		t.Errorf("bfcl reproduction: %+v, floor 58%% exact", rp)
	}
}
