package infer

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// call is one recorded tool call, parsed once.
type call struct {
	trace int // index of its trace in the prepared set
	idx   int
	tool  string
	args  *jsonvalue.Object // nil when the arguments are not a JSON object (or while released)
	canon string            // canonical JSON of args ("" when args is nil)
	// argsText is the arguments' text args was parsed from, for Prepared.finish to parse again once a build
	// released args (argsReleased).
	argsText     string
	argsReleased bool
	answer       bool // an answer was recorded
	text         string
	val          any // the answer parsed as JSON (valid only when isJSON; nil while released)
	isJSON       bool
	// released: val was dropped by a build done with it; Prepared.finish parses text again.
	released bool
	isErr    bool
	success  bool // answered, not an error
}

// ptrace is a prepared trace.
type ptrace struct {
	id    string
	calls []*call
	warns []warnAt // its messy input, replayed in trace-id order when the set is complete
}

// release drops the parsed answers and arguments of t's calls (their text stays): Prepared.finish restores
// them for a next use of the set.
func (t *ptrace) release() {
	for _, c := range t.calls {
		if c.isJSON && !c.released {
			c.val, c.released = nil, true
		}
		if c.args != nil && !c.argsReleased {
			c.args, c.argsReleased = nil, true
		}
	}
}

// warnAt is one warning a trace gave while it was prepared.
type warnAt struct{ code, example string }

// warnings counts messy input, never fatal.
type warnings struct {
	counts   map[string]int
	examples map[string]string
}

func (w *warnings) add(code, example string) {
	if w.counts == nil {
		w.counts = map[string]int{}
		w.examples = map[string]string{}
	}
	w.counts[code]++
	if _, ok := w.examples[code]; !ok {
		if len(example) > 160 {
			example = example[:160] + "…"
		}
		w.examples[code] = example
	}
}

func (w *warnings) list() []Warning {
	out := make([]Warning, 0, len(w.counts))
	for c, n := range w.counts {
		out = append(out, Warning{Code: c, Count: n, Example: w.examples[c]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// Prepared is a build's input after parsing: each trace's tool calls as compact records (the message
// text itself is not kept) and the agent profile learned on the way. Add takes the traces a batch at a
// time, so they need never all be in memory together; the order of batches and of traces within them
// does not matter (traces are taken in id order, the first of an id wins), so a build from a Prepared
// equals Build of the same traces. The zero value is an empty set.
type Prepared struct {
	pts    []*ptrace
	seen   map[string]bool
	dups   []string // ids given again after their first trace
	keys   map[string]string
	shapes map[string][]string // key lists by their keys joined, shared by every object of that shape
	sig    []byte              // scratch for a shape's key
	agent  agentLearner
	sorted bool
	// answers holds the first call of each distinct answer text: later calls with the same text share its
	// text and parsed tree (an answer repeats across traces: a product's details, a common error).
	answers map[string]*call
}

// Add prepares a batch of traces. The batch is not retained: its memory can go once Add returns.
func (p *Prepared) Add(traces []trace.Trace) {
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	for i := range traces {
		t := &traces[i]
		p.agent.add(t)
		if p.seen[t.ID] {
			p.dups = append(p.dups, t.ID)
			continue
		}
		p.seen[t.ID] = true
		pt := p.prepareTrace(t)
		p.pts = append(p.pts, pt)
		p.sorted = false
	}
}

// AddAll adds n batches, batch i being what next(ctx, i) answers. next runs a batch ahead of Add, on a
// goroutine of its own, so reading and decoding one batch overlaps preparing the one before (a build's
// loading uses two cores); at most two batches are in memory at once besides the prepared set. next is
// called for i = 0, 1, … in order, never concurrently with itself. The first error (next's, or ctx's)
// stops the loading and is answered; the batches added before it stay added.
func (p *Prepared) AddAll(ctx context.Context, n int, next func(ctx context.Context, i int) ([]trace.Trace, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type loaded struct {
		traces []trace.Trace
		err    error
	}
	ch := make(chan loaded)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			ts, err := next(ctx, i)
			if err == nil {
				err = ctx.Err()
			}
			select {
			case ch <- loaded{ts, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-done
	}()
	for range n {
		var l loaded
		select {
		case l = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if l.err != nil {
			return l.err
		}
		p.Add(l.traces)
	}
	return nil
}

// maxInterned bounds the distinct keys intern shares: keys that are ids (objects keyed by entity)
// would only grow the table.
const maxInterned = 1 << 14

// maxShapes bounds the distinct key lists intern shares, and maxShapeKeys the length of one (longer
// objects are keyed by ids and rarely repeat).
const (
	maxShapes    = 1 << 14
	maxShapeKeys = 64
)

// intern makes the object keys in v share one string per distinct key across the set: the same few
// dozen names recur in every call, and the copies the parser made can go. Objects with the same keys
// in the same order (every order, every user) share one Keys slice too (Object's Set and Delete copy
// before they write).
func (p *Prepared) intern(v any) {
	switch x := v.(type) {
	case *jsonvalue.Object:
		if x == nil {
			return
		}
		if p.keys == nil {
			p.keys = map[string]string{}
		}
		for i, k := range x.Keys {
			if s, ok := p.keys[k]; ok {
				x.Keys[i] = s
			} else if len(p.keys) < maxInterned {
				p.keys[k] = k
			}
			p.intern(x.Vals[i])
		}
		p.shareKeys(x)
	case []any:
		for _, e := range x {
			p.intern(e)
		}
	}
}

// shareKeys makes x use the set's Keys slice for its shape, or records x's as that shape's.
func (p *Prepared) shareKeys(x *jsonvalue.Object) {
	if len(x.Keys) == 0 || len(x.Keys) > maxShapeKeys {
		return
	}
	if p.shapes == nil {
		p.shapes = map[string][]string{}
	}
	p.sig = p.sig[:0]
	for _, k := range x.Keys {
		// Length-prefixed, so no two key lists spell the same signature.
		p.sig = binary.AppendUvarint(p.sig, uint64(len(k)))
		p.sig = append(p.sig, k...)
	}
	if ks, ok := p.shapes[string(p.sig)]; ok {
		x.Keys = ks
	} else if len(p.shapes) < maxShapes {
		x.Keys = x.Keys[:len(x.Keys):len(x.Keys)] // so an append never writes where a sharer could see
		p.shapes[string(p.sig)] = x.Keys
	}
}

// Len is the number of distinct traces added.
func (p *Prepared) Len() int { return len(p.pts) }

// finish answers the prepared traces in id order, their released answers parsed again, and a fresh
// warnings of their messy input, in the order a single pass over the traces sorted by id would have met it.
func (p *Prepared) finish() ([]*ptrace, *warnings, error) {
	if !p.sorted {
		// Ids are distinct here (duplicates were dropped in Add), so the order is total.
		sort.Slice(p.pts, func(a, b int) bool { return p.pts[a].id < p.pts[b].id })
		for i, pt := range p.pts {
			for _, c := range pt.calls {
				c.trace = i
			}
		}
		p.sorted = true
	}
	// The answers by text served sharing while traces were added; the calls keep what they share, and a later
	// Add shares among its own batches. A large set's map need not outlive adding.
	p.answers = nil
	parsed := map[string]any{} // calls with one text share one tree again
	for _, pt := range p.pts {
		for _, c := range pt.calls {
			if c.argsReleased {
				// As prepareTrace parsed them (the text parsed to an object then, and does again).
				o, err := parseArgs(c.argsText)
				if err != nil {
					return nil, nil, fmt.Errorf("infer: trace %s call %d: prepared arguments no longer parse: %w", pt.id, c.idx, err)
				}
				p.intern(o)
				c.args, c.argsReleased = o, false
			}
			if !c.released {
				continue
			}
			v, ok := parsed[c.text]
			if !ok {
				// The text parsed as JSON when the call was prepared, and parses the same again.
				var err error
				if v, err = jsonvalue.ParseStringShared(c.text); err != nil {
					return nil, nil, fmt.Errorf("infer: trace %s call %d: a prepared answer no longer parses: %w", pt.id, c.idx, err)
				}
				p.intern(v)
				parsed[c.text] = v
			}
			c.val, c.released = v, false
		}
	}
	w := &warnings{}
	dups := slices.Sorted(slices.Values(p.dups))
	for _, pt := range p.pts {
		for len(dups) > 0 && dups[0] <= pt.id {
			w.add("duplicate_trace_id", dups[0])
			dups = dups[1:]
		}
		for _, x := range pt.warns {
			w.add(x.code, x.example)
		}
	}
	return p.pts, w, nil
}

// prepareTrace parses one trace's calls; its messy input goes in the ptrace's warns.
func (p *Prepared) prepareTrace(t *trace.Trace) *ptrace {
	pt := &ptrace{id: t.ID}
	warn := func(code, example string) {
		if len(example) > 160 {
			example = example[:160] + "…" // what warnings.add keeps; the rest of the text may go
		}
		pt.warns = append(pt.warns, warnAt{code, strings.Clone(example)})
	}
	callIDs := map[string]bool{}
	for j, m := range t.Messages {
		for _, tc := range m.ToolCalls {
			callIDs[tc.ID] = true
		}
		if m.Role == trace.RoleTool && m.ToolCallID != "" && !callIDs[m.ToolCallID] {
			warn("answer_to_unknown_call", fmt.Sprintf("%s messages[%d].tool_call_id=%q", t.ID, j, m.ToolCallID))
		}
		switch m.Role {
		case trace.RoleSystem, trace.RoleUser, trace.RoleAssistant, trace.RoleTool:
		default:
			warn("unknown_role", fmt.Sprintf("%s messages[%d].role=%q", t.ID, j, m.Role))
		}
		if m.Role == trace.RoleTool && m.ToolCallID == "" {
			warn("tool_message_without_call_id", fmt.Sprintf("%s messages[%d]", t.ID, j))
		}
	}
	for _, c := range trace.RawCalls(*t) {
		pc := &call{idx: c.Index, tool: c.Tool, answer: c.Answered, text: c.Result}
		if c.Tool == "" {
			warn("call_without_tool_name", fmt.Sprintf("%s call %d", t.ID, c.Index))
			continue
		}
		if o, err := parseArgs(c.RawArgs); err == nil {
			pc.args, pc.argsText = o, c.RawArgs
		}
		if pc.args == nil {
			warn("arguments_not_json_object", fmt.Sprintf("%s %s(%s)", t.ID, c.Tool, c.RawArgs))
		} else {
			p.intern(pc.args)
			pc.canon = jsonvalue.CanonicalText(pc.args)
		}
		if !c.Answered {
			warn("call_without_result", fmt.Sprintf("%s %s call %d", t.ID, c.Tool, c.Index))
		} else {
			p.answer(pc)
			if !pc.isJSON && jsonvalue.LooksJSON(pc.text) && (pc.text[0] == '{' || pc.text[0] == '[') {
				warn("answer_not_json", fmt.Sprintf("%s %s: %s", t.ID, c.Tool, c.Result))
			}
		}
		pt.calls = append(pt.calls, pc)
	}
	return pt
}

// parseArgs parses a call's arguments text: a JSON object, or nothing (no arguments). Its strings share the
// text's memory.
func parseArgs(text string) (*jsonvalue.Object, error) {
	v, err := jsonvalue.ParseStringShared(text)
	if err != nil {
		if strings.TrimSpace(text) == "" {
			return jsonvalue.NewObject(0), nil
		}
		return nil, err
	}
	o, ok := v.(*jsonvalue.Object)
	if !ok {
		return nil, fmt.Errorf("arguments are not a JSON object")
	}
	return o, nil
}

// answer reads c's answer text: error or not, and its parse when it is JSON, shared with an earlier call
// of the same text.
func (p *Prepared) answer(c *call) {
	if first := p.answers[c.text]; first != nil && !first.released {
		c.text, c.val, c.isJSON, c.isErr, c.success = first.text, first.val, first.isJSON, first.isErr, first.success
		return
	}
	c.isErr = twin.IsErrorText(c.text)
	if jsonvalue.LooksJSON(c.text) {
		if v, err := jsonvalue.ParseStringShared(c.text); err == nil {
			c.val, c.isJSON = v, true
			if o, ok := v.(*jsonvalue.Object); ok && o.Len() == 1 && (o.Keys[0] == "error" || o.Keys[0] == "Error") {
				c.isErr = true
			}
			p.intern(v)
		}
	}
	c.success = !c.isErr
	if p.answers == nil {
		p.answers = map[string]*call{}
	}
	p.answers[c.text] = c
}
