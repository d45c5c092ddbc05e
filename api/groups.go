package api

import (
	"encoding/json"
	"reflect"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
)

// OpenAnswer answers sessions.open: one open's answer, or with `n` an array of n of them.
type OpenAnswer struct {
	One  *OpenSessionBodyOut
	Many []OpenSessionBodyOut
}

// MarshalJSON writes the array when the open asked for a group.
func (a OpenAnswer) MarshalJSON() ([]byte, error) {
	if a.Many != nil {
		return json.Marshal(a.Many)
	}
	return json.Marshal(a.One)
}

// UnmarshalJSON reads either shape (for clients of this package).
func (a *OpenAnswer) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, &a.Many)
	}
	a.One = new(OpenSessionBodyOut)
	return json.Unmarshal(b, a.One)
}

// Schema documents the two shapes.
func (OpenAnswer) Schema(r huma.Registry) *huma.Schema {
	return groupSchema(r, reflect.TypeOf(OpenSessionBodyOut{}), "The open's answer; with `n`, an array of n such answers (one per session, in order).")
}

// ForkAnswer answers sessions.fork: one fork's answer, or with `n` an array of n of them.
type ForkAnswer struct {
	One  *ForkBodyOut
	Many []ForkBodyOut
}

// MarshalJSON writes the array when the fork asked for a group.
func (a ForkAnswer) MarshalJSON() ([]byte, error) {
	if a.Many != nil {
		return json.Marshal(a.Many)
	}
	return json.Marshal(a.One)
}

// UnmarshalJSON reads either shape (for clients of this package).
func (a *ForkAnswer) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, &a.Many)
	}
	a.One = new(ForkBodyOut)
	return json.Unmarshal(b, a.One)
}

// Schema documents the two shapes.
func (ForkAnswer) Schema(r huma.Registry) *huma.Schema {
	return groupSchema(r, reflect.TypeOf(ForkBodyOut{}), "The fork's answer; with `n`, an array of n such answers (one per fork, in order).")
}

func groupSchema(r huma.Registry, t reflect.Type, doc string) *huma.Schema {
	one := r.Schema(t, true, "")
	return &huma.Schema{Description: doc, OneOf: []*huma.Schema{one, {Type: huma.TypeArray, Items: one}}}
}

// openedOut is one opened session as the open's answer, with its MCP address mcpURL ("" for none).
func openedOut(o *toolplane.Opened, mcpURL string) OpenSessionBodyOut {
	s, rc := o.Session, o.Receipts
	return OpenSessionBodyOut{
		SessionToken: o.Token, SessionIDA: s.ID, Seed: s.Seed, WorldHash: rc.WorldHash,
		SessionID: s.ID, Token: o.Token, ExpiresAt: s.ExpiresAt, Pinned: rc.Pinned, MCPURLA: mcpURL, MCPURL: mcpURL,
		Receipts: SessionReceipts{Seeded: rc.Seeded, Seed: rc.Seed, Scenario: rc.Scenario, WorldHash: rc.WorldHash, Note: rc.Note,
			Clock: rc.Clock, World: rc.World, Trace: traceReceipt(rc.Trace)},
	}
}

// forkedOut is one fork as the fork's answer, with its MCP address mcpURL ("" for none).
func forkedOut(o *toolplane.Opened, mcpURL string) ForkBodyOut {
	s := o.Session
	out := ForkBodyOut{OpenSessionBodyOut: openedOut(o, mcpURL), ForkedFrom: ForkedFrom{SessionID: s.ForkedFrom, AtCall: s.ForkedAt},
		StateHash: s.StateHash}
	out.WorldHash, out.Receipts.WorldHash = s.WorldHash, s.WorldHash
	return out
}

// EpisodeTask is sessions.open's task: what the episode is graded on and when it ends.
type EpisodeTask struct {
	Expect   []Expectation `json:"expect" minItems:"1" maxItems:"10000" doc:"The end-state expectations the reward grades (sessions.assert's language), against the opening world."`
	MaxSteps int64         `json:"max_steps,omitempty" minimum:"0" maximum:"1000000" doc:"The episode is done after this many calls (0 or omitted: no limit)."`
	Reward   string        `json:"reward,omitempty" enum:"fraction,all" doc:"fraction (default): the share of expectations that pass; all: 1 when every one passes, else 0."`
}

func (t *EpisodeTask) task() *toolplane.Task {
	if t == nil {
		return nil
	}
	return &toolplane.Task{Expect: expectations(t.Expect), MaxSteps: t.MaxSteps, Reward: t.Reward}
}

// expectations are API expectations as the twin's.
func expectations(in []Expectation) []twin.Expectation {
	out := make([]twin.Expectation, len(in))
	for i, e := range in {
		out[i] = twin.Expectation{Entity: e.Entity, Key: e.Key, Field: e.Field, Equals: e.Equals, Exists: e.Exists,
			Unchanged: e.Unchanged, Changed: e.Changed, Except: e.Except, StateHash: e.StateHash}
	}
	return out
}

// verdicts are an episode's outcomes as sessions.assert answers them, with the expectations of the session's task.
func verdicts(s *schema.Session, outcomes []twin.Outcome) []AssertResult {
	var ep toolplane.Episode
	if s != nil {
		_ = json.Unmarshal(s.Episode, &ep)
	}
	out := make([]AssertResult, len(outcomes))
	for i, o := range outcomes {
		out[i] = AssertResult{Index: i, Pass: o.Pass, Observed: o.Observed, Baseline: o.Baseline, Detail: o.Detail}
		if i < len(ep.Expect) {
			out[i].Expectation = expectationOut(ep.Expect[i])
		}
	}
	return out
}

// EpisodeView is an episode's task as a session read shows it.
type EpisodeView struct {
	Expect        []Expectation `json:"expect"`
	MaxSteps      int64         `json:"max_steps" doc:"0: no limit."`
	TerminalTools []string      `json:"terminal_tools" doc:"The build config's terminal tools at open."`
	Reward        string        `json:"reward" enum:"fraction,all"`
}
