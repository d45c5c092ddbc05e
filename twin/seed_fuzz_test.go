package twin

import (
	"reflect"
	"testing"
)

// FuzzSeed feeds the deterministic seed parser any instructions (issue 13): Open never panics; the same seed and
// instructions give the same world and pinned keys twice; an unseeded open (words that cannot become rows) is
// the base world with a note and nothing pinned; every pinned key is a row of the session.
func FuzzSeed(f *testing.F) {
	rt := newBank(f, RuntimeOptions{})
	for _, tc := range []struct {
		seed  int64
		instr string
	}{
		{7, "3 accounts for user Ann with status frozen; user Cy with tier silver"},
		{1, "2 spaceships with warp drive"},
		{1, "account acc_01 with balance 1000000"},
		{2, "an account with owner \"Bob Smith\" and balance 12.5"},
		{3, "ten accounts for user Zed"},
		{4, "1000 accounts"},
		{4, "1001 accounts"},
		{4, "-1 accounts"},
		{5, "users"},
		{5, "user"},
		{5, "account with"},
		{5, "account with status"},
		{5, "'unterminated account"},
		{6, "user Ann with tier gold. 2 accounts for user Ann\n1 account"},
		{0, ";;; . ;"},
		{-9, "2 accounts with history [1,2]"},
		{8, "a user with name Ann"},
	} {
		f.Add(tc.seed, tc.instr)
	}
	f.Fuzz(func(t *testing.T, seed int64, instr string) {
		spec := SessionSpec{Seed: seed, SeedInstructions: instr}
		s1, rc1, err1 := rt.Open(spec)
		s2, rc2, err2 := rt.Open(spec)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("open errors differ: %v then %v", err1, err2)
		}
		if err1 != nil {
			return
		}
		defer s1.Close()
		defer s2.Close()
		if rc1.WorldHash != rc2.WorldHash || rc1.Seeded != rc2.Seeded || !reflect.DeepEqual(rc1.Pinned, rc2.Pinned) {
			t.Fatalf("same seed and instructions, different worlds:\n%+v\n%+v", rc1, rc2)
		}
		if !rc1.Seeded {
			if rc1.WorldHash != rt.BaseHash() || len(rc1.Pinned) != 0 {
				t.Fatalf("unseeded open is not the base world: %+v", rc1)
			}
			return
		}
		if rc1.Note != nil {
			t.Fatalf("seeded with a note: %+v", rc1)
		}
		for table, keys := range rc1.Pinned {
			for _, k := range keys {
				if _, ok := s1.Row(table, k); !ok {
					t.Fatalf("pinned %s %q is not a row", table, k)
				}
			}
		}
	})
}
