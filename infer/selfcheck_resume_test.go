package infer

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"
)

// TestSelfCheckResume interrupts a self-check after some folds (their results through JSON, as a checkpoint
// stores them) and resumes it: only the other folds run, and the report equals an uninterrupted one.
func TestSelfCheckResume(t *testing.T) {
	tr := loadTraces(t, "tau-airline-dev.json")
	opts := Options{Folds: 5}
	whole, err := SelfCheck(tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	var first []FoldResult
	if _, err := SelfCheckResume(tr, opts, Resume{OnFold: func(fr FoldResult) { first = append(first, fr) }}); err != nil {
		t.Fatal(err)
	}
	if len(first) != 5 {
		t.Fatalf("OnFold called %d times for 5 folds", len(first))
	}
	sort.Slice(first, func(i, j int) bool { return first[i].Fold < first[j].Fold })
	data, err := json.Marshal(first[:3]) // folds 0-2 were checkpointed before the interruption
	if err != nil {
		t.Fatal(err)
	}
	var done []FoldResult
	if err := json.Unmarshal(data, &done); err != nil {
		t.Fatal(err)
	}
	var again []int
	resumed, err := SelfCheckResume(tr, opts, Resume{Done: done, OnFold: func(fr FoldResult) { again = append(again, fr.Fold) }})
	if err != nil {
		t.Fatal(err)
	}
	sort.Ints(again)
	if !reflect.DeepEqual(again, []int{3, 4}) {
		t.Errorf("resumed check ran folds %v, want [3 4]", again)
	}
	if !reflect.DeepEqual(resumed, whole) {
		t.Errorf("resumed report differs: %d/%d agree vs %d/%d uninterrupted", resumed.Agree, resumed.Calls, whole.Agree, whole.Calls)
	}

	// A checkpoint of another split (other options) is ignored, not mixed in.
	other, err := SelfCheckResume(tr, Options{Folds: 4}, Resume{Done: done})
	if err != nil {
		t.Fatal(err)
	}
	if plain, _ := SelfCheck(tr, Options{Folds: 4}); !reflect.DeepEqual(other, plain) {
		t.Errorf("a 5-fold checkpoint changed a 4-fold check")
	}

	// Nor is one of the same fold count over another split: folds 0-2 of a per-trace split hold other traces.
	var perTrace []FoldResult
	if _, err := check(prepared(tr), opts, true, Resume{OnFold: func(fr FoldResult) { perTrace = append(perTrace, fr) }}, splitTrace); err != nil {
		t.Fatal(err)
	}
	sort.Slice(perTrace, func(i, j int) bool { return perTrace[i].Fold < perTrace[j].Fold })
	if perTrace[0].Split != splitTrace || first[0].Split != splitTask {
		t.Fatalf("fold results name splits %q and %q, want trace and task", perTrace[0].Split, first[0].Split)
	}
	again = nil
	mixed, err := SelfCheckResume(tr, opts, Resume{Done: perTrace[:3], OnFold: func(fr FoldResult) { again = append(again, fr.Fold) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 5 || !reflect.DeepEqual(mixed, whole) {
		t.Errorf("a per-trace checkpoint was used by a per-task check: ran %d folds, report equal %v", len(again), reflect.DeepEqual(mixed, whole))
	}
}

// TestSelfCheckSplitsByTask: trials of a task share a fold, traces naming no task are units of their own,
// and the numbering is deterministic.
func TestSelfCheckSplitsByTask(t *testing.T) {
	for id, want := range map[string]string{
		"tau-bench/gpt-4o-airline/task-12/trial-0": "task-12",
		"task-3":           "task-3",
		"a/task-/b":        "",
		"a/task-1x/b":      "",
		"a/subtask-1/b":    "",
		"run-7/trial-0":    "",
		"a/task-09/task-2": "task-09",
	} {
		if got, _ := taskKey(id); got != want {
			t.Errorf("taskKey(%q) = %q, want %q", id, got, want)
		}
	}
	ids := []string{"m1/task-1/trial-0", "m1/task-1/trial-1", "m1/task-2/trial-0", "m2/task-1/trial-0", "x", "y"}
	pts := make([]*ptrace, len(ids))
	for i, id := range ids {
		pts[i] = &ptrace{id: id}
	}
	unit, units, kind, tasks := splitUnits(pts, splitAuto)
	if kind != splitTask || tasks != 2 || units != 4 || !reflect.DeepEqual(unit, []int{0, 0, 1, 0, 2, 3}) {
		t.Errorf("by task: units %v (%d), kind %s, tasks %d; want [0 0 1 0 2 3] (4), task, 2", unit, units, kind, tasks)
	}
	unit, units, kind, _ = splitUnits(pts, splitTrace)
	if kind != splitTrace || units != 6 || !reflect.DeepEqual(unit, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("by trace: units %v (%d), kind %s", unit, units, kind)
	}
	if _, units, kind, tasks = splitUnits(pts[4:], splitAuto); kind != splitTrace || units != 2 || tasks != 0 {
		t.Errorf("no task named: %d units, kind %s, %d tasks; want 2, trace, 0", units, kind, tasks)
	}

	// Six tasks, four trials each, in id order (FoldResult.Calls indexes traces so).
	tr := loadTraces(t, "tau-airline-dev.json")[:24]
	sort.SliceStable(tr, func(i, j int) bool { return tr[i].ID < tr[j].ID })
	var frs []FoldResult
	rep, err := SelfCheckResume(tr, Options{Folds: 4}, Resume{OnFold: func(fr FoldResult) { frs = append(frs, fr) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Split != splitTask || rep.Mode != "4-fold by task" || rep.Tasks != 6 {
		t.Errorf("split %q mode %q tasks %d, want task, 4-fold by task, 6", rep.Split, rep.Mode, rep.Tasks)
	}
	foldOfTask := map[string]int{}
	for _, fr := range frs {
		for i := range fr.Calls {
			k, _ := taskKey(tr[i].ID)
			if f, ok := foldOfTask[k]; ok && f != fr.Fold {
				t.Errorf("%s straddles folds %d and %d", k, f, fr.Fold)
			}
			foldOfTask[k] = fr.Fold
		}
	}
	if len(foldOfTask) != 6 {
		t.Errorf("folds held %d tasks, want 6", len(foldOfTask))
	}
}
