// Package query is the hosted query (envs.query, queries.get): the agent the traces show, run once against a fresh
// seeded world. It holds the service the transports call, the query's types, and the agent's ranking and seeding;
// the query's Temporal workflow and activities are in query/flow, its rows in store. See docs/architecture-query.md.
package query

import (
	"time"

	"github.com/doppel-dev/doppel/schema"
)

// Defaults of a query's bounds.
const (
	DefaultMaxSteps = 30
	DefaultDeadline = 5 * time.Minute
)

// Query modes.
const (
	// ModeModel runs the agent on a model: model → tool calls → twin → model … until it answers.
	ModeModel = "model"
	// ModeReplay replays the closest recorded run's tool calls against the seeded world and answers its recorded
	// final answer: no model runs.
	ModeReplay = "replay"
)

// ReplayModel is the model name that asks for replay mode.
const ReplayModel = "replay"

// Kinds of a failed query: the types of the workflow's application errors, recorded on its row. All are final.
const (
	// KindInvalid: the query's input cannot run (the field it names, e.g. body.seed_instructions, is in Failure.Field).
	KindInvalid = "QueryInvalid"
	// KindNotFound: the environment or its build is gone.
	KindNotFound = "QueryNotFound"
	// KindModelUnavailable: the model endpoint is down, unreachable, timing out or answering 5xx after retries.
	KindModelUnavailable = "ModelUnavailable"
	// KindModelFailed: the model endpoint refused the request (4xx: unknown model, bad key) or gave no usable answer.
	KindModelFailed = "ModelFailed"
	// KindSessionSpec: the twin refused the session's spec (activities.ErrTypeSessionSpec, as a session open reports
	// it; query/flow's tests check the two agree).
	KindSessionSpec = "SessionSpec"
)

// Input is one query as its workflow runs it: its id (its row already written), who asked, the environment, the
// user's input and the world's seed (drawn when the request gave none), and its bounds.
type Input struct {
	QueryID     string
	WorkspaceID string
	KeyID       string
	EnvID       string
	EnvSlug     string
	// BuildID is the environment's active build when the query was asked, its search attribute (the run takes the
	// build active when it prepares).
	BuildID          string `json:",omitempty"`
	Input            string
	SeedInstructions string
	AutoSeed         bool
	Seed             int64
	Model            string
	// MaxSteps bounds model turns (model mode) or replayed calls (replay mode); Deadline bounds the run.
	MaxSteps int
	Deadline time.Duration
	// TwinWait bounds the session open's wait for a cold twin (0: the session open's default).
	TwinWait time.Duration `json:",omitempty"`
}

// Span is one step of a query's trace (spec §2.2): kind tool (a tool call: label the tool, detail its JSON
// arguments) or ok (label "final answer"), dur its time as text. The rest says how the call was answered.
type Span struct {
	Kind       string `json:"kind"`
	Label      string `json:"label"`
	Dur        string `json:"dur"`
	Detail     string `json:"detail"`
	Result     string `json:"result,omitempty"`
	Error      bool   `json:"error,omitempty"`
	Fidelity   string `json:"fidelity,omitempty"`
	Rung       string `json:"rung,omitempty"`
	Downgraded bool   `json:"downgraded,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
}

// FidelityCount counts a query's tool spans by fidelity: high are answers from code or the world model or a
// recording of the same call (A_executed, B_twin, B_replayed); low are adapted or imagined answers (B_inferred,
// B_simulated) and calls the twin could not run.
type FidelityCount struct {
	High int `json:"high"`
	Low  int `json:"low"`
}

// HighFidelity says which fidelity labels a query counts as high: answers from code run against the world
// (A_executed), from the world model (B_twin) and recorded answers to the same call (B_replayed). B_inferred
// (the nearest recording adapted) and B_simulated (a model imagined it) are low, as is a call nothing answered.
func HighFidelity(f string) bool {
	switch f {
	case schema.FidelityAExecuted, schema.FidelityBTwin, schema.FidelityBReplayed:
		return true
	}
	return false
}

// Usage is what the model cost: requests and tokens as the endpoint reported them.
type Usage struct {
	ModelCalls       int64 `json:"model_calls"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// Result is a finished query (spec §2.2, plus how it ran), as its row keeps it.
type Result struct {
	ID               string              `json:"id"`
	Response         string              `json:"response"`
	Trace            []Span              `json:"trace"`
	NSpans           int                 `json:"n_spans"`
	Fidelity         FidelityCount       `json:"fidelity"`
	Seed             int64               `json:"seed"`
	Seeded           bool                `json:"seeded"`
	WorldHash        string              `json:"world_hash"`
	Pinned           map[string][]string `json:"pinned"`
	SeedInstructions string              `json:"seed_instructions"`
	SeedNote         *string             `json:"seed_note"`
	Mode             string              `json:"mode"`
	Model            string              `json:"model"`
	ReplayedTrace    string              `json:"replayed_trace,omitempty"`
	ReplayScore      float64             `json:"replay_score,omitempty"`
	Steps            int                 `json:"steps"`
	Stopped          string              `json:"stopped"`
	SessionID        string              `json:"session_id"`
	BuildID          string              `json:"build_id"`
	Usage            Usage               `json:"usage"`
}

// Failure is why a query's run failed, as its runner reports it: the kind of its error (one of the Kind
// constants, or another type the workflow failed with), the field it names, its message, and whether the run
// timed out.
type Failure struct {
	Kind    string
	Field   string
	Message string
	Timeout bool
}

func (f *Failure) Error() string { return f.Message }
