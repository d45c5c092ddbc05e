package infer

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// State beyond rows, learned from the recordings (see twin/state.go for how a twin holds it). The tools it
// explains are those whose answers are no entity's row: JSON objects (a vehicle's {"fuelLevel": 22.5}) or text
// (a phone's "Mobile Data is now OFF."), whose fields — or the holes of the tool's text template — are
//
//   - functions of the arguments: a constant, an argument, text with arguments in it, an argument scaled by a
//     constant, a sum, mean, least or greatest of a list argument;
//   - or variables: a field of the same name (or a text hole after the same words) seen before in the trace —
//     as it was (a read), plus or minus an argument (a fuel tank filled, a balance funded), plus a step (a
//     counter), turned between two values (a switch), with an argument appended or removed (a watch list); a
//     variable may be keyed by an argument's value (a file's content by its name).
//
// Each trace is walked in call order with the variables it has shown so far (a field's value is its variable's
// value after the call), so every rule is checked on every recorded call it applies to; the rule kept for a field
// is one no recorded answer contradicts (the arguments' rules checked on every call, the variables' on the calls
// whose variable the trace had shown), else the one explaining the most answers when at most a fifth contradict
// it. A field is a variable when some tool's rule for it rests on its value before the call; a tool's field of
// that name then sets it. The base world holds each variable as each trace first showed it (before a call that
// set it; a write's answer with a learned rule is inverted), the value most traces showed. A tool whose answers
// have more than one set of fields is explained when an argument's value picks the set (cd "..": {}).

// stateTool is one tool the state learner considers: its answers' fields, per call.
type stateTool struct {
	ti     *toolInfo
	text   []string // a text tool's template literals (holes between)
	holes  []string // a text tool's hole names (holeName, made unique)
	obs    []*stateObs
	sel    string              // the argument whose value picks the answer's fields ("" when one set)
	picks  map[string]int      // selector value → shape index
	def    int                 // the shape of other selector values
	shape  [][]string          // answer field lists
	rules  []map[string]*sRule // per shape: field → rule
	floats map[string]bool     // fields production spells as floats
	sets   map[string]bool     // fields that set their variable
	shows  map[string]bool     // fields that read their variable
	refs   map[string]varRef   // field → its variable, when keyed
	// traceIDs are the build's trace ids by index (for a call's task).
	traceIDs []string
}

// stateObs is one successful call's answer as fields, with what the trace showed before it.
type stateObs struct {
	c      *call
	trace  int
	shape  int
	fields *jsonvalue.Object
	// log is its trace's log of what the calls showed, and pos the call's place in it: the variables before the
	// call are log.get(k, pos).
	log *stateLog
	pos int
}

// get answers a variable's value as the trace showed it before the call.
func (o *stateObs) get(k string) (any, bool) { return o.log.get(k, o.pos) }

// stateLog is one trace's record of the values its calls showed: per variable key, each value with the place of
// the call that showed it, in order (one entry per value shown, not a copy of every variable per call).
type stateLog struct {
	vals map[string][]logEntry
	pos  int
	// calls are the trace's answered calls with their places.
	calls []placed
}

// placed is a call with its place in its trace's log.
type placed struct {
	c   *call
	pos int
}

type logEntry struct {
	pos int
	v   any
}

func (l *stateLog) set(k string, v any) {
	l.vals[k] = append(l.vals[k], logEntry{l.pos, v})
}

// get answers k's last value set before place pos.
func (l *stateLog) get(k string, pos int) (any, bool) {
	es := l.vals[k]
	i := sort.Search(len(es), func(i int) bool { return es[i].pos >= pos })
	if i == 0 {
		return nil, false
	}
	return es[i-1].v, true
}

// lastPos answers the place of k's last value set before place pos (0 when none).
func (l *stateLog) lastPos(k string, pos int) int {
	es := l.vals[k]
	i := sort.Search(len(es), func(i int) bool { return es[i].pos >= pos })
	if i == 0 {
		return 0
	}
	return es[i-1].pos
}

// maxKeyVars bounds the variables a call's fields are also recorded keyed by (the trace's latest short texts).
const maxKeyVars = 32

// sRule is a field's learned rule and how many recorded answers it explained.
type sRule struct {
	e             sexpr
	correct, seen int
}

// minStateCalls is how many successful recorded calls a tool needs before its answers are explained by rules.
const minStateCalls = 2

// learnState explains the answers of the tools no entity table explains (see above), and answers the tools it
// synthesized handlers for, the variables' base values and the fields each tool shows.
func (m *model) learnState() {
	tools := map[string]*stateTool{}
	ids := make([]string, len(m.traces))
	for i, t := range m.traces {
		ids[i] = t.id
	}
	for _, name := range m.toolNames {
		ti := m.tools[name]
		if st := m.stateCandidate(ti); st != nil {
			st.traceIDs = ids
			tools[name] = st
		}
	}
	if len(tools) == 0 {
		return
	}
	m.stateObserve(tools)
	// Every field a tool shows: the variables another's may be keyed by.
	seen := map[string]bool{}
	var names []string
	for _, name := range sortedKeys(tools) {
		for _, o := range tools[name].obs {
			for _, f := range o.fields.Keys {
				if !seen[f] {
					seen[f] = true
					names = append(names, f)
				}
			}
		}
	}
	sort.Strings(names)
	vars := map[string]bool{}
	for _, name := range sortedKeys(tools) {
		st := tools[name]
		st.pickShapes()
		st.learnRules(names)
		for _, rs := range st.rules {
			for _, r := range rs {
				if r == nil || !r.e.stateful() {
					continue
				}
				if ref, ok := refOfRule(r.e); ok {
					vars[ref.name] = true
					if ref.keyVar != "" {
						vars[ref.keyVar] = true // a key variable is state too (the current directory)
					}
				}
			}
		}
	}
	var synth []*stateTool
	for _, name := range sortedKeys(tools) {
		st := tools[name]
		if st.complete() && st.worthIt(vars) {
			st.bindVars(vars)
			synth = append(synth, st)
		}
	}
	if len(synth) == 0 {
		return
	}
	base, perTrace := m.stateBase(synth)
	m.addStateTable(base)
	m.stateTraces = perTrace
	m.stateTools = map[string]*stateTool{}
	for _, st := range synth {
		m.synthState(st)
		m.stateTools[st.ti.name] = st
	}
	m.applyHidden(m.learnHidden(synth))
	for _, st := range synth {
		st.obs = nil // the answers' fields are read again only by fit, through fieldsOf
	}
}

// stateCandidate answers t's state tool when its answers may be explained by rules: no entity table of its own
// (or one whose rows are only their key), every success a JSON object, or every success text fitting one template.
func (m *model) stateCandidate(ti *toolInfo) *stateTool {
	if ti.table != "" && !m.echoKeyed(ti) || len(ti.calls) == 0 {
		return nil
	}
	succ := successes(ti)
	if len(succ) < minStateCalls {
		return nil
	}
	st := &stateTool{ti: ti}
	objects := 0
	for _, c := range succ {
		if _, ok := c.val.(*jsonvalue.Object); ok && c.isJSON && c.args != nil {
			objects++
		}
	}
	switch {
	case objects == len(succ):
	case objects == 0 && !jsonvalue.LooksJSON(succ[0].text):
		if st.text = textTemplate(succ); st.text == nil {
			return nil
		}
	default:
		return nil
	}
	return st
}

// fieldsOf reads a successful call's answer as fields: a JSON object's, or a text answer's holes ("#0", …).
func (st *stateTool) fieldsOf(c *call) *jsonvalue.Object {
	if !c.success || c.args == nil {
		return nil
	}
	if st.text == nil {
		o, _ := c.val.(*jsonvalue.Object)
		return o
	}
	holes, ok := twin.TextHoles(c.text, st.text)
	if !ok {
		return nil
	}
	if st.holes == nil {
		seen := map[string]bool{}
		for i := range holes {
			n := holeName(st.text, i)
			if seen[n] {
				n += " #" + strconv.Itoa(i)
			}
			seen[n] = true
			st.holes = append(st.holes, n)
		}
	}
	o := jsonvalue.NewObject(len(holes))
	for i, h := range holes {
		o.Keys = append(o.Keys, st.holes[i])
		o.Vals = append(o.Vals, h)
	}
	return o
}

// stateObserve walks every trace in call order, noting each candidate's answers with the variables the trace had
// shown before it. A field's value is its variable's (by the field's name) after the call, and the variable keyed
// by each scalar argument's value too.
func (m *model) stateObserve(tools map[string]*stateTool) {
	for ti, t := range m.traces {
		if !slices.ContainsFunc(t.calls, func(c *call) bool { return tools[c.tool] != nil }) {
			continue // nothing of this trace is a state tool's: no log to keep
		}
		log := &stateLog{vals: map[string][]logEntry{}}
		var keyVars []string // plain variables with short texts or whole numbers, most recent last
		for _, c := range t.calls {
			log.pos++ // every call has its place, so hidden effects (hidden.go) can be placed between sightings
			if c.args != nil && c.answer {
				log.calls = append(log.calls, placed{c: c, pos: log.pos})
			}
			st := tools[c.tool]
			if st == nil {
				continue
			}
			fields := st.fieldsOf(c)
			if fields == nil {
				continue
			}
			st.obs = append(st.obs, &stateObs{c: c, trace: ti, fields: fields, log: log, pos: log.pos})
			for i, f := range fields.Keys {
				v := fields.Vals[i]
				log.set(f, v)
				for _, a := range c.args.Vals {
					if keyable(a) {
						log.set(twin.StateKey(f, twin.StateKeyText(a)), v)
					}
				}
				for _, g := range keyVars {
					if g == f {
						continue
					}
					if gv, ok := log.get(g, log.pos); ok {
						log.set(twin.StateKey(f, twin.StateKeyText(gv)), v)
					}
				}
			}
			for i, f := range fields.Keys {
				if shortKey(fields.Vals[i]) {
					keyVars = slices.DeleteFunc(keyVars, func(g string) bool { return g == f })
					if keyVars = append(keyVars, f); len(keyVars) > maxKeyVars {
						keyVars = keyVars[1:]
					}
				}
			}
		}
	}
}

// shortKey tells a value a variable may be keyed by: a whole number or a short text.
func shortKey(v any) bool {
	s, ok := v.(string)
	return keyable(v) && (!ok || len(s) <= 64)
}

// pickShapes groups the tool's answers by their field lists: one list, or lists an argument's value picks (the
// list most of its values give is the default), else the most common list (the others are not explained).
func (st *stateTool) pickShapes() {
	index := map[string]int{}
	for _, o := range st.obs {
		k := strings.Join(o.fields.Keys, "\x00")
		i, ok := index[k]
		if !ok {
			i = len(st.shape)
			index[k] = i
			st.shape = append(st.shape, o.fields.Keys)
		}
		o.shape = i
	}
	if len(st.shape) <= 1 {
		return
	}
	// An argument whose value always gives the same list picks it.
	var names []string
	for _, o := range st.obs {
		for _, a := range o.c.args.Keys {
			if !contains(names, a) {
				names = append(names, a)
			}
		}
	}
	sort.Strings(names)
	for _, a := range names {
		by := map[string]int{}
		ok := true
		for _, o := range st.obs {
			v, has := o.c.args.Get(a)
			if !has || !keyable(v) {
				ok = false
				break
			}
			k := twin.StateKeyText(v)
			if s, seen := by[k]; seen && s != o.shape {
				ok = false
				break
			}
			by[k] = o.shape
		}
		if !ok || len(by) < 2 {
			continue
		}
		count := make([]int, len(st.shape))
		for _, s := range by {
			count[s]++
		}
		def := 0
		for s := range count {
			if count[s] > count[def] {
				def = s
			}
		}
		st.sel, st.def, st.picks = a, def, map[string]int{}
		for v, s := range by {
			if s != def {
				st.picks[v] = s
			}
		}
		return
	}
	// No argument picks it: the most common list.
	count := make([]int, len(st.shape))
	for _, o := range st.obs {
		count[o.shape]++
	}
	for s := range count {
		if count[s] > count[st.def] {
			st.def = s
		}
	}
}

// shapesUsed are the shapes the handler answers with: every one an argument picks, else the most common.
func (st *stateTool) shapesUsed() []int {
	if st.sel == "" {
		return []int{st.def}
	}
	seen := map[int]bool{st.def: true}
	out := []int{st.def}
	for _, s := range st.picks {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Ints(out)
	return out
}

// complete tells whether every field of every shape the handler answers with has a rule.
func (st *stateTool) complete() bool {
	for _, s := range st.shapesUsed() {
		for _, f := range st.shape[s] {
			if st.rules[s][f] == nil {
				return false
			}
		}
	}
	return true
}

// worthIt tells whether the state handler should answer the tool: it has no handler of its own, or it reads or
// sets a variable (a constant or template handler answers a tool whose answers need none as well).
func (st *stateTool) worthIt(vars map[string]bool) bool {
	if st.ti.source == "" {
		return true
	}
	for _, s := range st.shapesUsed() {
		for f, r := range st.rules[s] {
			if r.e.stateful() || vars[f] {
				return true
			}
		}
	}
	return false
}

// echoKeyed tells a write whose table is keyed by an argument its answers echo that names no entity: the key's
// recorded values are words or text, no id among them (a ticket's title, a tweet's content).
func (m *model) echoKeyed(ti *toolInfo) bool {
	if !ti.write || ti.keyArg == "" || !m.tables[ti.table].keyInRow {
		return false
	}
	for _, c := range ti.calls {
		if c.args == nil {
			continue
		}
		v, ok := c.args.Get(ti.keyArg)
		if !ok {
			continue
		}
		if _, isID := idKindOf(v); isID {
			return false
		}
	}
	return true
}

// idKindOf tells a value that is an id: a string with letters and digits, or a whole number.
func idKindOf(v any) (string, bool) {
	switch x := v.(type) {
	case jsonvalue.Number:
		return "#", !x.IsFloat()
	case string:
		digits, letters := false, false
		for _, r := range x {
			switch {
			case r >= '0' && r <= '9':
				digits = true
			case r == ' ':
				return "", false
			default:
				letters = true
			}
		}
		return x, digits && letters || digits && !letters
	}
	return "", false
}
