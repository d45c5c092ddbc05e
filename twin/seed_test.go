package twin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSeeding(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	spec := SessionSpec{Seed: 7, SeedInstructions: "3 accounts for user Ann with status frozen; user Cy with tier silver"}
	s, rc, err := rt.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Seeded || rc.Note != nil || len(rc.Pinned["accounts"]) != 3 || len(rc.Pinned["users"]) != 2 {
		t.Fatalf("receipts = %+v", rc)
	}
	ctx := context.Background()
	for _, k := range rc.Pinned["accounts"] {
		res, err := s.Call(ctx, "get_account", json.RawMessage(`{"id": "`+k+`"}`))
		if err != nil || res.Error || !strings.Contains(res.Content, `"status": "frozen"`) || !strings.Contains(res.Content, `"owner": "Ann"`) {
			t.Fatalf("seeded account %s = %+v, %v", k, res, err)
		}
		if !strings.HasPrefix(k, "acc_") || len(k) != 6 {
			t.Fatalf("key %q not in the table's key shape acc_99", k)
		}
	}
	ann, _ := s.Row("users", "Ann")
	for _, k := range rc.Pinned["accounts"] {
		if !strings.Contains(string(ann), k) {
			t.Fatalf("user Ann's accounts %s lack seeded %s", ann, k)
		}
	}
	if cy, ok := s.Row("users", "Cy"); !ok || !strings.Contains(string(cy), `"tier":"silver"`) {
		t.Fatalf("user Cy = %s", cy)
	}
	// Same inputs, another runtime from the re-read bundle: the same world.
	data, _ := bankBundle().Marshal()
	b2, err := UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	rt2, _ := NewRuntime(b2, RuntimeOptions{})
	_, rc2, _ := rt2.Open(spec)
	if rc2.WorldHash != rc.WorldHash || strings.Join(rc2.Pinned["accounts"], ",") != strings.Join(rc.Pinned["accounts"], ",") {
		t.Fatalf("same seed, different worlds: %s vs %s", rc.WorldHash, rc2.WorldHash)
	}
	// Another seed draws other keys.
	_, rc3, _ := rt.Open(SessionSpec{Seed: 8, SeedInstructions: spec.SeedInstructions})
	if rc3.WorldHash == rc.WorldHash {
		t.Fatal("seeds 7 and 8 made the same world")
	}
	// Words that cannot become rows: unseeded world and a note.
	_, rc4, err := rt.Open(SessionSpec{Seed: 1, SeedInstructions: "2 spaceships with warp drive"})
	if err != nil || rc4.Seeded || rc4.Note == nil || rc4.WorldHash != rt.BaseHash() {
		t.Fatalf("bad instructions: %+v, %v", rc4, err)
	}
	// "for <key>" names the one table an account refers to.
	_, rc6, err := rt.Open(SessionSpec{Seed: 2, SeedInstructions: "an account for Ann with balance 3"})
	if err != nil || !rc6.Seeded || len(rc6.Pinned["accounts"]) != 1 || rc6.Pinned["users"][0] != "Ann" {
		t.Fatalf("for <key>: %+v, %v", rc6, err)
	}
	// A scenario is named instructions.
	s5, rc5, err := rt.Open(SessionSpec{Scenario: "rich"})
	if err != nil || !rc5.Seeded || rc5.Scenario == nil || *rc5.Scenario != "rich" || rc5.SeedInstructions != "account acc_01 with balance 1000000" {
		t.Fatalf("scenario: %+v, %v", rc5, err)
	}
	if r, _ := s5.Row("accounts", "acc_01"); !strings.Contains(string(r), `"balance":1000000`) {
		t.Fatalf("scenario row = %s", r)
	}
	if _, _, err := rt.Open(SessionSpec{Scenario: "rich", SeedInstructions: "user Cy"}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("scenario with instructions: %v", err)
	}
	if _, _, err := rt.Open(SessionSpec{Scenario: "poor"}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("unknown scenario: %v", err)
	}
	if _, _, err := rt.Open(SessionSpec{Clock: "yesterday"}); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("bad clock: %v", err)
	}
}
