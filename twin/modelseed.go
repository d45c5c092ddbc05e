package twin

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// SeedRow is one row put in a session's world by seeding.
type SeedRow struct {
	Table string          `json:"table"`
	Key   string          `json:"key"`
	Row   json.RawMessage `json:"row"`
}

// SeedTable describes one entity table to a Seeder: its name, key field and a few base-world rows.
type SeedTable struct {
	Name     string
	Key      string
	Examples []json.RawMessage
}

// SeedRequest asks a Seeder for the rows that make instructions true in a world of Tables.
type SeedRequest struct {
	Instructions string
	Seed         int64
	Clock        string
	Tables       []SeedTable
}

// Seeder turns seed instructions the built-in parser cannot read into rows (the configured model). Its rows
// come back in the session's receipts; a session rebuilt with them in SessionSpec.SeedRows gets the same world
// without asking again. note says which words could not become rows.
type Seeder interface {
	SeedRows(ctx context.Context, req SeedRequest) (rows []SeedRow, note string, err error)
}

// seedExamples is how many base-world rows per table a Seeder is shown.
const seedExamples = 3

// seedRequest describes the world to a Seeder, in table order.
func (rt *Runtime) seedRequest(instr string, seed int64, clock string) SeedRequest {
	req := SeedRequest{Instructions: instr, Seed: seed, Clock: clock}
	names := make([]string, 0, len(rt.tables))
	for n := range rt.tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := rt.tables[n]
		st := SeedTable{Name: n, Key: t.def.Key}
		for _, k := range t.keys {
			if len(st.Examples) == seedExamples {
				break
			}
			st.Examples = append(st.Examples, json.RawMessage(Render(t.rows[k], StyleCompact)))
		}
		req.Tables = append(req.Tables, st)
	}
	return req
}

// seedByModel asks the runtime's Seeder for rows; it answers the rows applied and their pinned keys, or a note.
func (s *Session) seedByModel(instr string) ([]SeedRow, map[string][]string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.rt.opts.SeedBudget)
	defer cancel()
	rows, note, err := s.rt.opts.Seeder.SeedRows(ctx, s.rt.seedRequest(instr, s.spec.Seed, s.clock))
	switch {
	case err != nil:
		return nil, nil, fmt.Sprintf("the model could not seed %q: %v", instr, err)
	case len(rows) == 0:
		if note == "" {
			note = "the model made no rows"
		}
		return nil, nil, fmt.Sprintf("could not seed %q: %s", instr, note)
	}
	pinned, err := s.applySeedRows(rows)
	if err != nil {
		s.clearOverlay()
		return nil, nil, fmt.Sprintf("the model's rows for %q do not fit the world: %v", instr, err)
	}
	return rows, pinned, ""
}

// applySeedRows puts rows in the session overlay: each names a table of the world and is a JSON object carrying
// its key (in the key field when the table keeps keys in rows).
func (s *Session) applySeedRows(rows []SeedRow) (map[string][]string, error) {
	pinned := map[string][]string{}
	for i, r := range rows {
		t := s.rt.tables[r.Table]
		if t == nil {
			return nil, fmt.Errorf("seed_rows[%d].table: no table %q", i, r.Table)
		}
		v, err := jsonvalue.Parse(r.Row)
		if err != nil {
			return nil, fmt.Errorf("seed_rows[%d].row: %w", i, err)
		}
		obj, ok := v.(*jsonvalue.Object)
		if !ok {
			return nil, fmt.Errorf("seed_rows[%d].row: not a JSON object", i)
		}
		key := strings.TrimSpace(r.Key)
		if t.def.KeyInRow {
			if kv, ok := obj.Get(t.def.Key); ok {
				if ks, ok := kv.(string); ok && (key == "" || key == ks) {
					key = ks
				} else {
					return nil, fmt.Errorf("seed_rows[%d].key: %q does not match the row's %s", i, r.Key, t.def.Key)
				}
			}
		}
		if key == "" {
			return nil, fmt.Errorf("seed_rows[%d].key: missing", i)
		}
		s.put(r.Table, key, obj)
		pinned[r.Table] = append(pinned[r.Table], key)
	}
	for t := range pinned {
		pinned[t] = dedupe(pinned[t])
	}
	return pinned, nil
}

// defaultSeedBudget bounds one Seeder request.
const defaultSeedBudget = 60 * time.Second
