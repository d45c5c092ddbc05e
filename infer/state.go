package infer

import (
	"math"
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

// learnRules learns each field's rule for every shape the handler answers with; names are the variables a
// variable may be keyed by.
func (st *stateTool) learnRules(names []string) {
	st.rules = make([]map[string]*sRule, len(st.shape))
	st.floats = map[string]bool{}
	for _, s := range st.shapesUsed() {
		var obs []*stateObs
		for _, o := range st.obs {
			if o.shape == s {
				obs = append(obs, o)
			}
		}
		st.rules[s] = map[string]*sRule{}
		for _, f := range st.shape[s] {
			st.rules[s][f] = st.learnField(f, obs, keyVars(f, obs, names), names)
		}
	}
}

// learnField picks field f's rule over the answers obs (see the file comment): nil when none explains them.
func (st *stateTool) learnField(f string, obs []*stateObs, keyVarNames, names []string) *sRule {
	vals := make([]any, len(obs))
	floats, nums := 0, 0
	for i, o := range obs {
		vals[i], _ = o.fields.Get(f)
		if n, ok := vals[i].(jsonvalue.Number); ok {
			nums++
			if n.IsFloat() {
				floats++
			}
		}
	}
	isFloat := nums > 0 && floats == nums
	if isFloat {
		st.floats[f] = true
	}
	n := len(obs)
	score := func(e sexpr, abort bool) *sRule {
		r := &sRule{e: e}
		alias := ""
		if ref, ok := refOfRule(e); ok && ref.name != f {
			alias = ref.name
		}
		for i, o := range obs {
			x := &sctx{args: o.c.args, get: o.get}
			if alias != "" && i > 0 && obs[i-1].trace == o.trace {
				// The hypothesis sets the other variable to this field's value: after this tool's previous call
				// the variable is what that call answered, unless the trace showed it since.
				prev, prevVal := obs[i-1], vals[i-1]
				x.get = func(k string) (any, bool) {
					if k == alias && o.log.lastPos(k, o.pos) < prev.pos {
						return prevVal, prevVal != nil
					}
					return o.get(k)
				}
			}
			v, ok := e.eval(x)
			if !ok {
				continue
			}
			r.seen++
			if jsonvalue.Equal(v, vals[i]) {
				r.correct++
			} else if abort && 5*(r.seen-r.correct) > n+5 {
				return nil // contradicted too often for any tier below: stop scoring it
			}
		}
		return r
	}
	var pure, stateful []*sRule
	for _, e := range argCandidates(f, obs, vals, isFloat) {
		r := score(e, false) // scored whole: conditions pair the partial ones
		if r == nil {
			continue
		}
		if r.correct == n {
			return r // a function of the arguments every answer agrees with
		}
		pure = append(pure, r)
	}
	for _, e := range conditions(pure, obs) {
		if r := score(e, true); r != nil {
			if r.correct == n {
				return r
			}
			pure = append(pure, r)
		}
	}
	for _, e := range stateCandidates(f, obs, vals, isFloat, st.keyArgs(obs), keyVarNames, names) {
		if r := score(e, true); r != nil {
			stateful = append(stateful, r)
		}
	}
	// A variable rule no answer contradicts, on the most answers.
	var best *sRule
	for _, r := range stateful {
		if r.seen > 0 && r.correct == r.seen && (best == nil || r.seen > best.seen) {
			best = r
		}
	}
	if best != nil {
		return best
	}
	// The rule explaining the most answers, when at most a fifth contradict it.
	for _, r := range append(pure, stateful...) {
		if r.correct >= 2 && 5*(r.seen-r.correct) <= r.seen && (best == nil || r.correct > best.correct) {
			best = r
		}
	}
	if best != nil {
		return best
	}
	// Values that vary and nothing explains: the variable of the field's name, as the trace last showed it (its
	// base value until then) — keyed by an argument whose value always gave the same value of it (a city's zip
	// code), when one does — unless they are text made of the arguments, which no variable holds.
	if !allEqual(vals) && !argTexts(obs, vals) {
		return &sRule{e: readS{v: varRef{name: f, keyArg: lookupArg(obs, vals, st.keyArgs(obs), st.unit)}, float: isFloat}}
	}
	return nil
}

// lookupArg answers the argument whose value picks the field's value in every recorded call (the same argument,
// the same value; at least two values of it, and one of them given in calls of two different tasks — a lookup
// shared by worlds, not a value of one conversation), "" when none does. unit names a call's task (or trace).
func lookupArg(obs []*stateObs, vals []any, keyArgs []string, unit func(*stateObs) string) string {
next:
	for _, a := range keyArgs {
		by := map[string]any{}
		units := map[string]map[string]bool{}
		shared := false
		for i, o := range obs {
			v, _ := o.c.args.Get(a)
			k := twin.StateKeyText(v)
			if prev, ok := by[k]; ok && !jsonvalue.Equal(prev, vals[i]) {
				continue next
			}
			by[k] = vals[i]
			if units[k] == nil {
				units[k] = map[string]bool{}
			}
			units[k][unit(o)] = true
			shared = shared || len(units[k]) > 1
		}
		if len(by) >= 2 && shared {
			return a
		}
	}
	return ""
}

func allEqual(vals []any) bool {
	for _, v := range vals[1:] {
		if !jsonvalue.Equal(v, vals[0]) {
			return false
		}
	}
	return true
}

// unit names the task (or, when its id names none, the trace) of a call.
func (st *stateTool) unit(o *stateObs) string {
	id := st.traceIDs[o.trace]
	if k, ok := taskKey(id); ok {
		return k
	}
	return id
}

// keyArgs are the arguments a variable may be keyed by: top-level, a string or integer in every call.
func (st *stateTool) keyArgs(obs []*stateObs) []string {
	var out []string
	for _, a := range obs[0].c.args.Keys {
		ok := true
		for _, o := range obs {
			if v, has := o.c.args.Get(a); !has || !keyable(v) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// keyVars are the variables field f's variable may be keyed by: of names, those (not f) at least minStateCalls
// calls of obs had seen a whole number or short text of before them.
func keyVars(f string, obs []*stateObs, names []string) []string {
	var out []string
	for _, g := range names {
		if g == f {
			continue
		}
		n := 0
		for _, o := range obs {
			if v, ok := o.get(g); ok && shortKey(v) {
				n++
			}
		}
		if n >= minStateCalls {
			out = append(out, g)
		}
	}
	return out
}

// argCandidates are the functions of the arguments field f might be, in the order they are preferred.
func argCandidates(f string, obs []*stateObs, vals []any, isFloat bool) []sexpr {
	out := []sexpr{constS{v: mostCommon(vals)}}
	first := obs[0].c.args
	// Arguments some calls leave out: production's answer then (one same value) is their default.
	for _, a := range optionalArgs(obs) {
		var absent []any
		for i, o := range obs {
			if _, ok := o.c.args.Get(a); !ok {
				absent = append(absent, vals[i])
			}
		}
		if allEqual(absent) {
			out = append(out, argS{name: a, float: isFloat, hasDef: true, def: absent[0]})
		}
	}
	for i, a := range first.Keys {
		out = append(out, argS{name: a, float: isFloat})
		n, isNum := first.Vals[i].(jsonvalue.Number)
		if v, ok := vals[0].(jsonvalue.Number); ok && isNum && n.Float64() != 0 {
			if k, ok := niceRatio(v.Float64(), n.Float64()); ok {
				out = append(out, scaleS{name: a, k: k})
			}
		}
		if _, isList := first.Vals[i].([]any); isList {
			for _, fn := range []string{"sum", "mean", "min", "max"} {
				out = append(out, aggS{name: a, fn: fn})
			}
		}
	}
	out = append(out, templates(obs, vals)...)
	return out
}

// maxTemplates bounds the text templates tried for one field: the most common ones.
const maxTemplates = 3

// templates are the text templates of a string field with argument values in it, most common first.
func templates(obs []*stateObs, vals []any) []sexpr {
	count := map[string]int{}
	var keys []string
	tmpl := map[string][]part{}
	for i, o := range obs {
		s, ok := vals[i].(string)
		if !ok {
			continue
		}
		ps := templateOf(s, o.c.args)
		if !hasPlaceholder(ps) {
			continue
		}
		k := partsKey(ps)
		if count[k] == 0 {
			keys = append(keys, k)
			tmpl[k] = ps
		}
		count[k]++
	}
	sort.SliceStable(keys, func(i, j int) bool { return count[keys[i]] > count[keys[j]] })
	var out []sexpr
	for _, k := range keys[:min(len(keys), maxTemplates)] {
		out = append(out, tmplS{parts: tmpl[k]})
	}
	return out
}

// argTexts tells whether most of a field's values are text with argument values in it.
func argTexts(obs []*stateObs, vals []any) bool {
	n := 0
	for i, o := range obs {
		if s, ok := vals[i].(string); ok && hasPlaceholder(templateOf(s, o.c.args)) {
			n++
		}
	}
	return 2*n > len(obs)
}

// condChars are the characters a condition may test a text argument for.
const condChars = "./_-: @"

// maxCondRules bounds the rules conditions pair: those explaining the most answers.
const maxCondRules = 4

// conditions pair the functions of the arguments that explain some answers each: one when a text argument holds
// a character, the other when it does not.
func conditions(pure []*sRule, obs []*stateObs) []sexpr {
	var rs []*sRule
	for _, r := range pure {
		if r.correct >= minStateCalls {
			rs = append(rs, r)
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].correct > rs[j].correct })
	rs = rs[:min(len(rs), maxCondRules)]
	if len(rs) < 2 {
		return nil
	}
	var texts []string
	for i, a := range obs[0].c.args.Keys {
		if _, ok := obs[0].c.args.Vals[i].(string); ok {
			texts = append(texts, a)
		}
	}
	sort.Strings(texts)
	var out []sexpr
	for _, a := range texts {
		for _, ch := range condChars {
			for i, x := range rs {
				for j, y := range rs {
					if i != j {
						out = append(out, condS{arg: a, ch: string(ch), then: x.e, els: y.e})
					}
				}
			}
		}
	}
	return out
}

// optionalArgs are the top-level arguments some calls of obs give and others do not, sorted.
func optionalArgs(obs []*stateObs) []string {
	count := map[string]int{}
	for _, o := range obs {
		for _, k := range o.c.args.Keys {
			count[k]++
		}
	}
	var out []string
	for k, n := range count {
		if n < len(obs) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// niceRatio answers v/a rounded to the fewest significant digits (up to 12) whose product with a gives v exactly.
func niceRatio(v, a float64) (float64, bool) {
	for d := 1; d <= 12; d++ {
		k, err := strconv.ParseFloat(strconv.FormatFloat(v/a, 'g', d, 64), 64)
		if err == nil && a*k == v {
			return k, true
		}
	}
	return 0, false
}

// stateCandidates are the variable rules field f might be: its variable as it was, keyed by an argument, plus or
// minus a numeric argument or a step, turned between two values, with an argument appended or removed.
func stateCandidates(f string, obs []*stateObs, vals []any, isFloat bool, keyArgs, keyVarNames, names []string) []sexpr {
	refs := []varRef{{name: f}}
	for _, a := range keyArgs {
		refs = append(refs, varRef{name: f, keyArg: a})
	}
	var out []sexpr
	first := obs[0].c.args
	for _, r := range refs {
		out = append(out, readS{v: r, float: isFloat})
		for i, a := range first.Keys {
			switch first.Vals[i].(type) {
			case jsonvalue.Number:
				out = append(out, addS{v: r, name: a, sign: 1}, addS{v: r, name: a, sign: -1})
			default:
				out = append(out, listS{v: r, name: a}, listS{v: r, name: a, remove: true})
			}
		}
		out = append(out, addS{v: r, sign: 1, step: 1}, addS{v: r, sign: -1, step: 1}, notS{v: r})
		if two := twoValues(vals); two != nil {
			out = append(out, flipS{v: r, a: two[0], b: two[1]})
		}
	}
	// A variable keyed by another variable is read (a directory's entries), not computed; after the simpler
	// rules, which win a tie.
	for _, g := range keyVarNames {
		out = append(out, readS{v: varRef{name: f, keyVar: g}, float: isFloat})
	}
	// Another variable's new value: a numeric field that is some other variable plus or minus an argument or a
	// step (a funding's "new_balance" is the balance plus the amount; a new note's id the notes counted plus one).
	if _, isNum := vals[0].(jsonvalue.Number); isNum {
		for _, g := range numericVars(f, obs, names) {
			r := varRef{name: g}
			for i, a := range first.Keys {
				if _, ok := first.Vals[i].(jsonvalue.Number); ok {
					out = append(out, addS{v: r, name: a, sign: 1}, addS{v: r, name: a, sign: -1})
				}
			}
			out = append(out, addS{v: r, sign: 1, step: 1}, addS{v: r, sign: -1, step: 1})
		}
	}
	return out
}

// numericVars are the variables (of names, not f) at least minStateCalls calls of obs had seen a number of before.
func numericVars(f string, obs []*stateObs, names []string) []string {
	var out []string
	for _, g := range names {
		if g == f {
			continue
		}
		n := 0
		for _, o := range obs {
			if v, ok := o.get(g); ok {
				if _, isNum := v.(jsonvalue.Number); isNum {
					n++
				}
			}
		}
		if n >= minStateCalls {
			out = append(out, g)
		}
	}
	return out
}

// twoValues answers the two values vals hold, when they hold exactly two (sorted by their canonical text).
func twoValues(vals []any) []any {
	var out []any
	for _, v := range vals {
		found := false
		for _, x := range out {
			if jsonvalue.Equal(x, v) {
				found = true
			}
		}
		if !found {
			if out = append(out, v); len(out) > 2 {
				return nil
			}
		}
	}
	if len(out) != 2 {
		return nil
	}
	if jsonvalue.CanonicalText(out[0]) > jsonvalue.CanonicalText(out[1]) {
		out[0], out[1] = out[1], out[0]
	}
	return out
}

func mostCommon(vals []any) any {
	best, bestN := vals[0], 0
	for _, v := range vals {
		n := 0
		for _, w := range vals {
			if jsonvalue.Equal(v, w) {
				n++
			}
		}
		if n > bestN {
			best, bestN = v, n
		}
	}
	return best
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

// bindVars decides which fields read their variable and which set it: a field whose name is a variable sets it
// to the field's value, unless its rule is a plain read of it.
func (st *stateTool) bindVars(vars map[string]bool) {
	st.sets, st.shows, st.refs = map[string]bool{}, map[string]bool{}, map[string]varRef{}
	for _, s := range st.shapesUsed() {
		for f, r := range st.rules[s] {
			if rd, ok := r.e.(readS); ok && rd.v.name == f {
				st.shows[f] = true
				st.refs[f] = rd.v
				continue
			}
			ref, stateful := refOfRule(r.e)
			switch {
			case stateful && ref.name != f:
				// Another variable's new value (an alias): the call sets that variable.
				st.sets[f] = true
				st.refs[f] = ref
			case vars[f]:
				st.sets[f] = true
				if stateful {
					st.refs[f] = ref
				}
			}
		}
	}
}

// refOf is the variable field f of the tool's answers reads or sets.
func (st *stateTool) refOf(f string) varRef {
	if r, ok := st.refs[f]; ok {
		return r
	}
	return varRef{name: f}
}

// refOfRule is the variable a stateful rule rests on.
func refOfRule(e sexpr) (varRef, bool) {
	switch x := e.(type) {
	case readS:
		return x.v, true
	case addS:
		return x.v, true
	case notS:
		return x.v, true
	case flipS:
		return x.v, true
	case listS:
		return x.v, true
	}
	return varRef{}, false
}

// writes tells whether the tool sets a variable.
func (st *stateTool) writes() bool { return len(st.sets) > 0 }

// stateBase makes the base value of each variable: per trace, the value before the first call that showed or set
// it (a read's value, or a learned write inverted), the value most traces gave (ties to the earlier trace). It
// answers those per-trace values too, by trace index (what fit puts in place before a trace's calls).
func (m *model) stateBase(tools []*stateTool) (map[string]any, map[int]map[string]any) {
	perTrace := map[int]map[string]any{}
	type vote struct {
		v     any
		n     int
		first int
	}
	votes := map[string][]*vote{}
	var obs []*stateObs
	for _, st := range tools {
		for _, o := range st.obs {
			obs = append(obs, o)
		}
	}
	sort.SliceStable(obs, func(i, j int) bool {
		if obs[i].trace != obs[j].trace {
			return obs[i].trace < obs[j].trace
		}
		return obs[i].c.idx < obs[j].c.idx
	})
	byTool := map[*call]*stateTool{}
	for _, st := range tools {
		for _, o := range st.obs {
			byTool[o.c] = st
		}
	}
	decided := map[string]bool{} // per trace: variables whose value before the trace's writes is known or lost
	lastTrace := -1
	for _, o := range obs {
		if o.trace != lastTrace {
			clear(decided)
			lastTrace = o.trace
		}
		st := byTool[o.c]
		rules := st.rules[o.shape]
		if rules == nil {
			continue
		}
		for i, f := range o.fields.Keys {
			r := rules[f]
			if r == nil || (!st.shows[f] && !st.sets[f]) {
				continue
			}
			key, ok := st.refOf(f).keyWith(o.c.args, o.get)
			if !ok || decided[key] {
				continue
			}
			decided[key] = true
			before, ok := invert(r.e, o.fields.Vals[i], o.c.args, st.shows[f])
			if !ok {
				continue
			}
			if perTrace[o.trace] == nil {
				perTrace[o.trace] = map[string]any{}
			}
			perTrace[o.trace][key] = before
			found := false
			for _, vt := range votes[key] {
				if jsonvalue.Equal(vt.v, before) {
					vt.n++
					found = true
					break
				}
			}
			if !found {
				votes[key] = append(votes[key], &vote{v: before, n: 1, first: o.trace})
			}
		}
	}
	base := map[string]any{}
	for key, vs := range votes {
		best := vs[0]
		for _, vt := range vs[1:] {
			if vt.n > best.n || vt.n == best.n && vt.first < best.first {
				best = vt
			}
		}
		base[key] = best.v
	}
	return base, perTrace
}

// invert answers a variable's value before a call from the field's value after it: a read's own value, a write
// undone by its rule; false when the rule loses it (a constant or argument set).
func invert(e sexpr, after any, args *jsonvalue.Object, shows bool) (any, bool) {
	if shows {
		return after, true
	}
	switch x := e.(type) {
	case addS:
		n, ok := after.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		d := x.step
		if x.name != "" {
			a, ok := args.Get(x.name)
			an, isNum := a.(jsonvalue.Number)
			if !ok || !isNum {
				return nil, false
			}
			d = an.Float64()
		}
		r := n.Float64() - x.sign*d
		if x.name == "" && !n.IsFloat() && r == math.Trunc(r) {
			return jsonvalue.Number(strconv.FormatFloat(r, 'f', -1, 64)), true
		}
		return floatNumber(r), true
	case notS:
		b, ok := after.(bool)
		return !b, ok
	case flipS:
		switch {
		case jsonvalue.Equal(after, x.a):
			return x.b, true
		case jsonvalue.Equal(after, x.b):
			return x.a, true
		}
	case listS:
		l, ok := after.([]any)
		a, ok2 := args.Get(x.name)
		if ok && ok2 && !x.remove && len(l) > 0 && jsonvalue.Equal(l[len(l)-1], a) {
			return append([]any{}, l[:len(l)-1]...), true
		}
	}
	return nil, false
}

// textTemplate answers the literal pieces the text answers share, with a hole between each two where they differ
// (a run of tokens), or nil when they do not align token by token or never differ.
func textTemplate(succ []*call) []string {
	toks := make([][]string, len(succ))
	for i, c := range succ {
		toks[i] = textTokens(c.text)
		if len(toks[i]) != len(toks[0]) {
			return nil
		}
	}
	n := len(toks[0])
	varies := make([]bool, n)
	any := false
	for j := 0; j < n; j++ {
		for i := 1; i < len(toks); i++ {
			if toks[i][j] != toks[0][j] {
				varies[j], any = true, true
				break
			}
		}
	}
	if !any {
		return nil
	}
	var lits []string
	var cur strings.Builder
	for j := 0; j < n; j++ {
		if !varies[j] {
			cur.WriteString(toks[0][j])
			continue
		}
		if j > 0 && varies[j-1] {
			continue // one hole runs over adjacent differing tokens
		}
		lits = append(lits, cur.String())
		cur.Reset()
	}
	lits = append(lits, cur.String())
	for i, l := range lits[1 : len(lits)-1] {
		if l == "" {
			_ = i
			return nil // two holes with nothing between: their split is not known
		}
	}
	return lits
}

// textTokens splits a text into words (letters, digits, and the dots, dashes and underscores inside them) and
// single other characters.
func textTokens(s string) []string {
	var out []string
	word := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
	}
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && (word(s[j]) || (s[j] == '.' || s[j] == '-' || s[j] == '_') && j > i && j+1 < len(s) && word(s[j+1])) {
			j++
		}
		if j == i {
			j = i + 1
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

// fillerWords are words between a name and its value in text ("Mobile Data is now ON").
var fillerWords = set("is", "are", "was", "were", "now", "the", "a", "an", "to", "set", "has", "been", "currently", "be", "at", "of")

// holeName names text hole i by the last words before it on its line, filler words left out ("Mobile Data is now
// ON" and "Mobile Data: OFF" both name "mobile data"): a tool showing that value and a tool setting it say so in
// the same words. "#i" when no word comes before it.
func holeName(lits []string, i int) string {
	before := lits[i]
	if k := strings.LastIndexByte(before, '\n'); k >= 0 {
		before = before[k+1:]
	}
	var words []string
	for _, w := range twin.LetterWords(before) {
		if !fillerWords[w] {
			words = append(words, w)
		}
	}
	if len(words) > 2 {
		words = words[len(words)-2:]
	}
	if len(words) == 0 {
		return "#" + strconv.Itoa(i)
	}
	return strings.Join(words, " ")
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
