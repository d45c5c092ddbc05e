package faults

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/draws.golden")

func plan() Spec {
	return Spec{
		"get_order_details":      {ErrorRate: 0.1, Latency: &Latency{Dist: DistExponential, MeanMs: 40}},
		"cancel_pending_order":   {ErrorRate: 0.05, TimeoutRate: 0.05, TimeoutMs: 2000},
		Any:                      {Latency: &Latency{Dist: DistLogNormal, MedianMs: 20, Sigma: 0.5}},
		"find_user_id_by_email":  {Latency: &Latency{Dist: DistUniform, MinMs: 5, MaxMs: 15}},
		"get_product_details":    {ErrorRate: 0.2, Latency: &Latency{Dist: DistNormal, MeanMs: 30, StddevMs: 10}},
		"list_all_product_types": {Latency: &Latency{Dist: DistFixed, Ms: 7}},
	}
}

var tools = []string{"get_order_details", "cancel_pending_order", "find_user_id_by_email", "get_product_details",
	"list_all_product_types", "think"}

// TestDrawsGolden: the same seed draws the same faults, call for call, in every run: the draws of three seeds over
// 60 calls are pinned in testdata/draws.golden (rewrite with -update after a deliberate change).
func TestDrawsGolden(t *testing.T) {
	sp := plan()
	var b strings.Builder
	for _, seed := range []int64{0, 42, 9007199254740991} {
		for call := int64(1); call <= 60; call++ {
			tool := tools[int(call)%len(tools)]
			f, ok := sp.Draw(seed, call, tool, 3)
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "seed=%d call=%d tool=%s kind=%s latency_ms=%d answer=%d\n", seed, call, tool, f.Kind, f.LatencyMs, f.Answer)
		}
	}
	path := filepath.Join("testdata", "draws.golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("draws differ from %s:\n%s", path, got)
	}
	// And a second pass in this process agrees with the first.
	for call := int64(1); call <= 1000; call++ {
		a, aok := sp.Draw(7, call, "get_product_details", 2)
		c, cok := sp.Draw(7, call, "get_product_details", 2)
		if a != c || aok != cok {
			t.Fatalf("call %d: %v then %v", call, a, c)
		}
	}
}

// TestRatesOver10000Calls: over 10,000 calls the error and timeout rates land within 2 points of the rates asked,
// for several seeds and rates.
func TestRatesOver10000Calls(t *testing.T) {
	for _, tc := range []struct{ errRate, timeoutRate float64 }{{0.1, 0}, {0.25, 0.05}, {0.5, 0.2}, {0.02, 0.01}} {
		for _, seed := range []int64{1, 2, 123456789} {
			sp := Spec{"t": {ErrorRate: tc.errRate, TimeoutRate: tc.timeoutRate, TimeoutMs: 1}}
			var errs, timeouts int
			answers := map[int]int{}
			const n = 10_000
			for call := int64(1); call <= n; call++ {
				f, ok := sp.Draw(seed, call, "t", 4)
				switch {
				case !ok:
				case f.Kind == KindError:
					errs++
					answers[f.Answer]++
				case f.Kind == KindTimeout:
					timeouts++
				}
			}
			gotErr, gotTO := float64(errs)/n, float64(timeouts)/n
			t.Logf("seed %d: asked error %.2f timeout %.2f → %.4f %.4f", seed, tc.errRate, tc.timeoutRate, gotErr, gotTO)
			if math.Abs(gotErr-tc.errRate) > 0.02 || math.Abs(gotTO-tc.timeoutRate) > 0.02 {
				t.Errorf("seed %d: error rate %.4f (asked %.2f), timeout rate %.4f (asked %.2f)", seed, gotErr, tc.errRate, gotTO, tc.timeoutRate)
			}
			if len(answers) != 4 {
				t.Errorf("seed %d: error answers used %v, want all 4", seed, answers)
			}
		}
	}
}

func TestLatencyDistributions(t *testing.T) {
	for _, tc := range []struct {
		l        Latency
		wantMean float64
	}{
		{Latency{Dist: DistFixed, Ms: 7}, 7},
		{Latency{Dist: DistUniform, MinMs: 10, MaxMs: 30}, 20},
		{Latency{Dist: DistNormal, MeanMs: 50, StddevMs: 5}, 50},
		{Latency{Dist: DistExponential, MeanMs: 40}, 40},
		{Latency{Dist: DistLogNormal, MedianMs: 20, Sigma: 0.5}, 20 * math.Exp(0.125)},
	} {
		sp := Spec{Any: {Latency: &tc.l}}
		var sum float64
		const n = 20_000
		for call := int64(1); call <= n; call++ {
			f, ok := sp.Draw(99, call, "x", 0)
			if !ok || f.Kind != KindLatency {
				t.Fatalf("%s: call %d drew %v %v", tc.l.Dist, call, f, ok)
			}
			sum += float64(f.LatencyMs)
		}
		if mean := sum / n; math.Abs(mean-tc.wantMean) > 0.05*tc.wantMean+0.5 {
			t.Errorf("%s: mean %.2f ms, want about %.2f", tc.l.Dist, mean, tc.wantMean)
		}
	}
}

func TestValidate(t *testing.T) {
	errs := map[string]int{"get_order_details": 2, "think": 0}
	for _, tc := range []struct {
		sp    string
		field string
	}{
		{`{"get_order_details":{"error_rate":1.5}}`, "get_order_details.error_rate"},
		{`{"get_order_details":{"error_rate":0.6,"timeout_rate":0.6}}`, "get_order_details.error_rate"},
		{`{"think":{"error_rate":0.1}}`, "think.error_rate"},
		{`{"nope":{"error_rate":0.1}}`, "nope"},
		{`{"*":{"latency":{"dist":"pareto"}}}`, "*.latency.dist"},
		{`{"*":{"latency":{"dist":"uniform","min_ms":5,"max_ms":1}}}`, "*.latency.max_ms"},
		{`{"*":{"timeout_ms":-1}}`, "*.timeout_ms"},
		{`{"*":{"error_rate":0.3},"get_order_details":{"timeout_rate":0.1}}`, ""},
	} {
		var sp Spec
		if err := json.Unmarshal([]byte(tc.sp), &sp); err != nil {
			t.Fatal(err)
		}
		err := sp.Validate(errs)
		var fe *FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.sp, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%s: got %v, want a problem at %s", tc.sp, err, tc.field)
		}
	}
}
