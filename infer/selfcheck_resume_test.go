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
}
