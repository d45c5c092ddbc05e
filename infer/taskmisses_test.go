package infer

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestTaskMisses lists every call of a dev sample whose answer misses shape or error agreement in the
// self-check by task (DOPPEL_TASK_MISSES=retail or airline; -v prints them: tool, trace and call, fidelity,
// arguments, production's answer and the twin's), and checks the list against SelfCheck's own figures.
// DOPPEL_MISSES_SPLIT=trace lists the misses of the self-check per trace instead (not checked against SelfCheck).
func TestTaskMisses(t *testing.T) {
	name := os.Getenv("DOPPEL_TASK_MISSES")
	if name == "" {
		t.Skip("set DOPPEL_TASK_MISSES=retail or airline")
	}
	tr := loadTraces(t, "tau-"+name+"-dev.json")
	pts, _, err := prepared(tr).finish()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{}
	split := splitTask
	if os.Getenv("DOPPEL_MISSES_SPLIT") == splitTrace {
		split = splitTrace
	}
	unit, units, _, _ := splitUnits(pts, split)
	maps := learnMaps(pts)
	results := make([][]CheckedCall, len(pts))
	for f := 0; f < units; f++ {
		if err := checkFold(pts, &opts, f, unit, true, nil, maps, results, nil); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	calls, shape, errs := 0, 0, 0
	for _, rs := range results {
		for _, r := range rs {
			if !r.Scored {
				continue
			}
			calls++
			if r.Shape && r.ErrAgree {
				continue
			}
			if !r.Shape {
				shape++
			}
			if !r.ErrAgree {
				errs++
			}
			fmt.Fprintf(&b, "%s shape=%v error=%v %s #%d %s\n  args %s\n  production %.400s\n  twin       %.400s\n",
				r.Tool, r.Shape, r.ErrAgree, r.Miss.Trace, r.Miss.Call, r.Fidelity, r.Miss.Args, r.Miss.Want, r.Miss.Got)
		}
	}
	t.Logf("%s by %s: %d calls, %d shape misses, %d error misses\n%s", name, split, calls, shape, errs, b.String())
	if split != splitTask {
		return
	}
	sc, err := SelfCheck(tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Calls != calls || sc.Calls-sc.ShapeAgree != shape || sc.Calls-sc.ErrorAgree != errs {
		t.Errorf("listed %d calls, %d shape and %d error misses; SelfCheck scored %d calls, %d and %d",
			calls, shape, errs, sc.Calls, sc.Calls-sc.ShapeAgree, sc.Calls-sc.ErrorAgree)
	}
}
