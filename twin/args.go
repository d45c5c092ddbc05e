package twin

import (
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// argsProblem says how arguments break the JSON types of the tool's input schema, "" when they do not (missing
// or unexpected fields are left to the tool's handler, which answers them as the recordings show). Production tools answer such calls with an error of their own, not a transport failure.
func (t *rtTool) argsProblem(raw []byte) string {
	if t.schema == nil {
		return ""
	}
	v, err := jsonvalue.Decode(raw)
	if err != nil {
		return err.Error()
	}
	if err := t.schema.CheckTypes(v); err != nil {
		msg := err.Error()
		if loc, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(loc, "$") {
			if field := strings.TrimPrefix(strings.TrimPrefix(loc, "$"), "."); field != "" {
				return field + ": " + rest
			}
			return rest
		}
		return msg
	}
	return ""
}

// argsError is the twin's answer to arguments that break the input schema: a tool error in the style of the
// tool's recorded errors (their prefix up to the first ": ", e.g. "Error: "), or "Error: " when none is recorded.
// The world is unchanged.
func (s *Session) argsError(t *rtTool, problem string) Result {
	prefix := "Error: "
	for _, r := range t.all {
		if r.isErr {
			if i := strings.Index(r.answer, ": "); i > 0 && i < 40 {
				prefix = r.answer[:i+2]
			}
			break
		}
	}
	return Result{Content: prefix + "invalid arguments: " + problem, Error: true, Rung: RungTwin,
		Fidelity: FidelityOf(RungTwin), Note: "the arguments break the tool's input schema", StateHash: s.currentHash()}
}
