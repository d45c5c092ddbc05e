package infer

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// TestConditionedWrites separates the twin's write logic from the replay artefact of the self-check by task
// (issue 19): a held-out task's writes act on entities the twin made up, whose status or payment may differ from
// production's, while the replayed agent acts on production's. For each task it builds the fold from the other
// tasks plus the task's own traces reduced to their read calls (twin.KindRead and twin.KindQuery in the build from
// all traces: entity reads and searches; writes and every other call removed with their answers), so the world's
// facts about the entities the agent saw, and the rows its searches listed, match production's; then it replays
// the task's traces and scores their write calls only, printed per tool beside the plain by-task figures for the
// same calls, and again with only the reads before each trace's first write (so no read shows a write's effect).
// DOPPEL_COND_MISSES=1 lists the conditioned write misses.
func TestConditionedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two twins per task")
	}
	for _, name := range []string{"retail", "airline"} {
		t.Run(name, func(t *testing.T) { conditionedWrites(t, name) })
	}
}

// writeScore counts the scored write calls of one tool (or all) and their agreement.
type writeScore struct{ calls, exact, shape, errs int }

func (s *writeScore) add(r CheckedCall) {
	s.calls++
	if r.Agree {
		s.exact++
	}
	if r.Shape {
		s.shape++
	}
	if r.ErrAgree {
		s.errs++
	}
}

func (s writeScore) String() string {
	if s.calls == 0 {
		return "-"
	}
	return fmt.Sprintf("%4d  exact %6.2f%%  shape %6.2f%%  error %6.2f%%", s.calls, pct(s.exact, s.calls), pct(s.shape, s.calls), pct(s.errs, s.calls))
}

func conditionedWrites(t *testing.T, name string) {
	tr := loadTraces(t, "tau-"+name+"-dev.json")
	pts, w, err := prepared(tr).finish()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{}
	full, _, err := buildPrepared(pts, &opts, w, false)
	if err != nil {
		t.Fatal(err)
	}
	kind := map[string]string{}
	for _, tl := range full.Tools {
		kind[tl.Name] = tl.Kind
	}
	byID := map[string]trace.Trace{}
	for _, tt := range tr {
		byID[tt.ID] = tt
	}
	unit, units, used, _ := splitUnits(pts, splitTask)
	if used != splitTask {
		t.Fatalf("%s: split %q, want by task", name, used)
	}
	maps := learnMaps(pts)
	plain := make([][]CheckedCall, len(pts))
	cond := make([][]CheckedCall, len(pts))  // the task's reads
	early := make([][]CheckedCall, len(pts)) // its reads before its first write
	for f := 0; f < units; f++ {
		if err := checkFold(pts, &opts, f, unit, true, nil, maps, plain, nil); err != nil {
			t.Fatal(err)
		}
		for _, v := range []struct {
			beforeWrites bool
			results      [][]CheckedCall
		}{{false, cond}, {true, early}} {
			var fold []trace.Trace
			for i, pt := range pts {
				if unit[i] == f {
					fold = append(fold, readsOnly(byID[pt.id], kind, v.beforeWrites))
				} else {
					fold = append(fold, byID[pt.id])
				}
			}
			if err := checkConditioned(pts, fold, &opts, f, unit, maps, v.results); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}

	// The write calls the traces record, answered: what all three checks must have scored.
	want := map[string]int{}
	for _, pt := range pts {
		for _, c := range pt.calls {
			if c.args != nil && c.answer && kind[c.tool] == twin.KindWrite {
				want[c.tool]++
			}
		}
	}
	tally := func(results [][]CheckedCall) (map[string]*writeScore, writeScore) {
		per := map[string]*writeScore{}
		var all writeScore
		for _, rs := range results {
			for _, r := range rs {
				if !r.Scored || kind[r.Tool] != twin.KindWrite {
					continue
				}
				if per[r.Tool] == nil {
					per[r.Tool] = &writeScore{}
				}
				per[r.Tool].add(r)
				all.add(r)
			}
		}
		return per, all
	}
	pPer, pAll := tally(plain)
	cPer, cAll := tally(cond)
	ePer, eAll := tally(early)
	total := 0
	for _, n := range want {
		total += n
	}
	if total == 0 {
		t.Fatalf("%s: no write calls recorded", name)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s writes, by task (%d tasks): plain; conditioned on the task's reads; on its reads before its first write\n", name, units)
	const row = "%-32s %-7s %s\n"
	sum := 0
	for _, tool := range sortedKeys(want) {
		p, c, e := pPer[tool], cPer[tool], ePer[tool]
		if p == nil || c == nil || e == nil || p.calls != want[tool] || c.calls != want[tool] || e.calls != want[tool] {
			t.Errorf("%s %s: %d write calls recorded, scored plain %v, conditioned %v, before writes %v", name, tool, want[tool], p, c, e)
			continue
		}
		sum += c.calls
		fmt.Fprintf(&b, row+row+row, tool, "plain", p, "", "cond", c, "", "early", e)
	}
	fmt.Fprintf(&b, row+row+row, "all writes", "plain", pAll, "", "cond", cAll, "", "early", eAll)
	t.Log("\n" + b.String())
	if pAll.calls != total || cAll.calls != total || eAll.calls != total || sum != total {
		t.Errorf("%s: %d write calls recorded; scored plain %d, conditioned %d, before writes %d, per tool %d",
			name, total, pAll.calls, cAll.calls, eAll.calls, sum)
	}
	// The plain column is the self-check by task's own per-tool figures, restricted to the writes.
	sc, err := SelfCheck(tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range sc.Tools {
		if tc.Kind != twin.KindWrite {
			continue
		}
		if p := pPer[tc.Name]; p == nil || *p != (writeScore{tc.Calls, tc.Agree, tc.ShapeAgree, tc.ErrorAgree}) {
			t.Errorf("%s %s: plain write figures %v, SelfCheck's %d calls %d exact %d shape %d error", name, tc.Name, p, tc.Calls, tc.Agree, tc.ShapeAgree, tc.ErrorAgree)
		}
	}
	if os.Getenv("DOPPEL_COND_MISSES") != "" {
		t.Logf("%s conditioned write misses:\n%s", name, writeMisses(cond, kind))
		t.Logf("%s write misses conditioned on the reads before the first write:\n%s", name, writeMisses(early, kind))
	}
}

// checkConditioned builds a twin from fold (the other tasks' traces and task f's reduced ones) and replays task
// f's traces (pts i with foldOf[i] == f) against it.
func checkConditioned(pts []*ptrace, fold []trace.Trace, opts *Options, f int, foldOf []int, maps map[string]twin.MapPaths, results [][]CheckedCall) error {
	fpts, w, err := prepared(fold).finish()
	if err != nil {
		return fmt.Errorf("conditioned fold %d: %w", f, err)
	}
	b, _, err := buildPrepared(fpts, opts, w, false)
	if err != nil {
		return fmt.Errorf("conditioned fold %d: %w", f, err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
	if err != nil {
		return fmt.Errorf("conditioned fold %d: %w", f, err)
	}
	return checkFold(pts, opts, f, foldOf, false, rt, maps, results, nil)
}

// readsOnly is tt with only its read and search calls (kind says a tool's kind) and their answers — with
// beforeWrites, only those before its first write call: the other calls and their answers go, and an assistant
// message left with neither text nor calls goes with them.
func readsOnly(tt trace.Trace, kind map[string]string, beforeWrites bool) trace.Trace {
	out := trace.Trace{ID: tt.ID, Model: tt.Model}
	kept := map[string]bool{}
	wrote := false
	for _, m := range tt.Messages {
		switch m.Role {
		case trace.RoleAssistant:
			var calls []trace.ToolCall
			for _, tc := range m.ToolCalls {
				wrote = wrote || beforeWrites && kind[tc.Function.Name] == twin.KindWrite
				if k := kind[tc.Function.Name]; (k == twin.KindRead || k == twin.KindQuery) && !wrote {
					calls = append(calls, tc)
					kept[tc.ID] = true
				}
			}
			if len(calls) == 0 && m.Content == nil {
				continue
			}
			m.ToolCalls = calls
		case trace.RoleTool:
			if !kept[m.ToolCallID] {
				continue
			}
		}
		out.Messages = append(out.Messages, m)
	}
	return out
}

// writeMisses lists the scored write calls that miss shape or error agreement, as TestTaskMisses does.
func writeMisses(results [][]CheckedCall, kind map[string]string) string {
	var b strings.Builder
	for _, rs := range results {
		for _, r := range rs {
			if !r.Scored || kind[r.Tool] != twin.KindWrite || r.Shape && r.ErrAgree {
				continue
			}
			fmt.Fprintf(&b, "%s shape=%v error=%v %s #%d %s\n  args %s\n  production %.400s\n  twin       %.400s\n",
				r.Tool, r.Shape, r.ErrAgree, r.Miss.Trace, r.Miss.Call, r.Fidelity, r.Miss.Args, r.Miss.Want, r.Miss.Got)
		}
	}
	return b.String()
}
