package twin

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// argsProblem says how arguments break the JSON types of the tool's input schema, "" when they do not (missing
// or unexpected fields are left to the tool's handler, which answers them as the recordings show). Production tools answer such calls with an error of their own, not a transport failure.
// parsed is raw as jsonvalue.Parse read it: when raw is JSON encoding/json reads the same way (valid to it, UTF-8,
// no escapes), the value Decode would give is built from parsed rather than decoded again.
func (t *rtTool) argsProblem(raw []byte, parsed *jsonvalue.Object) string {
	if t.schema == nil {
		return ""
	}
	var v any
	if parsed != nil && plainJSON(raw) {
		v = decodedForm(parsed)
	} else {
		var err error
		if v, err = jsonvalue.Decode(raw); err != nil {
			return err.Error()
		}
	}
	if err := t.schema.CheckTypes(v); err != nil {
		return schemaProblem(err)
	}
	return ""
}

// schemaProblem is a schema check's error as a problem naming the field ("qty: expected integer, got string").
func schemaProblem(err error) string {
	msg := err.Error()
	if loc, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(loc, "$") {
		if field := strings.TrimPrefix(strings.TrimPrefix(loc, "$"), "."); field != "" {
			return field + ": " + rest
		}
		return rest
	}
	return msg
}

// argsError is the twin's answer to arguments the tool's rules refuse (argrules.go): a tool error in the style of the
// tool's recorded errors, the world unchanged.
func (s *Session) argsError(t *rtTool, problem string) Result {
	return Result{Content: t.args.errStyle.text("invalid arguments: "+problem, s.rt.style), Error: true, Rung: RungTwin,
		Fidelity: FidelityOf(RungTwin), Note: ArgsRefusedNote, StateHash: s.currentHash()}
}

// plainJSON reports whether encoding/json reads raw exactly as jsonvalue.Parse does: valid JSON to it (no NaN, no
// trailing data), valid UTF-8 (which it would replace) and no backslash (escapes it might decode differently).
func plainJSON(raw []byte) bool {
	return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) && json.Valid(raw)
}

// decodedForm is a parsed value in the form jsonvalue.Decode gives: objects as maps (the last of a repeated key
// wins, as Parse keeps it), numbers as json.Number of their text.
func decodedForm(v any) any {
	switch x := v.(type) {
	case *jsonvalue.Object:
		m := make(map[string]any, len(x.Keys))
		for i, k := range x.Keys {
			m[k] = decodedForm(x.Vals[i])
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = decodedForm(e)
		}
		return out
	case jsonvalue.Number:
		return json.Number(x)
	}
	return v
}
