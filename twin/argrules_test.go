package twin_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// recordedArgs answers, per tool, the arguments of its first recorded call in the sample's traces.
func recordedArgs(t *testing.T, name string) map[string]*jsonvalue.Object {
	_, traces := sample(t, name)
	out := map[string]*jsonvalue.Object{}
	for _, tr := range traces {
		for _, c := range twin.TraceCallsOf(tr) {
			if _, ok := out[c.Tool]; ok {
				continue
			}
			v, err := jsonvalue.Parse(c.Args)
			if err != nil {
				t.Fatal(err)
			}
			out[c.Tool] = v.(*jsonvalue.Object)
		}
	}
	return out
}

// refused calls tool with args in a fresh session and checks it is the tool's own error, refused by its argument
// rules, the state hash unchanged.
func refused(t *testing.T, rt *twin.Runtime, sample, tool string, args *jsonvalue.Object, why string) {
	t.Helper()
	s, rc, err := rt.Open(twin.SessionSpec{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Call(context.Background(), tool, json.RawMessage(jsonvalue.CanonicalText(args)))
	if err != nil {
		t.Fatalf("%s %s(%s): %v", sample, tool, jsonvalue.CanonicalText(args), err)
	}
	if !res.Error || res.Note != twin.ArgsRefusedNote || !strings.Contains(res.Content, why) || res.StateHash != rc.WorldHash || s.StateHash() != rc.WorldHash {
		t.Errorf("%s %s(%s): %+v; want the tool's error about %q, the state hash unchanged (%s)", sample, tool,
			jsonvalue.CanonicalText(args), res, why, rc.WorldHash)
	}
}

func without(args *jsonvalue.Object, name string) *jsonvalue.Object {
	out := jsonvalue.NewObject(args.Len())
	for i, k := range args.Keys {
		if k != name {
			out.Set(k, args.Vals[i])
		}
	}
	return out
}

// TestArgRulesOnEverySampleTool: on every tool of the three dev samples that requires an argument, a call missing
// it is refused with the tool's own error and changes nothing; so is a call with an argument the tool does not take,
// and one whose argument has the wrong type, on every tool whose rules close its names or check its types. The tau
// samples are built without their tool definitions (the rules come from the recordings, for tools with at least 3
// recorded calls) and with them (every tool's definition states its rules), BFCL with them. A tool no trace calls
// is called with arguments made from its definition.
func TestArgRulesOnEverySampleTool(t *testing.T) {
	for _, name := range []string{"retail", "airline", "retail+defs", "airline+defs", "bfcl"} {
		rt, _ := sample(t, name)
		args := recordedArgs(t, name)
		required, closed, typed, tools := 0, 0, 0, 0
		for _, tool := range rt.Bundle().Tools {
			r := tool.Args
			a, called := args[tool.Name]
			if !called {
				a = argsFromSchema(t, tool.InputSchema)
			}
			tools++
			if tool.Defined && definedRequired(t, tool.InputSchema) && (r == nil || len(r.Required) == 0) {
				t.Errorf("%s %s: its definition requires arguments, its rules %+v do not", name, tool.Name, r)
			}
			if r == nil {
				continue
			}
			if len(r.Required) > 0 {
				required++
				refused(t, rt, name, tool.Name, without(a, r.Required[0]), "missing required argument "+r.Required[0])
			}
			if r.Closed {
				closed++
				extra := jsonvalue.Clone(a).(*jsonvalue.Object)
				extra.Set("not_an_argument_of_"+tool.Name, "x")
				refused(t, rt, name, tool.Name, extra, "unexpected argument")
			}
			if r.Types && a.Len() > 0 {
				typed++
				bad := jsonvalue.Clone(a).(*jsonvalue.Object)
				if _, isObj := bad.Vals[0].(*jsonvalue.Object); isObj {
					bad.Vals[0] = "not an object"
				} else {
					bad.Vals[0] = jsonvalue.NewObject(0)
				}
				refused(t, rt, name, tool.Name, bad, bad.Keys[0]+": want")
			}
		}
		t.Logf("%s: of %d tools, %d refuse a missing argument, %d an unknown one, %d a wrong type", name, tools, required, closed, typed)
		if required == 0 {
			t.Errorf("%s: no tool has a required argument", name)
		}
	}
}

// definedRequired tells whether an input schema requires an argument.
func definedRequired(t *testing.T, schema json.RawMessage) bool {
	var sc struct {
		Required []string `json:"required"`
	}
	if err := json.Unmarshal(schema, &sc); err != nil {
		t.Fatal(err)
	}
	return len(sc.Required) > 0
}

// argsFromSchema makes arguments of the right types for every property of an input schema.
func argsFromSchema(t *testing.T, schema json.RawMessage) *jsonvalue.Object {
	var sc struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(schema, &sc); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(sc.Properties))
	for k := range sc.Properties {
		names = append(names, k)
	}
	sort.Strings(names)
	args := jsonvalue.NewObject(len(names))
	for _, k := range names {
		typ, _ := sc.Properties[k].Type.(string)
		switch typ {
		case "integer", "number":
			args.Set(k, jsonvalue.Number("1"))
		case "boolean":
			args.Set(k, true)
		case "array":
			args.Set(k, []any{})
		case "object":
			args.Set(k, jsonvalue.NewObject(0))
		default:
			args.Set(k, "x")
		}
	}
	return args
}

// TestArgRulesIssueExamples: get_user_details with no arguments or a misspelt one is refused (before, it answered
// a made-up user), and modify_user_address with only the user id changes nothing (before, it wrote nulls).
func TestArgRulesIssueExamples(t *testing.T) {
	rt, _ := sample(t, "retail")
	refused(t, rt, "retail", "get_user_details", jsonvalue.NewObject(0), "missing required argument user_id")
	misspelt := jsonvalue.NewObject(1)
	misspelt.Set("userid", "yusuf_rossi_9620")
	refused(t, rt, "retail", "get_user_details", misspelt, "missing required argument user_id")
	only := jsonvalue.NewObject(1)
	only.Set("user_id", "yusuf_rossi_9620")
	refused(t, rt, "retail", "modify_user_address", only, "missing required argument")
}

// TestDefinedToolsNeverCalled: BFCL's definitions name tools no trace calls; each answers, inferred from the recorded
// tool most like it (B_inferred, downgraded), and changes nothing.
func TestDefinedToolsNeverCalled(t *testing.T) {
	rt, _ := sample(t, "bfcl")
	n := 0
	for _, tool := range rt.Bundle().Tools {
		if tool.Scores.Calls > 0 || !tool.Defined {
			continue
		}
		n++
		s, rc, err := rt.Open(twin.SessionSpec{})
		if err != nil {
			t.Fatal(err)
		}
		args := argsFromSchema(t, tool.InputSchema)
		res, err := s.Call(context.Background(), tool.Name, json.RawMessage(jsonvalue.CanonicalText(args)))
		if err != nil {
			t.Errorf("%s(%s): %v, want an inferred answer", tool.Name, jsonvalue.CanonicalText(args), err)
			continue
		}
		if res.Fidelity != twin.FidelityInferred || !res.Downgraded || res.StateHash != rc.WorldHash || res.Content == "" {
			t.Errorf("%s(%s): %+v; want B_inferred, downgraded, the world unchanged", tool.Name, jsonvalue.CanonicalText(args), res)
		}
	}
	if n < 50 {
		t.Errorf("%d defined tools never called, want BFCL's 53", n)
	}
}
