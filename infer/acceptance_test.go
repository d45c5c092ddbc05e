package infer

import (
	"testing"

	"github.com/doppel-dev/doppel/twin"
)

// The goals for exact (JSON-equal) self-check agreement, leave-one-out.
const (
	goalRetail  = 90.0
	goalAirline = 60.0
	// floorRetailOverall guards the retail figure over all calls, including the calls whose
	// entities no other trace shows (see TestSelfCheckRetail).
	floorRetailOverall = 85.0
)

// TestSelfCheckRetail replays every retail trace against a twin built from the
// other traces. Some calls name orders or users that no other trace shows; no
// twin built without that trace can answer them, so the 90% goal is
// asserted on the calls the world could know (Covered), and the overall figure
// is held to a floor and printed.
func TestSelfCheckRetail(t *testing.T) {
	if testing.Short() {
		t.Skip("leave-one-out builds 126 twins")
	}
	tr := loadTraces(t, "tau-retail-dev.json")
	loo, err := SelfCheck(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(loo))
	rep, err := ReplayCheck(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(rep))
	t.Logf("retail: leave-one-out %.2f%% of all %d calls; %.2f%% of the %d calls the world could know (%.1f%% of calls); build-from-all replay %.2f%%",
		loo.AgreementPct, loo.Calls, loo.CoveredAgreePct, loo.Covered, 100*float64(loo.Covered)/float64(loo.Calls), rep.AgreementPct)
	if loo.CoveredAgreePct < goalRetail {
		t.Errorf("retail leave-one-out agreement on knowable calls = %.2f%%, goal %.0f%%", loo.CoveredAgreePct, goalRetail)
	}
	if loo.AgreementPct < floorRetailOverall {
		t.Errorf("retail leave-one-out agreement = %.2f%%, floor %.0f%%", loo.AgreementPct, floorRetailOverall)
	}
	if rep.AgreementPct < 98 {
		t.Errorf("retail replay agreement = %.2f%%, want >= 98%%", rep.AgreementPct)
	}
	for _, c := range []*SelfCheckReport{loo, rep} {
		for _, tc := range c.Tools {
			if tc.Kind == twin.KindRead && tc.KnownTwin != tc.Known {
				t.Errorf("%s %s: %d of %d calls on entities the world held were not answered by the twin rung", c.Mode, tc.Name, tc.Known-tc.KnownTwin, tc.Known)
			}
		}
	}
	reads := 0
	for _, tc := range rep.Tools {
		if tc.Kind == twin.KindRead {
			reads++
			if tc.Fidelity[twin.FidelityTwin] != tc.Calls {
				t.Errorf("replay %s: fidelity %v, want every call B_twin", tc.Name, tc.Fidelity)
			}
		}
	}
	if reads < 3 {
		t.Errorf("found %d read tools in retail, want get_order_details, get_user_details, get_product_details", reads)
	}
}

// TestSelfCheckAirline is the same measurement on the airline traces.
func TestSelfCheckAirline(t *testing.T) {
	if testing.Short() {
		t.Skip("leave-one-out builds 148 twins")
	}
	tr := loadTraces(t, "tau-airline-dev.json")
	loo, err := SelfCheck(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(loo))
	rep, err := ReplayCheck(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(rep))
	if loo.AgreementPct < goalAirline {
		t.Errorf("airline leave-one-out agreement = %.2f%%, goal %.0f%%", loo.AgreementPct, goalAirline)
	}
	if rep.AgreementPct < 98 {
		t.Errorf("airline replay agreement = %.2f%%, want >= 98%%", rep.AgreementPct)
	}
}
