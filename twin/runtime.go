package twin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.starlark.net/starlark"
)

// Errors a caller can tell apart with errors.Is.
var (
	// ErrUnknownTool: the twin cannot route the tool (spec: 404 naming the tool).
	ErrUnknownTool = errors.New("unknown tool")
	// ErrBadArguments: the arguments are not a JSON object.
	ErrBadArguments = errors.New("arguments must be a JSON object")
	// ErrNoAnswer: no rung could answer (no handler, no recording, no simulator).
	ErrNoAnswer = errors.New("no rung could answer")
	// ErrDiverged: a rebuilt session's state differs from its journal's.
	ErrDiverged = errors.New("rebuilt session diverged from its journal")
	// ErrBadSpec: a session spec field is invalid.
	ErrBadSpec = errors.New("bad session spec")
	// ErrClosed: the session was closed.
	ErrClosed = errors.New("session closed")
)

// DefaultClock is the world time of a session that fixes none.
const DefaultClock = "2024-01-01T00:00:00Z"

// Simulator answers a call from a model when no other rung can. The twin never
// lets its answer change the world. The model-backed implementation lives elsewhere.
type Simulator interface {
	Simulate(ctx context.Context, req SimRequest) (string, error)
}

// SimRequest is what a simulator is told about a call.
type SimRequest struct {
	Tool         string          `json:"tool"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Examples are recorded calls of the tool, nearest first.
	Examples []SimExample `json:"examples"`
	// Rows are the world rows the arguments name.
	Rows []json.RawMessage `json:"rows"`
	Args json.RawMessage   `json:"args"`
}

// SimExample is one recorded call.
type SimExample struct {
	Args   json.RawMessage `json:"args"`
	Answer string          `json:"answer"`
}

// RuntimeOptions tune a Runtime.
type RuntimeOptions struct {
	// MaxSteps bounds a handler's Starlark execution steps per call (default 1,000,000).
	MaxSteps uint64
	// CallBudget bounds a handler's time per call (default 2s).
	CallBudget time.Duration
	// Simulator answers what nothing else can; nil stops the ladder at infer.
	Simulator Simulator
	// Seeder turns instructions the built-in parser cannot read into rows; nil leaves them unseeded with a note.
	Seeder Seeder
	// SeedBudget bounds one Seeder request (default 60s).
	SeedBudget time.Duration
	// SimCacheSize bounds the simulate cache (default 10,000 answers).
	SimCacheSize int
}

// Runtime hosts sessions over one bundle: the base world, compiled handlers and
// the recordings index, all immutable and shared.
type Runtime struct {
	b          *Bundle
	opts       RuntimeOptions
	style      Style
	clock      string
	tools      map[string]*rtTool
	toolNames  []string
	tables     map[string]*baseTable
	tableNames []string
	baseHash   string

	simMu    sync.Mutex
	simCache map[string]string
	simOrder []string

	idxMu sync.Mutex // guards lazily added base indexes
}

type rtTool struct {
	def      *Tool
	start    int
	provided starlark.Callable
	synth    starlark.Callable
	byArgs   map[string][]*rec
	all      []*rec
}

type rec struct {
	args   any
	flat   map[string]string
	answer string
	isErr  bool
	state  string
}

// NewRuntime loads a bundle: parses the base world, builds its indexes and
// compiles every handler once.
func NewRuntime(b *Bundle, opts RuntimeOptions) (*Runtime, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil bundle", ErrBadBundle)
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxSteps == 0 {
		opts.MaxSteps = 1_000_000
	}
	if opts.CallBudget <= 0 {
		opts.CallBudget = 2 * time.Second
	}
	if opts.SeedBudget <= 0 {
		opts.SeedBudget = defaultSeedBudget
	}
	if opts.SimCacheSize <= 0 {
		opts.SimCacheSize = 10_000
	}
	rt := &Runtime{b: b, opts: opts, style: b.Style, clock: b.Clock, tools: map[string]*rtTool{}, tables: map[string]*baseTable{}, simCache: map[string]string{}}
	if rt.style.ItemSep == "" && rt.style.KeySep == "" {
		rt.style = StylePython
	}
	if rt.clock == "" {
		rt.clock = DefaultClock
	}
	for i := range b.Tables {
		t, err := newBaseTable(&b.Tables[i])
		if err != nil {
			return nil, err
		}
		rt.tables[t.def.Name] = t
		rt.tableNames = append(rt.tableNames, t.def.Name)
	}
	sort.Strings(rt.tableNames)
	pre := predeclared()
	pre.Freeze()
	for i := range b.Tools {
		def := &b.Tools[i]
		t := &rtTool{def: def, start: rungIndex(def.Rung), byArgs: map[string][]*rec{}}
		var err error
		if def.Provided != "" {
			if t.provided, err = compileHandler(def.Name, "provided", def.Provided, pre); err != nil {
				return nil, fmt.Errorf("%w: tools[%s].provided: %w", ErrBadBundle, def.Name, err)
			}
		}
		if def.Source != "" {
			if t.synth, err = compileHandler(def.Name, "synthesized", def.Source, pre); err != nil {
				return nil, fmt.Errorf("%w: tools[%s].source: %w", ErrBadBundle, def.Name, err)
			}
		}
		rt.tools[def.Name] = t
		rt.toolNames = append(rt.toolNames, def.Name)
	}
	sort.Strings(rt.toolNames)
	for i := range b.Recordings {
		r := &b.Recordings[i]
		t := rt.tools[r.Tool]
		args, err := ParseJSONString(r.Args)
		if err != nil {
			return nil, fmt.Errorf("%w: recordings[%d].args: %w", ErrBadBundle, i, err)
		}
		x := &rec{args: args, flat: flatten(args), answer: b.Answers[r.Answer], isErr: r.Error, state: r.State}
		t.byArgs[r.Args] = append(t.byArgs[r.Args], x)
		t.all = append(t.all, x)
	}
	rt.baseHash = rt.baseWorldHash()
	return rt, nil
}

// compileHandler runs a handler file once and answers its entry function: the one named
// after the tool, else "handle".
func compileHandler(tool, kind, src string, pre starlark.StringDict) (starlark.Callable, error) {
	th := &starlark.Thread{Name: "compile " + tool}
	th.SetMaxExecutionSteps(1_000_000)
	globals, err := starlark.ExecFileOptions(fileOptions, th, tool+"."+kind+".star", src, pre)
	if err != nil {
		return nil, err
	}
	globals.Freeze()
	for _, name := range []string{tool, "handle"} {
		if fn, ok := globals[name].(starlark.Callable); ok {
			return fn, nil
		}
	}
	return nil, fmt.Errorf("defines neither %s(args) nor handle(args)", tool)
}

// Bundle answers the bundle the runtime runs.
func (rt *Runtime) Bundle() *Bundle { return rt.b }

// BaseHash is the world hash of the unseeded base world.
func (rt *Runtime) BaseHash() string { return rt.baseHash }

// Tools lists the tool names, sorted.
func (rt *Runtime) Tools() []string { return append([]string(nil), rt.toolNames...) }

func (rt *Runtime) hasTable(name string) bool { _, ok := rt.tables[name]; return ok }

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
}

// Session is one isolated world: a copy-on-write overlay over the base world.
// Calls on one session are serialized; sessions are independent.
type Session struct {
	rt     *Runtime
	spec   SessionSpec
	clock  string
	mu     sync.Mutex
	over   map[string]map[string]*Object // table → key → row; nil row = deleted
	hashes map[string]*tableHash         // per changed table: what the next hash must redo (hash.go)
	hash   string
	dirty  bool // hash is stale
	closed bool
}

// Result is one answer (spec §2.5).
type Result struct {
	Content    string `json:"content"`
	Error      bool   `json:"error"`
	Fidelity   string `json:"fidelity"`
	Rung       string `json:"rung"`
	Downgraded bool   `json:"downgraded"`
	StateHash  string `json:"state_hash"`
	// Changed reports whether the call changed the world.
	Changed bool `json:"changed"`
	// Note says why higher rungs did not answer, when they did not.
	Note string `json:"note,omitempty"`
}

// Open makes a session: the base world plus the rows its seed instructions (or scenario) make.
func (rt *Runtime) Open(spec SessionSpec) (*Session, Receipts, error) {
	clock, err := normalizeClock(spec.Clock, rt.clock)
	if err != nil {
		return nil, Receipts{}, err
	}
	s := &Session{rt: rt, spec: spec, clock: clock, over: map[string]map[string]*Object{}}
	rc := Receipts{Seed: spec.Seed, Pinned: map[string][]string{}, Clock: clock}
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
	switch {
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
	s.over = map[string]map[string]*Object{}
	s.hashes = nil
	s.dirty = true
}

// PutRow stores a row in the session as if a call had written it (builds use it to
// put a recorded state in place before checking a handler against it).
func (s *Session) PutRow(table, key string, row *Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rt.tables[table] == nil {
		return
	}
	s.put(table, key, row)
}

// Try runs a single rung for a call without falling to the next; answered is false
// when the rung declined or failed (note says why). A twin or provided answer that
// changes the world is kept, as a call's would be.
func (s *Session) Try(ctx context.Context, tool string, args *Object, rung string) (content string, isErr, answered bool, note string) {
	t := s.rt.tools[tool]
	if t == nil {
		return "", false, false, "unknown tool"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var a *answer
	switch rung {
	case RungProvided:
		if t.provided == nil {
			return "", false, false, "no provided code"
		}
		a, note = s.runHandler(ctx, t, t.provided, args)
	case RungTwin:
		if t.synth == nil {
			return "", false, false, "no handler"
		}
		a, note = s.runHandler(ctx, t, t.synth, args)
	case RungReplay:
		a, note = s.replay(t, args)
	case RungInfer:
		a, note = s.infer(t, args)
	default:
		return "", false, false, "rung " + rung + " cannot be tried alone"
	}
	if a == nil {
		return "", false, false, note
	}
	s.commit(t, args, a)
	return a.content, a.isErr, true, ""
}

// CheckHandler compiles handler source for a tool and reports what is wrong with it.
func CheckHandler(tool, src string) error {
	pre := predeclared()
	pre.Freeze()
	_, err := compileHandler(tool, "provided", src, pre)
	return err
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

func (s *Session) row(table, key string) (*Object, bool) {
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
	check := func(k string, r *Object) {
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

func (s *Session) sub(table, name string, v any, e *callEnv) *Object {
	bt := s.rt.tables[table]
	if bt == nil {
		return nil
	}
	sd, ok := bt.subDefs[name]
	if !ok {
		return nil
	}
	cv := string(Canonical(v))
	look := func(r *Object) *Object {
		for _, o := range subObjects(r, sd.Path) {
			if f, ok := o.Get(sd.Field); ok && string(Canonical(f)) == cv {
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
func (s *Session) put(table, key string, row *Object) {
	t := s.over[table]
	if t == nil {
		t = map[string]*Object{}
		s.over[table] = t
	}
	_, had := t[key]
	t[key] = row
	s.touch(table, key, !had)
}

// Call answers one tool call from the highest rung that can, starting at the
// tool's bound rung. A tool's own error is a Result with Error set, not a Go error.
func (s *Session) Call(ctx context.Context, tool string, args json.RawMessage) (Result, error) {
	t := s.rt.tools[tool]
	if t == nil {
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownTool, tool)
	}
	av, err := ParseJSON(args)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadArguments, err)
	}
	ao, ok := av.(*Object)
	if !ok {
		return Result{}, fmt.Errorf("%w: got %s", ErrBadArguments, jsonKind(av))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Result{}, ErrClosed
	}
	return s.call(ctx, t, ao, nil)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case Number:
		return "a number"
	case []any:
		return "an array"
	}
	return "an object"
}

// answer is what one rung produced.
type answer struct {
	content  string
	isErr    bool
	env      *callEnv
	apply    *Object // a replayed write's row to store, under applyKey
	applyKey string
}

func (s *Session) call(ctx context.Context, t *rtTool, args *Object, journaled *string) (Result, error) {
	var notes []string
	start := t.start
	if t.def.PreferRecorded && start <= rungIndex(RungTwin) {
		if a := s.replaySameState(t, args); a != nil {
			res := Result{Content: a.content, Error: a.isErr, Rung: RungReplay, Fidelity: FidelityReplayed,
				Note: "a recording from this very state answered before the imperfect handler"}
			res.Changed = s.commit(t, args, a)
			res.StateHash = s.currentHash()
			return res, nil
		}
	}
	for r := start; r < len(Rungs()); r++ {
		rung := Rungs()[r]
		var a *answer
		var why string
		switch rung {
		case RungProvided:
			if t.provided == nil {
				continue
			}
			a, why = s.runHandler(ctx, t, t.provided, args)
		case RungTwin:
			if t.synth == nil {
				continue
			}
			a, why = s.runHandler(ctx, t, t.synth, args)
		case RungReplay:
			a, why = s.replay(t, args)
		case RungInfer:
			a, why = s.infer(t, args)
		case RungSimulate:
			if journaled != nil {
				a = &answer{content: *journaled, isErr: isErrorText(*journaled)}
				break
			}
			if s.rt.opts.Simulator == nil {
				why = "no simulator configured"
				break
			}
			a, why = s.simulate(ctx, t, args)
		}
		if a == nil {
			if why != "" {
				notes = append(notes, rung+": "+why)
			}
			continue
		}
		res := Result{Content: a.content, Error: a.isErr, Rung: rung, Fidelity: FidelityOf(rung), Downgraded: r > start}
		if rung == RungSimulate && t.def.Kind == KindWrite {
			// A model never changes the world: a write it answered is always marked.
			res.Downgraded = true
			notes = append(notes, "simulate: a write answered by the model does not change the world")
		}
		if len(notes) > 0 {
			res.Note = strings.Join(notes, "; ")
		}
		res.Changed = s.commit(t, args, a)
		res.StateHash = s.currentHash()
		return res, nil
	}
	return Result{}, fmt.Errorf("%w: tool %q (%s)", ErrNoAnswer, t.def.Name, strings.Join(notes, "; "))
}

// commit stores what an answer changed; it reports whether anything did.
func (s *Session) commit(t *rtTool, args *Object, a *answer) bool {
	changed := false
	if a.env != nil && len(a.env.order) > 0 && !a.isErr {
		for _, tk := range a.env.order {
			if a.env.dels[tk] {
				s.put(tk.table, tk.key, nil)
			} else {
				s.put(tk.table, tk.key, a.env.txn[tk])
			}
		}
		changed = true
	}
	if a.apply != nil && t.def.Table != "" && a.applyKey != "" {
		s.put(t.def.Table, a.applyKey, a.apply)
		changed = true
	}
	return changed
}

func keyArg(def *Tool, args *Object) (string, bool) {
	if def.KeyArg == "" {
		return "", false
	}
	v, ok := args.Get(def.KeyArg)
	if !ok {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, true
	case Number:
		return string(x), true
	}
	return "", false
}

// isErrorText tells a tool's own error answer by its text, as recordings spell them.
func isErrorText(s string) bool {
	t := strings.TrimSpace(s)
	if len(t) < 5 {
		return false
	}
	head := strings.ToLower(t[:5])
	return head == "error"
}

// IsErrorText reports whether an answer text reads as the tool's own error.
func IsErrorText(s string) bool { return isErrorText(s) }

func (s *Session) runHandler(ctx context.Context, t *rtTool, fn starlark.Callable, args *Object) (*answer, string) {
	env := &callEnv{sess: s}
	th := &starlark.Thread{Name: t.def.Name}
	th.SetLocal(envKey, env)
	th.SetMaxExecutionSteps(s.rt.opts.MaxSteps)
	timer := time.AfterFunc(s.rt.opts.CallBudget, func() { th.Cancel("time budget exceeded") })
	stop := context.AfterFunc(ctx, func() { th.Cancel("context done") })
	v, err := starlark.Call(th, fn, starlark.Tuple{toStar(args)}, nil)
	timer.Stop()
	stop()
	if err != nil {
		return nil, "handler failed: " + firstLine(err.Error())
	}
	switch x := v.(type) {
	case *declined:
		return nil, "declined: " + x.reason
	case *errorAnswer:
		return &answer{content: x.text, isErr: true}, ""
	}
	val, err := fromStar(v, s.rt.style)
	if err != nil {
		return nil, "handler answer: " + err.Error()
	}
	return &answer{content: s.rt.renderAnswer(t.def, val), env: env}, ""
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func (rt *Runtime) renderAnswer(def *Tool, v any) string {
	if s, ok := v.(string); ok && !def.StringsAsJSON {
		return s
	}
	return Render(v, rt.style)
}

// targetState fingerprints the tool's target row as the session holds it now.
func (s *Session) targetState(t *rtTool, args *Object) string {
	if t.def.Table == "" {
		return ""
	}
	k, ok := keyArg(t.def, args)
	if !ok {
		return ""
	}
	r, ok := s.row(t.def.Table, k)
	if !ok {
		return fingerprint(nil)
	}
	return fingerprint(r)
}

// replaySameState answers the recording made with these arguments from this very target state, if any.
func (s *Session) replaySameState(t *rtTool, args *Object) *answer {
	state := s.targetState(t, args)
	if state == "" {
		return nil
	}
	for _, r := range t.byArgs[string(Canonical(args))] {
		if r.state == state {
			a := &answer{content: r.answer, isErr: r.isErr}
			if t.def.Kind == KindWrite && !r.isErr {
				a.applyKey, a.apply = s.rt.rowFromAnswer(t, args, r.answer)
			}
			return a
		}
	}
	return nil
}

func (s *Session) replay(t *rtTool, args *Object) (*answer, string) {
	recs := t.byArgs[string(Canonical(args))]
	if len(recs) == 0 {
		return nil, "no recording with these arguments"
	}
	if a := s.replaySameState(t, args); a != nil {
		return a, ""
	}
	// No recording from this state: the most common recorded answer, which changes nothing,
	// unless the write creates rows (it has no target whose state could differ).
	best, n := recs[0], 0
	count := map[string]int{}
	for _, r := range recs {
		count[r.answer]++
		if count[r.answer] > n {
			best, n = r, count[r.answer]
		}
	}
	a := &answer{content: best.answer, isErr: best.isErr}
	if t.def.Kind == KindWrite && t.def.KeyArg == "" && t.def.Table != "" && !best.isErr {
		a.applyKey, a.apply = s.rt.rowFromAnswer(t, args, best.answer)
	}
	return a, ""
}

// rowFromAnswer answers the row (and its key) a write's recorded answer holds, when it is
// the target row, or for a write that creates rows (no key argument) any row of its table.
func (rt *Runtime) rowFromAnswer(t *rtTool, args *Object, text string) (string, *Object) {
	bt := rt.tables[t.def.Table]
	if bt == nil || !LooksJSON(text) {
		return "", nil
	}
	v, err := ParseJSONString(text)
	if err != nil {
		return "", nil
	}
	o, ok := v.(*Object)
	if !ok {
		return "", nil
	}
	var rowKey string
	if bt.def.KeyInRow {
		kv, ok := o.Get(bt.def.Key)
		if !ok {
			return "", nil
		}
		rowKey = TextOf(kv, rt.style)
	}
	if t.def.KeyArg == "" {
		if !bt.def.KeyInRow || rowKey == "" {
			return "", nil
		}
		return rowKey, o
	}
	k, ok := keyArg(t.def, args)
	if !ok || (bt.def.KeyInRow && rowKey != k) {
		return "", nil
	}
	return k, o
}

func (s *Session) infer(t *rtTool, args *Object) (*answer, string) {
	if len(t.all) == 0 {
		return nil, "no recordings of this tool"
	}
	flat := flatten(args)
	var best *rec
	bestD := -1
	for _, r := range t.all {
		d := distance(flat, r.flat)
		if bestD < 0 || d < bestD || (d == bestD && !r.isErr && best.isErr) {
			best, bestD = r, d
		}
	}
	content := substitute(best.answer, best.flat, flat, s.rt.style)
	return &answer{content: content, isErr: best.isErr || isErrorText(content)}, ""
}

// flatten maps each leaf path of a JSON value to its canonical text.
func flatten(v any) map[string]string {
	out := map[string]string{}
	var walk func(p string, v any)
	walk = func(p string, v any) {
		switch x := v.(type) {
		case *Object:
			for i, k := range x.Keys {
				walk(p+"/"+k, x.Vals[i])
			}
			if x.Len() == 0 {
				out[p] = "{}"
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s/%d", p, i), e)
			}
			if len(x) == 0 {
				out[p] = "[]"
			}
		default:
			out[p] = string(Canonical(v))
		}
	}
	walk("", v)
	return out
}

func distance(a, b map[string]string) int {
	d := 0
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			d++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d++
		}
	}
	return d
}

// substitute puts the new call's values where the recorded call's values appear in its answer.
func substitute(answer string, old, cur map[string]string, st Style) string {
	type pair struct{ from, to any }
	var pairs []pair
	paths := make([]string, 0, len(old))
	for p := range old {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		nv, ok := cur[p]
		if !ok || nv == old[p] {
			continue
		}
		ov, err1 := ParseJSONString(old[p])
		nw, err2 := ParseJSONString(nv)
		if err1 != nil || err2 != nil {
			continue
		}
		pairs = append(pairs, pair{ov, nw})
	}
	if len(pairs) == 0 {
		return answer
	}
	if LooksJSON(answer) {
		if v, err := ParseJSONString(answer); err == nil {
			var walk func(v any) any
			walk = func(v any) any {
				switch x := v.(type) {
				case *Object:
					c := &Object{Keys: x.Keys, Vals: make([]any, len(x.Vals))}
					for i, e := range x.Vals {
						c.Vals[i] = walk(e)
					}
					return c
				case []any:
					c := make([]any, len(x))
					for i, e := range x {
						c[i] = walk(e)
					}
					return c
				}
				for _, p := range pairs {
					if Identical(v, p.from) {
						return p.to
					}
				}
				return v
			}
			return Render(walk(v), st)
		}
	}
	for _, p := range pairs {
		from, to := TextOf(p.from, st), TextOf(p.to, st)
		if len(from) < 2 {
			continue
		}
		answer = strings.ReplaceAll(answer, from, to)
	}
	return answer
}

func (s *Session) simulate(ctx context.Context, t *rtTool, args *Object) (*answer, string) {
	ck := s.currentHash() + "\x00" + t.def.Name + "\x00" + string(Canonical(args))
	s.rt.simMu.Lock()
	cached, ok := s.rt.simCache[ck]
	s.rt.simMu.Unlock()
	if ok {
		return &answer{content: cached, isErr: isErrorText(cached)}, ""
	}
	req := SimRequest{Tool: t.def.Name, Description: t.def.Description, InputSchema: t.def.InputSchema,
		OutputSchema: t.def.OutputSchema, Args: json.RawMessage(Render(args, StyleCompact))}
	flat := flatten(args)
	exs := append([]*rec(nil), t.all...)
	sort.SliceStable(exs, func(i, j int) bool { return distance(flat, exs[i].flat) < distance(flat, exs[j].flat) })
	if len(exs) > 5 {
		exs = exs[:5]
	}
	for _, r := range exs {
		req.Examples = append(req.Examples, SimExample{Args: json.RawMessage(Render(r.args, StyleCompact)), Answer: r.answer})
	}
	for _, tk := range s.rowsNamed(args) {
		if r, ok := s.row(tk.table, tk.key); ok {
			req.Rows = append(req.Rows, json.RawMessage(Render(r, StyleCompact)))
		}
	}
	text, err := s.rt.opts.Simulator.Simulate(ctx, req)
	if err != nil {
		return nil, "simulator: " + err.Error()
	}
	if why := validateAgainst(t.def.OutputSchema, text); why != "" && !isErrorText(text) {
		return nil, "simulated answer rejected: " + why
	}
	s.rt.simMu.Lock()
	if _, ok := s.rt.simCache[ck]; !ok {
		s.rt.simCache[ck] = text
		s.rt.simOrder = append(s.rt.simOrder, ck)
		for len(s.rt.simOrder) > s.rt.opts.SimCacheSize {
			delete(s.rt.simCache, s.rt.simOrder[0])
			s.rt.simOrder = s.rt.simOrder[1:]
		}
	}
	s.rt.simMu.Unlock()
	return &answer{content: text, isErr: isErrorText(text)}, ""
}

// rowsNamed answers the rows whose keys appear among the argument values.
func (s *Session) rowsNamed(args *Object) []tableKey {
	var out []tableKey
	seen := map[tableKey]bool{}
	for _, v := range flatten(args) {
		sv, err := ParseJSONString(v)
		if err != nil {
			continue
		}
		str, ok := sv.(string)
		if !ok {
			continue
		}
		for _, name := range s.rt.tableNames {
			tk := tableKey{name, str}
			if _, ok := s.row(name, str); ok && !seen[tk] {
				seen[tk] = true
				out = append(out, tk)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].table != out[j].table {
			return out[i].table < out[j].table
		}
		return out[i].key < out[j].key
	})
	return out
}

// validateAgainst checks an answer's JSON type against a schema's top-level "type".
func validateAgainst(schema json.RawMessage, text string) string {
	if len(schema) == 0 {
		return ""
	}
	var s struct {
		Type any `json:"type"`
	}
	if json.Unmarshal(schema, &s) != nil || s.Type == nil {
		return ""
	}
	want := map[string]bool{}
	switch x := s.Type.(type) {
	case string:
		want[x] = true
	case []any:
		for _, e := range x {
			if str, ok := e.(string); ok {
				want[str] = true
			}
		}
	}
	got := "string"
	if LooksJSON(text) {
		if v, err := ParseJSONString(text); err == nil {
			switch x := v.(type) {
			case *Object:
				got = "object"
			case []any:
				got = "array"
			case Number:
				got = "number"
				if !x.IsFloat() {
					got = "integer"
				}
			case bool:
				got = "boolean"
			case nil:
				got = "null"
			}
		}
	}
	if want[got] || (got == "integer" && want["number"]) {
		return ""
	}
	return "answer is " + got + ", schema wants " + fmt.Sprint(s.Type)
}

// JournalEntry is one committed call of a session's journal.
type JournalEntry struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args"`
	// Content and Rung are the answer the call gave; a simulated answer is reused as-is.
	Content   string `json:"content"`
	Rung      string `json:"rung"`
	StateHash string `json:"state_hash"`
}

// Rebuild remakes a session from its spec and journal, replaying each call; it
// fails with ErrDiverged when a state hash differs from the journal's.
func (rt *Runtime) Rebuild(ctx context.Context, spec SessionSpec, journal []JournalEntry) (*Session, Receipts, error) {
	s, rc, err := rt.Open(spec)
	if err != nil {
		return nil, rc, err
	}
	for i, j := range journal {
		t := rt.tools[j.Tool]
		if t == nil {
			return nil, rc, fmt.Errorf("%w: journal[%d]: %w: %q", ErrDiverged, i, ErrUnknownTool, j.Tool)
		}
		av, err := ParseJSON(j.Args)
		if err != nil {
			return nil, rc, fmt.Errorf("%w: journal[%d].args: %w", ErrDiverged, i, err)
		}
		ao, ok := av.(*Object)
		if !ok {
			return nil, rc, fmt.Errorf("%w: journal[%d].args: %w", ErrDiverged, i, ErrBadArguments)
		}
		var sim *string
		if j.Rung == RungSimulate {
			c := j.Content
			sim = &c
		}
		s.mu.Lock()
		res, err := s.call(ctx, t, ao, sim)
		s.mu.Unlock()
		if err != nil {
			return nil, rc, fmt.Errorf("%w: journal[%d]: %w", ErrDiverged, i, err)
		}
		if j.StateHash != "" && res.StateHash != j.StateHash {
			return nil, rc, fmt.Errorf("%w: journal[%d] (%s): state %s, journal says %s", ErrDiverged, i, j.Tool, res.StateHash, j.StateHash)
		}
	}
	return s, rc, nil
}
