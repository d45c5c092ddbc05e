package trace

import (
	"reflect"
	"testing"
)

// RawCalls pairs the calls and answers as Calls does, leaving only Args undecoded.
func TestRawCallsAreCallsWithoutArgs(t *testing.T) {
	s := func(v string) *string { return &v }
	tr := Trace{ID: "t1", Messages: []Message{
		{Role: RoleUser, Content: s("find my order")},
		{Role: RoleAssistant, ToolCalls: []ToolCall{
			{ID: "a", Function: Function{Name: "find", Arguments: `{"q": 1.50}`}},
			{ID: "b", Function: Function{Name: "noop", Arguments: `not json`}},
		}},
		{Role: RoleTool, ToolCallID: "a", Content: s(`{"id": "W1"}`)},
		{Role: RoleTool, ToolCallID: "zz", Content: s("to nobody")},
	}}
	calls, raw := Calls(tr), RawCalls(tr)
	if len(calls) != 2 || calls[0].Args == nil || calls[1].Args != nil || !calls[0].Answered || calls[1].Answered {
		t.Fatalf("Calls = %+v", calls)
	}
	for i := range calls {
		if raw[i].Args != nil {
			t.Errorf("RawCalls[%d].Args = %v, want nil", i, raw[i].Args)
		}
		raw[i].Args = calls[i].Args
	}
	if !reflect.DeepEqual(raw, calls) {
		t.Errorf("RawCalls = %+v\nCalls    = %+v", raw, calls)
	}
}
