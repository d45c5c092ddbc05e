package twin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
)

// Sessions opened from a trace: the world a recorded conversation saw. The session's world is the base world
// overlaid with what the trace's calls before its first write observed — the rule the build's base world is made
// by, applied to one trace (DESIGN §4.2): each entity row a read or lookup answered (the first sighting of each),
// each row a search listed, each state value a read showed (state.go), and the answers themselves, which the
// replay rung gives for the same call before any other recording. The first call of a write tool ends what is
// used; calls of tools the build does not know are passed over. The receipts name the trace and hash the calls
// used, and carry them (TraceCalls) so a rebuilt session gets the same world: the same trace gives the same world
// hash. What the trace did not observe comes from the base world and the world policy as usual.

// TraceCall is one call of a trace a session opens from: the tool, its arguments (a JSON object) and the answer
// production gave (its text).
type TraceCall struct {
	Tool   string          `json:"tool"`
	Args   json.RawMessage `json:"args"`
	Answer string          `json:"answer"`
}

// TraceSpec is the trace a session opens from: its id (for the receipts; may be empty) and its answered calls in
// order, whole or a prefix.
type TraceSpec struct {
	ID    string      `json:"id,omitempty"`
	Calls []TraceCall `json:"calls"`
}

// TraceReceipt names the trace a session's world was opened from: its id, the hash of the calls used (the calls
// before its first write, of tools the build knows), how many were used and how many were given.
type TraceReceipt struct {
	ID    string `json:"id,omitempty"`
	Hash  string `json:"hash"`
	Used  int    `json:"used"`
	Given int    `json:"given"`
	// FirstWrite is the tool of the call that ended what was used ("" when the trace wrote nothing).
	FirstWrite string `json:"first_write,omitempty"`
}

// observedPrefix starts the overlay table names of the answers a trace observed (as listedPrefix does listings').
const observedPrefix = "\x00observed:"

func observedTable(tool string) string { return observedPrefix + tool }

// openFromTrace lays what the trace's calls before its first write observed over the session's world, and answers
// the receipt and the calls used.
func (s *Session) openFromTrace(ts *TraceSpec) (*TraceReceipt, []TraceCall) {
	rc := &TraceReceipt{ID: ts.ID, Given: len(ts.Calls)}
	var used []TraceCall
	seen := map[tableKey]bool{}
	for _, c := range ts.Calls {
		t := s.rt.tools[c.Tool]
		if t == nil {
			continue // a tool the build does not know: nothing to read it by
		}
		args, ok := traceArgs(c.Args)
		if !ok {
			continue // arguments that are no JSON object, as a build passes over them
		}
		if t.def.Kind == KindWrite {
			rc.FirstWrite = c.Tool
			break
		}
		canon := jsonvalue.CanonicalText(args)
		used = append(used, TraceCall{Tool: c.Tool, Args: json.RawMessage(canon), Answer: c.Answer})
		s.observe(t, args, canon, c.Answer, seen)
	}
	rc.Used = len(used)
	rc.Hash = traceHash(used)
	return rc, used
}

// traceArgs parses a trace call's arguments: a JSON object, or nothing (no arguments).
func traceArgs(raw json.RawMessage) (*jsonvalue.Object, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return jsonvalue.NewObject(0), true
	}
	v, err := jsonvalue.Parse(raw)
	if err != nil {
		return nil, false
	}
	o, ok := v.(*jsonvalue.Object)
	return o, ok
}

// TraceCallsOf answers a trace's answered calls whose arguments are a JSON object (or none), in order, as a session
// opens from them.
func TraceCallsOf(t trace.Trace) []TraceCall {
	var out []TraceCall
	for _, c := range trace.RawCalls(t) {
		if !c.Answered || c.Tool == "" {
			continue
		}
		args, ok := traceArgs(json.RawMessage(c.RawArgs))
		if !ok {
			continue
		}
		out = append(out, TraceCall{Tool: c.Tool, Args: json.RawMessage(jsonvalue.CanonicalText(args)), Answer: c.Result})
	}
	return out
}

// observe lays one read's answer over the session's world: the answer itself, the row it is, the rows it lists and
// the state values it shows. The first sighting of a row wins, as in the base world.
func (s *Session) observe(t *rtTool, args *jsonvalue.Object, canon, answer string, seen map[tableKey]bool) {
	isErr := isErrorText(answer)
	name := observedTable(t.def.Name)
	if _, dup := s.over[name][canon]; !dup {
		rec := jsonvalue.NewObject(2)
		rec.Set("answer", answer)
		if isErr {
			rec.Set("error", true)
		}
		if s.over[name] == nil {
			s.over[name] = map[string]*jsonvalue.Object{}
		}
		s.over[name][canon] = rec
		s.dirty = true
	}
	if isErr {
		return
	}
	if !jsonvalue.LooksJSON(answer) {
		s.observeState(t, args, answer, seen) // a text answer's holes
		return
	}
	if t.def.Table != "" && (t.def.Kind == KindRead || t.def.Kind == KindLookup) {
		if key, row := s.rt.rowFromAnswer(t, args, answer); row != nil {
			tk := tableKey{t.def.Table, key}
			if !seen[tk] {
				seen[tk] = true
				s.put(tk.table, tk.key, row)
			}
		}
	}
	if t.def.Kind == KindQuery {
		s.observeListed(t, args, answer)
	}
	s.observeState(t, args, answer, seen)
}

// observeListed lays the rows a search answer lists over the session's copies of every listing that holds them.
func (s *Session) observeListed(t *rtTool, args *jsonvalue.Object, answer string) {
	s.rt.rowsOnce.Do(s.rt.learnRows)
	v, err := jsonvalue.ParseString(answer)
	if err != nil {
		return
	}
	elems, ok := listElements(v)
	if !ok {
		return
	}
	for _, name := range s.rt.toolNames {
		l := s.rt.tools[name].listing
		if l == nil {
			continue
		}
		probe := &listing{key: l.key, fields: l.fields, dims: l.dims, rows: map[string]*jsonvalue.Object{}}
		probe.addAll(elems, args, l == t.listing, s.rt.style, sighting{})
		for _, id := range probe.order {
			if rec, known := l.rows[id]; known && !jsonvalue.Equal(rec, probe.rows[id]) {
				s.putListed(l, id, probe.rows[id])
			}
		}
	}
}

// observedAnswer answers the call as the trace the session opened from answered it, when it made the very call.
func (s *Session) observedAnswer(t *rtTool, args *jsonvalue.Object) *answer {
	rec := s.over[observedTable(t.def.Name)][jsonvalue.CanonicalText(args)]
	if rec == nil {
		return nil
	}
	text, _ := rec.Get("answer")
	a, _ := text.(string)
	e, _ := rec.Get("error")
	isErr, _ := e.(bool)
	return &answer{content: a, isErr: isErr}
}

// traceHash is "sha256:" + hex SHA-256 of the canonical JSON of the calls used: [{"answer", "args", "tool"}, …].
func traceHash(calls []TraceCall) string {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, c := range calls {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(`{"answer":`)
		jsonvalue.AppendString(&buf, c.Answer)
		buf.WriteString(`,"args":`)
		buf.Write(c.Args) // canonical already
		buf.WriteString(`,"tool":`)
		jsonvalue.AppendString(&buf, c.Tool)
		buf.WriteByte('}')
	}
	buf.WriteByte(']')
	sum := sha256.Sum256(buf.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ownTraceAnswer answers a call as production did in the trace the session opened from, when the bundle holds that
// trace and its next call of this tool with these very arguments (after the one that answered last) is recorded:
// a session opened from a recorded conversation reproduces it while the agent follows it. A write's recorded row
// is applied, as a replayed write's is.
func (s *Session) ownTraceAnswer(t *rtTool, args *jsonvalue.Object) (*answer, string) {
	s.rt.traceOnce.Do(s.rt.indexTraces)
	recs := s.rt.byTrace[s.traceID]
	if len(recs) == 0 {
		return nil, ""
	}
	canon := ""
	for _, r := range recs {
		if r.call <= s.traceAt || r.tool != t {
			continue
		}
		if canon == "" {
			canon = jsonvalue.CanonicalText(args)
		}
		if r.canon != canon {
			continue
		}
		s.traceAt = r.call
		a := &answer{content: r.answer, isErr: r.isErr}
		if t.def.Kind == KindWrite && !r.isErr {
			a.applyKey, a.apply = s.rt.rowFromAnswer(t, args, r.answer)
		}
		return a, fmt.Sprintf("the recording of call %d of trace %s, which the session opened from, answered", r.call, s.traceID)
	}
	return nil, ""
}

// indexTraces indexes the recordings by trace, each trace's in call order.
func (rt *Runtime) indexTraces() {
	rt.byTrace = map[string][]*rec{}
	for _, name := range rt.toolNames {
		for _, r := range rt.tools[name].all {
			rt.byTrace[r.trace] = append(rt.byTrace[r.trace], r)
		}
	}
	for _, recs := range rt.byTrace {
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].call < recs[j].call })
	}
}
