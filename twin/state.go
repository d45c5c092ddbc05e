package twin

import (
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// State beyond rows. Tools whose answers are no entity's row — a vehicle's fuel level, a phone's data switch, a
// watch list, the current directory, a file's content by its name — read and write variables the build learned
// from the recordings (infer/state.go): which variable each answer field (or each hole of a text answer) shows,
// and how a write sets, flips or adds to it. The variables are rows of one more table of the world (the bundle's
// StateTable, "state" unless an entity took that name), keyed by the variable's name (a variable keyed by an
// argument, as a file's content by its name, is "name[key]"), each row {"value": v}: so they are part of the world
// hash, the diff and sessions.assert like any row, and the base world holds each variable's value as each trace
// first showed it (the majority over traces). Synthesized handlers read and write them through world.get and
// world.put.

// DefaultStateTable is the name the build gives the state table unless an entity table has it.
const DefaultStateTable = "state"

// ToolState is how a tool's answers show state: the answer fields (or text holes) that read a variable as it
// is before the call. A session opened from a trace takes the values its reads showed from them.
type ToolState struct {
	Shows []StateField `json:"shows,omitempty"`
	// Sets are the answer fields that show a variable as the call left it (a write's).
	Sets []StateField `json:"sets,omitempty"`
	// Reads are the variables the tool's handler reads (Field empty).
	Reads []StateField `json:"reads,omitempty"`
	// Effects are what a call sets that its answer does not show (a login's user), learned from later reads.
	Effects []StateEffect `json:"effects,omitempty"`
	// Text, for a tool answering text, is its template: literal pieces with a hole between each two (the fields
	// "#0", "#1", … of Shows).
	Text []string `json:"text,omitempty"`
}

// StateField says answer field Field (a top-level key of a JSON object answer, or "#i" for the i-th hole of a text
// answer) shows variable Var, keyed by argument KeyArg's value when KeyArg is set, or by variable KeyVar's value
// (a directory's entries by the current directory) when KeyVar is.
type StateField struct {
	Field  string `json:"field"`
	Var    string `json:"var"`
	KeyArg string `json:"key_arg,omitempty"`
	KeyVar string `json:"key_var,omitempty"`
}

// StateEffect says a call sets variable Var (keyed by its argument KeyArg's value when KeyArg is set) to its
// argument From's value.
type StateEffect struct {
	Var    string `json:"var"`
	KeyArg string `json:"key_arg,omitempty"`
	From   string `json:"from"`
}

// StateKey is the row key of variable name keyed by key ("" for a variable that is not keyed).
func StateKey(name, key string) string {
	if key == "" {
		return name
	}
	return name + "[" + key + "]"
}

// StateKeyText is the text a key argument's value names a keyed variable by (strings as they are, numbers as
// spelled, anything else its canonical JSON): what pystr gives in a handler for strings and integers.
func StateKeyText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case jsonvalue.Number:
		return string(x)
	}
	return jsonvalue.CanonicalText(v)
}

// StateRow is the row holding a variable's value.
func StateRow(v any) *jsonvalue.Object {
	o := jsonvalue.NewObject(1)
	o.Set("value", v)
	return o
}

// TextHoles splits a text answer by its template's literal pieces: the holes' texts, or false when the text does
// not fit the template.
func TextHoles(text string, lits []string) ([]string, bool) {
	if len(lits) == 0 {
		return nil, false
	}
	if !strings.HasPrefix(text, lits[0]) {
		return nil, false
	}
	rest := text[len(lits[0]):]
	holes := make([]string, 0, len(lits)-1)
	for _, lit := range lits[1:] {
		var i int
		if lit == "" {
			i = len(rest) // the last hole runs to the end
		} else if i = strings.Index(rest, lit); i < 0 {
			return nil, false
		}
		holes = append(holes, rest[:i])
		rest = rest[i+len(lit):]
	}
	if rest != "" {
		return nil, false
	}
	return holes, true
}

// stateFields answers the fields a state tool's answer holds: a JSON object's, or a text answer's holes ("#i").
func stateFields(st *ToolState, answer string) (map[string]any, bool) {
	vals := map[string]any{}
	if len(st.Text) > 0 {
		holes, ok := TextHoles(answer, st.Text)
		if !ok {
			return nil, false
		}
		for i, h := range holes {
			vals["#"+strconv.Itoa(i)] = h
		}
		return vals, true
	}
	v, err := jsonvalue.ParseString(answer)
	if err != nil {
		return nil, false
	}
	o, ok := v.(*jsonvalue.Object)
	if !ok {
		return nil, false
	}
	for i, k := range o.Keys {
		vals[k] = o.Vals[i]
	}
	return vals, true
}

// stateOf answers the row key of variable f as a call with args names it in s's world.
func (s *Session) stateOf(f StateField, args *jsonvalue.Object) (string, bool) {
	var kv any
	var ok bool
	switch {
	case f.KeyArg != "":
		kv, ok = args.Get(f.KeyArg)
	case f.KeyVar != "":
		var row *jsonvalue.Object
		if row, ok = s.row(s.rt.b.StateTable, f.KeyVar); ok {
			kv, ok = row.Get("value")
		}
	default:
		return f.Var, true
	}
	if !ok {
		return "", false
	}
	return StateKey(f.Var, StateKeyText(kv)), true
}

// adoptState makes the session's variables what an answer no handler gave says (a recording replayed or inferred
// for a state tool): the variables a write's answer sets, and those a read shows that the session has not shown or
// set before (the base world's values are a guess it now replaces), so later answers agree with it.
func (s *Session) adoptState(t *rtTool, args *jsonvalue.Object, answer string) bool {
	st := t.def.State
	table := s.rt.b.StateTable
	if st == nil || table == "" || s.rt.tables[table] == nil {
		return false
	}
	changed := false
	for _, e := range st.Effects {
		v, ok := args.Get(e.From)
		key, ok2 := s.stateOf(StateField{Var: e.Var, KeyArg: e.KeyArg}, args)
		if ok && ok2 {
			s.put(table, key, StateRow(v))
			changed = true
		}
	}
	vals, ok := stateFields(st, answer)
	if !ok {
		return changed
	}
	for gi, group := range [][]StateField{st.Sets, st.Shows} {
		shows := gi == 1
		for _, f := range group {
			v, ok := vals[f.Field]
			key, ok2 := s.stateOf(f, args)
			if !ok || !ok2 {
				continue
			}
			if old, held := s.over[table][key]; held && old != nil {
				if ov, _ := old.Get("value"); shows || jsonvalue.Equal(ov, v) {
					continue // a read does not overrule what the session knows; a write that changes nothing changes nothing
				}
			}
			s.put(table, key, StateRow(v))
			changed = true
		}
	}
	return changed
}

// observeState lays the variables a read's answer shows over the session's world (the first sighting wins).
func (s *Session) observeState(t *rtTool, args *jsonvalue.Object, answer string, seen map[tableKey]bool) {
	st := t.def.State
	table := s.rt.b.StateTable
	if st == nil || len(st.Shows) == 0 || table == "" || s.rt.tables[table] == nil {
		return
	}
	vals, ok := stateFields(st, answer)
	if !ok {
		return
	}
	for _, f := range st.Shows {
		v, ok := vals[f.Field]
		if !ok {
			continue
		}
		key, ok := s.stateOf(f, args)
		if !ok {
			continue
		}
		tk := tableKey{table, key}
		if seen[tk] {
			continue
		}
		seen[tk] = true
		s.put(table, tk.key, StateRow(v))
	}
}

// StateValue answers a state variable's value in the session's world (key as StateKey spells it).
func (s *Session) StateValue(key string) (any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	row, ok := s.row(s.rt.b.StateTable, key)
	if !ok {
		return nil, false
	}
	return row.Get("value")
}

// stateUnseen tells a call whose handler reads a variable this session has never shown or set: the world holds
// only the base value the build took from most recorded worlds.
func (s *Session) stateUnseen(t *rtTool, args *jsonvalue.Object) bool {
	st := t.def.State
	table := s.rt.b.StateTable
	if st == nil || len(st.Reads) == 0 || table == "" {
		return false
	}
	for _, f := range st.Reads {
		if f.KeyArg != "" || f.KeyVar != "" {
			continue // a keyed variable's base value is its key's own, as specific as a recording of these arguments
		}
		key, ok := s.stateOf(f, args)
		if !ok {
			continue
		}
		if _, held := s.over[table][key]; !held {
			return true
		}
	}
	return false
}
