package twin

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/jsonvalue"
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

// RuntimeOptions tune a Runtime.
type RuntimeOptions struct {
	// MaxSteps bounds a handler's Starlark execution steps per call (default 1,000,000).
	MaxSteps uint64
	// CallBudget bounds a handler's time per call (default 2s).
	CallBudget time.Duration
	// MaxAllocBytes bounds what a provided handler may allocate per call, and its file's top level when the bundle
	// loads (default DefaultMaxAllocBytes): past it the call answers the tool's own error (ErrHandlerMemory).
	MaxAllocBytes int64
	// Simulator answers what nothing else can; nil stops the ladder at infer.
	Simulator Simulator
	// Seeder turns instructions the built-in parser cannot read into rows; nil leaves them unseeded with a note.
	Seeder Seeder
	// SeedBudget bounds one Seeder request (default 60s).
	SeedBudget time.Duration
	// SimCacheSize bounds the simulate cache (default 10,000 answers).
	SimCacheSize int
	// Parsed are the base rows already parsed, by table and key (a build's own trees): a row found here is
	// used as it is rather than parsed from its JSON, and so must be what parsing that JSON gives. The runtime
	// only reads them (as it does every base row, shared by its sessions); the caller must not change them
	// while the runtime is in use.
	Parsed map[string]map[string]*jsonvalue.Object
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

	rowsOnce sync.Once // learns the listings and preconditions (learnRows) on first need

	traceOnce sync.Once         // indexes the recordings by trace (byTrace) on first need
	byTrace   map[string][]*rec // a trace's recordings in call order
}

type rtTool struct {
	def      *Tool
	start    int
	provided starlark.Callable
	synth    starlark.Callable
	byArgs   map[string][]*rec
	all      []*rec
	// schema is the input schema, checked before the rung ladder (nil: none); args its argument rules.
	schema *jsonvalue.Schema
	args   *ArgChecker
	// listing answers a search from the rows recorded answers list (nil: not learned; see listing.go).
	listing *listing
	// preconds are a write's relations on those rows, learned from its recorded refusals (see precond.go).
	preconds []*precond
	// effects are what a successful call of the write does to those rows, learned from rows seen before and
	// after it in one trace (see listed.go).
	effects []*rowEffect
	// balances are a write's relations on the members of a named entity's map (see balance.go).
	balances []*balance
	// answerSize is the longest answer its handlers rendered so far (up to maxAnswerHint), the buffer the next starts with.
	answerSize atomic.Int64
}

const maxAnswerHint = 1 << 20

type rec struct {
	args   any
	flat   map[string]string
	answer string
	isErr  bool
	state  string
	// trace and call place the recording (for what a write did to rows seen before and after it: listed.go).
	trace string
	call  int
	// tool and canon are the recording's tool and canonical arguments (for the trace a session opened from).
	tool  *rtTool
	canon string
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
	if opts.MaxAllocBytes <= 0 {
		opts.MaxAllocBytes = DefaultMaxAllocBytes
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
		t, err := newBaseTable(&b.Tables[i], opts.Parsed[b.Tables[i].Name])
		if err != nil {
			return nil, err
		}
		rt.tables[t.def.Name] = t
		rt.tableNames = append(rt.tableNames, t.def.Name)
	}
	sort.Strings(rt.tableNames)
	pre := predeclared()
	pre.Freeze()
	guarded := guardedPredeclared(pre)
	guarded.Freeze()
	for i := range b.Tools {
		def := &b.Tools[i]
		t := &rtTool{def: def, start: rungIndex(def.Rung), byArgs: map[string][]*rec{}}
		if len(def.InputSchema) > 0 {
			t.schema, _ = jsonvalue.ParseSchema(def.InputSchema) // a schema that does not parse checks nothing
		}
		var err error
		if def.Provided != "" {
			if t.provided, err = compileProvided(def.Name, def.Provided, guarded, opts.MaxAllocBytes); err != nil {
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
		args, err := jsonvalue.ParseString(r.Args)
		if err != nil {
			return nil, fmt.Errorf("%w: recordings[%d].args: %w", ErrBadBundle, i, err)
		}
		x := &rec{args: args, flat: flatten(args), answer: b.Answers[r.Answer], isErr: r.Error, state: r.State, trace: r.Trace, call: r.Call,
			tool: t, canon: r.Args}
		t.byArgs[r.Args] = append(t.byArgs[r.Args], x)
		t.all = append(t.all, x)
	}
	for _, name := range rt.toolNames {
		rt.tools[name].args = rt.newArgCheck(rt.tools[name])
	}
	rt.opts.Parsed = nil // the tables hold what they use
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
	return entryOf(tool, globals)
}

// compileProvided compiles provided handler source with its allocations guarded (starguard.go), running its top
// level under a budget of limit bytes, and answers its entry function as compileHandler does.
func compileProvided(tool, src string, pre starlark.StringDict, limit int64) (starlark.Callable, error) {
	th := &starlark.Thread{Name: "compile " + tool, Print: func(*starlark.Thread, string) {}}
	th.SetMaxExecutionSteps(1_000_000)
	guard(th, limit)
	globals, err := compileGuarded(th, tool+".provided.star", src, pre)
	if err != nil {
		return nil, err
	}
	return entryOf(tool, globals)
}

// entryOf is a handler file's entry function: the one named after the tool, else "handle".
func entryOf(tool string, globals starlark.StringDict) (starlark.Callable, error) {
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

// CheckHandler compiles provided handler source for a tool, as a runtime would (its top level under the default
// memory budget), and reports what is wrong with it.
func CheckHandler(tool, src string) error {
	pre := predeclared()
	pre.Freeze()
	guarded := guardedPredeclared(pre)
	guarded.Freeze()
	_, err := compileProvided(tool, src, guarded, DefaultMaxAllocBytes)
	return err
}
