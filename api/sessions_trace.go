package api

import (
	"encoding/json"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/twin"
)

// SessionTrace is the trace a session opens from, as sessions.open takes it: the id of a trace the environment holds
// (a string), or a trace in the collect format (an object: id, model, messages), whole or a prefix. Kept byte for
// byte; the tool plane reads it (toolplane.ParseTraceParam).
type SessionTrace json.RawMessage

// Schema documents SessionTrace as a string or a trace object.
func (SessionTrace) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{
		Description: "Open the world a recorded conversation saw, instead of seed instructions or a scenario: the id " +
			"of a trace the environment holds, or a trace in the collect format ({id, model, messages}: OpenAI chat " +
			"messages, tool calls and their answers), whole or a prefix. The world is the build's base world with " +
			"every entity row and state value the trace's calls before its first write showed laid over it; what " +
			"the trace did not show comes from the base world and the world policy. Receipts name the trace and " +
			"hash the calls used: the same trace gives the same world hash. A trace the environment holds is then " +
			"replayed call by call while the agent makes its calls.",
		OneOf: []*huma.Schema{
			{Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(500), Description: "The id of a trace the environment holds."},
			{Type: huma.TypeObject, AdditionalProperties: true, Required: []string{"messages"},
				Description: "A trace in the collect format (spec §2.7): id, model, messages.",
				Properties: map[string]*huma.Schema{
					"id":       {Type: huma.TypeString, Description: "The trace's id (named in the receipts)."},
					"model":    {Type: huma.TypeString},
					"messages": {Type: huma.TypeArray, Items: &huma.Schema{Type: huma.TypeObject, AdditionalProperties: true}, Description: "OpenAI-style chat messages."},
				}},
		},
	}
}

func ptr(n int) *int { return &n }

// UnmarshalJSON keeps the raw bytes.
func (t *SessionTrace) UnmarshalJSON(b []byte) error {
	*t = append((*t)[:0], b...)
	return nil
}

// MarshalJSON writes the raw bytes.
func (t SessionTrace) MarshalJSON() ([]byte, error) {
	if len(t) == 0 {
		return []byte("null"), nil
	}
	return t, nil
}

// TraceReceipt names the trace a session's world was opened from.
type TraceReceipt struct {
	ID         string `json:"id,omitempty" doc:"The trace's id (empty when the trace given had none)."`
	Hash       string `json:"hash" doc:"sha256: hash of the calls used (those before the trace's first write): the same calls give the same world."`
	Used       int    `json:"used" doc:"Calls used: the trace's answered calls before its first write, of tools the build knows."`
	Given      int    `json:"given" doc:"Answered calls the trace holds."`
	FirstWrite string `json:"firstWrite,omitempty" doc:"The tool whose call ended what was used (empty when the trace wrote nothing)."`
}

// traceReceipt answers the API's receipt of a twin's (nil when the session was not opened from a trace).
func traceReceipt(r *twin.TraceReceipt) *TraceReceipt {
	if r == nil {
		return nil
	}
	return &TraceReceipt{ID: r.ID, Hash: r.Hash, Used: r.Used, Given: r.Given, FirstWrite: r.FirstWrite}
}
