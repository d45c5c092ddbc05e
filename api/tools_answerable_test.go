package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin"
)

// TestToolListingLeavesOutWhatNothingAnswers: without a model, a tool with no handler and no recording cannot be
// answered, so the provider formats leave it out and its native entry says why (issue 13 defect 2: it was listed
// and every call answered 404 "no simulator configured"). With a model, every tool is listed.
func TestToolListingLeavesOutWhatNothingAnswers(t *testing.T) {
	b := &twin.Bundle{
		Tools: []twin.Tool{
			{Name: "get_order", Binding: twin.BindingSynthesized, Rung: twin.RungTwin, Source: "def get_order(args):\n    return 1\n"},
			{Name: "calculate", Binding: twin.BindingSimulated, Rung: twin.RungSimulate},
			{Name: "think", Binding: twin.BindingSimulated, Rung: twin.RungSimulate},
		},
		Recordings: []twin.Recording{{Tool: "calculate", Args: `{"expression":"1+1"}`}},
		Answers:    []string{"2.0"},
	}
	build := &schema.Build{ID: "bld_1"}
	names := func(list api.ToolList) string {
		data, _ := json.Marshal(list)
		var entries []struct {
			Name     string
			Function struct{ Name string }
		}
		_ = json.Unmarshal(data, &entries)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name+e.Function.Name)
		}
		return strings.Join(out, ",")
	}
	for _, format := range []string{api.FormatOpenAI, api.FormatAnthropic} {
		list, err := api.ToolEntries(b, build, format, false)
		if err != nil || names(list) != "calculate,get_order" {
			t.Fatalf("%s without a model: %s, %v; want calculate,get_order", format, names(list), err)
		}
		list, err = api.ToolEntries(b, build, format, true)
		if err != nil || names(list) != "calculate,get_order,think" {
			t.Fatalf("%s with a model: %s, %v", format, names(list), err)
		}
	}
	list, err := api.ToolEntries(b, build, api.FormatNative, false)
	if err != nil || len(list) != 3 {
		t.Fatalf("native: %d entries, %v", len(list), err)
	}
	think := list[2].(api.NativeTool)
	if think.Name != "think" || think.Answerable || len(think.Attention) != 1 || !strings.Contains(think.Attention[0], "Nothing can answer") {
		t.Fatalf("native think = %+v", think)
	}
	if calc := list[0].(api.NativeTool); !calc.Answerable || len(calc.Attention) != 0 {
		t.Fatalf("native calculate = %+v", calc)
	}
}

// TestToolListingKeepsDefinedTools: a tool with an uploaded definition that no trace called is answered by inference
// from the recorded tool most like it (B_inferred, downgraded), so it is listed in every format, without a model.
func TestToolListingKeepsDefinedTools(t *testing.T) {
	b := &twin.Bundle{
		Tools: []twin.Tool{
			{Name: "get_speed", Binding: twin.BindingSimulated, Rung: twin.RungSimulate, Defined: true},
			{Name: "get_fuel", Binding: twin.BindingSimulated, Rung: twin.RungReplay},
		},
		Recordings: []twin.Recording{{Tool: "get_fuel", Args: `{}`}},
		Answers:    []string{`{"fuel": 1}`},
	}
	list, err := api.ToolEntries(b, &schema.Build{ID: "bld_1"}, api.FormatOpenAI, false)
	if err != nil || len(list) != 2 {
		t.Fatalf("openai without a model: %d entries, %v; want the defined tool listed too", len(list), err)
	}
	native, err := api.ToolEntries(b, &schema.Build{ID: "bld_1"}, api.FormatNative, false)
	if err != nil {
		t.Fatal(err)
	}
	if speed := native[1].(api.NativeTool); speed.Name != "get_speed" || !speed.Answerable {
		t.Fatalf("native get_speed = %+v", speed)
	}
}
