package twin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// referenceHash computes the world hash of hash.go's tree from the world's rows alone, with none of the base
// digests or per-session state the incremental hash keeps.
func referenceHash(rt *Runtime, world map[string]map[string]*jsonvalue.Object) string {
	h := sha256.New()
	h.Write([]byte(worldHashDomain))
	for _, name := range rt.tableNames {
		nb := bucketCount(len(rt.tables[name].keys))
		members := make([][]string, nb)
		keys := make([]string, 0, len(world[name]))
		for k := range world[name] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			members[bucketOf(k, nb)] = append(members[bucketOf(k, nb)], string(jsonvalue.Canonical(k))+":"+string(jsonvalue.Canonical(world[name][k])))
		}
		th := sha256.New()
		for _, ms := range members {
			d := sha256.Sum256([]byte(joinComma(ms)))
			th.Write(d[:])
		}
		var nameJSON bytes.Buffer
		jsonvalue.AppendString(&nameJSON, name)
		h.Write(nameJSON.Bytes())
		h.Write([]byte{':'})
		h.Write(th.Sum(nil))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func joinComma(ms []string) string {
	var b bytes.Buffer
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m)
	}
	return b.String()
}

// TestIncrementalHash changes a session's world at random (replace, insert, delete, restore) and checks after each
// change that the incremental hash equals the hash computed afresh from the visible rows.
func TestIncrementalHash(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	world := map[string]map[string]*jsonvalue.Object{}
	for _, name := range rt.tableNames {
		world[name] = map[string]*jsonvalue.Object{}
		for k, r := range rt.tables[name].rows {
			world[name][k] = r
		}
	}
	if got, want := rt.BaseHash(), referenceHash(rt, world); got != want {
		t.Fatalf("base hash %s, reference %s", got, want)
	}
	s := open(t, rt, SessionSpec{})
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{s.currentHash(): true}
	for i := range 2000 {
		name := rt.tableNames[rng.IntN(len(rt.tableNames))]
		bt := rt.tables[name]
		var key string
		switch op := rng.IntN(4); {
		case op == 0 && len(bt.keys) > 0: // restore or replace a base row
			key = bt.keys[rng.IntN(len(bt.keys))]
		default:
			key = fmt.Sprintf("k%03d", rng.IntN(300))
		}
		if rng.IntN(5) == 0 {
			s.put(name, key, nil)
			delete(world[name], key)
		} else {
			row := jsonvalue.NewObject(1)
			row.Set("n", jsonvalue.Number(fmt.Sprint(rng.IntN(1000))))
			if base, ok := bt.rows[key]; ok && rng.IntN(2) == 0 {
				row = base // back to the base row: the hash must forget the change
			}
			s.put(name, key, row)
			world[name][key] = row
		}
		if rng.IntN(3) > 0 { // let changes pile up between hashes too
			continue
		}
		got, want := s.currentHash(), referenceHash(rt, world)
		if got != want {
			t.Fatalf("after change %d (%s/%s): incremental %s, reference %s", i, name, key, got, want)
		}
		seen[got] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct hashes over the changes: the hash does not follow the world", len(seen))
	}
}
