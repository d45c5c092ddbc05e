package twin

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// SessionSpec fixes a session's world.
type SessionSpec struct {
	Seed             int64  `json:"seed"`
	SeedInstructions string `json:"seed_instructions,omitempty"`
	// Scenario names seed instructions from the bundle's config; it is used instead of SeedInstructions.
	Scenario string `json:"scenario,omitempty"`
	// Clock is RFC 3339; empty means the bundle's default clock.
	Clock string `json:"clock,omitempty"`
	// SeedRows, when set, are the rows a Seeder made for this session's instructions (from its receipts): they are
	// applied as they are, so a rebuilt session gets its world without asking the Seeder again.
	SeedRows []SeedRow `json:"seed_rows,omitempty"`
	// World overrides the bundle's world policy for this session: WorldOpen or WorldClosed ("" keeps the bundle's).
	World string `json:"world,omitempty"`
	// Trace opens the session on the world a recorded conversation saw (fromtrace.go); it is used instead of seed
	// instructions or a scenario, never with them.
	Trace *TraceSpec `json:"trace,omitempty"`
}

// Receipts tell how a session's world was made (spec §2.3).
type Receipts struct {
	Seeded           bool                `json:"seeded"`
	Seed             int64               `json:"seed"`
	Scenario         *string             `json:"scenario"`
	WorldHash        string              `json:"world_hash"`
	Note             *string             `json:"note"`
	Pinned           map[string][]string `json:"pinned"`
	SeedInstructions string              `json:"seed_instructions"`
	Clock            string              `json:"clock"`
	// SeedRows are the rows the Seeder made (only when it seeded): give them back in SessionSpec.SeedRows to
	// rebuild the same world.
	SeedRows []SeedRow `json:"seed_rows,omitempty"`
	// World is the session's world policy (open or closed): its own, else the bundle's.
	World string `json:"world,omitempty"`
	// Trace names the trace the world was opened from (nil: none), and TraceCalls are the calls used: give them
	// back in SessionSpec.Trace to rebuild the same world.
	Trace      *TraceReceipt `json:"trace,omitempty"`
	TraceCalls []TraceCall   `json:"trace_calls,omitempty"`
}

// Session is one isolated world: a copy-on-write overlay over the base world.
// Calls on one session are serialized; sessions are independent.
type Session struct {
	rt    *Runtime
	spec  SessionSpec
	world string // WorldOpen or WorldClosed
	clock string
	mu    sync.Mutex
	over  map[string]map[string]*jsonvalue.Object // table → key → row; nil row = deleted
	// opening is the overlay as the open left it (the seed rows): the world a diff compares with by default.
	opening overlay
	hashes  map[string]*tableHash // per changed table: what the next hash must redo (hash.go)
	hash    string
	dirty   bool // hash is stale
	closed  bool
	// traceID names the trace the session opened from, and traceAt the call of that trace whose recording answered
	// last (-1: none yet): the next call its recordings hold answers as production did (fromtrace.go).
	traceID string
	traceAt int
}

// Open makes a session: the base world plus the rows its seed instructions (or scenario) make.
func (rt *Runtime) Open(spec SessionSpec) (*Session, Receipts, error) {
	clock, err := normalizeClock(spec.Clock, rt.clock)
	if err != nil {
		return nil, Receipts{}, err
	}
	if err := checkWorld(spec.World); err != nil {
		return nil, Receipts{}, fmt.Errorf("%w: world: %w", ErrBadSpec, err)
	}
	s := &Session{rt: rt, spec: spec, world: worldOf(spec.World, rt.b.World), clock: clock, over: map[string]map[string]*jsonvalue.Object{},
		traceAt: -1}
	rc := Receipts{Seed: spec.Seed, Pinned: map[string][]string{}, Clock: clock, World: s.world}
	instr := spec.SeedInstructions
	if spec.Scenario != "" && strings.TrimSpace(spec.SeedInstructions) != "" {
		return nil, Receipts{}, fmt.Errorf("%w: scenario: a scenario is used instead of seed instructions, not with them", ErrBadSpec)
	}
	if spec.Scenario != "" {
		sc, ok := rt.b.Scenarios[spec.Scenario]
		if !ok {
			return nil, Receipts{}, fmt.Errorf("%w: scenario: no scenario %q in this build", ErrBadSpec, spec.Scenario)
		}
		name := spec.Scenario
		rc.Scenario = &name
		instr = sc
	}
	rc.SeedInstructions = instr
	if spec.Trace != nil && (strings.TrimSpace(instr) != "" || len(spec.SeedRows) > 0) {
		return nil, Receipts{}, fmt.Errorf("%w: trace: a trace is used instead of seed instructions or a scenario, not with them", ErrBadSpec)
	}
	switch {
	case spec.Trace != nil:
		rc.Trace, rc.TraceCalls = s.openFromTrace(spec.Trace)
		s.traceID = spec.Trace.ID
	case len(spec.SeedRows) > 0:
		pinned, err := s.applySeedRows(spec.SeedRows)
		if err != nil {
			return nil, Receipts{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
		}
		rc.Seeded, rc.Pinned, rc.SeedRows = true, pinned, spec.SeedRows
	case strings.TrimSpace(instr) != "":
		pinned, note := s.seed(instr)
		var rows []SeedRow
		if note != "" && rt.opts.Seeder != nil {
			s.clearOverlay()
			rows, pinned, note = s.seedByModel(instr)
		}
		if note != "" {
			rc.Note = &note
			s.clearOverlay()
		} else {
			rc.Seeded, rc.Pinned, rc.SeedRows = true, pinned, rows
		}
	}
	s.hash = rt.baseHash
	rc.WorldHash = s.currentHash()
	s.opening = overlay(s.over).clone()
	return s, rc, nil
}

func normalizeClock(c, def string) (string, error) {
	if c == "" {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339Nano, c)
	if err != nil {
		return "", fmt.Errorf("%w: clock: not an RFC 3339 time: %q", ErrBadSpec, c)
	}
	return t.UTC().Format(time.RFC3339Nano), nil
}

// StateHash is the hash of the session's current world.
func (s *Session) StateHash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.currentHash()
}

// clearOverlay drops every row the session holds beyond the base world.
func (s *Session) clearOverlay() {
	s.over = map[string]map[string]*jsonvalue.Object{}
	s.hashes = nil
	s.dirty = true
}

// PutRow stores a row in the session as if a call had written it (builds use it to
// put a recorded state in place before checking a handler against it).
func (s *Session) PutRow(table, key string, row *jsonvalue.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rt.tables[table] == nil {
		return
	}
	s.put(table, key, row)
}

// Spec answers the spec the session was opened with.
func (s *Session) Spec() SessionSpec { return s.spec }

// Close drops the session's world; later calls fail with ErrClosed.
func (s *Session) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.over = nil
	s.hashes = nil
}

// OverlayRows counts the rows the session holds beyond the base world.
func (s *Session) OverlayRows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.over {
		n += len(t)
	}
	return n
}

func (s *Session) row(table, key string) (*jsonvalue.Object, bool) {
	if t, ok := s.over[table]; ok {
		if r, ok := t[key]; ok {
			return r, r != nil
		}
	}
	bt := s.rt.tables[table]
	if bt == nil {
		return nil, false
	}
	r, ok := bt.rows[key]
	return r, ok
}

// Row answers a copy of the row (table, key) as the session sees it, as JSON.
func (s *Session) Row(table, key string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.row(table, key)
	if !ok {
		return nil, false
	}
	return json.RawMessage(Render(r, StyleCompact)), true
}

func (s *Session) find(table string, cs []criterion, e *callEnv) []string {
	bt := s.rt.tables[table]
	if bt == nil || len(cs) == 0 {
		return nil
	}
	// Candidates from the base index of the first criterion.
	c0 := cs[0]
	s.rt.idxMu.Lock()
	idx := bt.addIndex(c0.path, c0.fold)
	s.rt.idxMu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, k := range idx[indexValue(c0.value, c0.fold)] {
		if _, over := s.over[table][k]; over {
			continue
		}
		if e != nil && (e.dels[tableKey{table, k}] || e.txn[tableKey{table, k}] != nil) {
			continue
		}
		if matches(bt.def, k, bt.rows[k], cs) {
			out = append(out, k)
			seen[k] = true
		}
	}
	check := func(k string, r *jsonvalue.Object) {
		if r == nil || seen[k] {
			return
		}
		if e != nil && e.dels[tableKey{table, k}] {
			return
		}
		if matches(bt.def, k, r, cs) {
			out = append(out, k)
			seen[k] = true
		}
	}
	for k, r := range s.over[table] {
		if e != nil && e.txn[tableKey{table, k}] != nil {
			continue
		}
		check(k, r)
	}
	if e != nil {
		for _, tk := range e.order {
			if tk.table == table {
				check(tk.key, e.txn[tk])
			}
		}
		for _, tk := range e.matOrder {
			if tk.table == table && e.txn[tk] == nil {
				check(tk.key, e.mat[tk])
			}
		}
	}
	sort.Strings(out)
	return out
}

func (s *Session) keys(table string, e *callEnv) []string {
	bt := s.rt.tables[table]
	if bt == nil {
		return nil
	}
	set := map[string]bool{}
	for _, k := range bt.keys {
		set[k] = true
	}
	for k, r := range s.over[table] {
		set[k] = r != nil
	}
	if e != nil {
		for _, tk := range e.order {
			if tk.table == table {
				set[tk.key] = !e.dels[tk]
			}
		}
	}
	out := make([]string, 0, len(set))
	for k, ok := range set {
		if ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (s *Session) sub(table, name string, v any, e *callEnv) *jsonvalue.Object {
	bt := s.rt.tables[table]
	if bt == nil {
		return nil
	}
	sd, ok := bt.subDefs[name]
	if !ok {
		return nil
	}
	cv := jsonvalue.CanonicalText(v)
	look := func(r *jsonvalue.Object) *jsonvalue.Object {
		for _, o := range subObjects(r, sd.Path) {
			if f, ok := o.Get(sd.Field); ok && jsonvalue.CanonicalText(f) == cv {
				return o
			}
		}
		return nil
	}
	// This call's writes and the session's rows shadow the base.
	if e != nil {
		for _, tk := range e.order {
			if tk.table == table && e.txn[tk] != nil {
				if o := look(e.txn[tk]); o != nil {
					return o
				}
			}
		}
	}
	okeys := make([]string, 0, len(s.over[table]))
	for k := range s.over[table] {
		okeys = append(okeys, k)
	}
	sort.Strings(okeys)
	for _, k := range okeys {
		if r := s.over[table][k]; r != nil {
			if o := look(r); o != nil {
				return o
			}
		}
	}
	hit, ok := bt.subs[name][cv]
	if !ok {
		return nil
	}
	if _, over := s.over[table][hit.key]; over {
		return nil
	}
	if e != nil && (e.dels[tableKey{table, hit.key}] || e.txn[tableKey{table, hit.key}] != nil) {
		return nil
	}
	return hit.obj
}

// put stores a row in the session overlay.
func (s *Session) put(table, key string, row *jsonvalue.Object) {
	t := s.over[table]
	if t == nil {
		t = map[string]*jsonvalue.Object{}
		s.over[table] = t
	}
	_, had := t[key]
	t[key] = row
	s.touch(table, key, !had)
}
