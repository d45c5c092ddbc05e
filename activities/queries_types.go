package activities

import (
	"encoding/json"
	"time"

	"github.com/doppel-dev/doppel/llm"
)

// Application error types of the query activities; all are non-retryable.
const (
	// ErrTypeQueryInvalid: the query's input cannot run (details: the field, e.g. body.seed_instructions).
	ErrTypeQueryInvalid = "QueryInvalid"
	// ErrTypeQueryNotFound: the environment or its build is gone.
	ErrTypeQueryNotFound = "QueryNotFound"
	// ErrTypeModelUnavailable: the model endpoint is down, unreachable, timing out or answering 5xx after retries.
	ErrTypeModelUnavailable = "ModelUnavailable"
	// ErrTypeModelFailed: the model endpoint refused the request (4xx: unknown model, bad key) or gave no usable
	// answer.
	ErrTypeModelFailed = "ModelFailed"
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

// PrepareQueryInput is what a query asks for, before it runs.
type PrepareQueryInput struct {
	EnvID            string
	Input            string
	SeedInstructions string
	AutoSeed         bool
	// Model is the request's model: "" (the environment's default), "replay", or a model id.
	Model string
}

// PreparedQuery is how the query will run: its mode and model, its effective seed instructions, and in replay
// mode the recorded run it replays.
type PreparedQuery struct {
	BuildID          string
	Mode             string
	Model            string
	SeedInstructions string
	// SeedDerived says SeedInstructions were derived from the input (auto_seed); DerivedBy names how.
	SeedDerived bool
	DerivedBy   string
	// SeedUsage is what asking the model for seed instructions cost (zero when it was not asked).
	SeedUsage QueryUsage
	Replay    *ReplayPlan `json:",omitempty"`
}

// ReplayPlan is the recorded run replay mode chose: its trace, its similarity to the input, its calls and
// final answer.
type ReplayPlan struct {
	TraceID string
	Score   float64
	Calls   []ReplayCall
	Answer  string
}

// ReplayCall is one recorded tool call.
type ReplayCall struct {
	Tool      string
	Arguments string
}

// QueryOpen opens a query's session on the tool plane, as sessions.open does.
type QueryOpen struct {
	WorkspaceID      string
	KeyID            string
	EnvSlug          string
	Seed             int64
	SeedInstructions string
}

// QueryOpened is the query's session and its seeding receipts.
type QueryOpened struct {
	SessionID        string
	BuildID          string
	Seeded           bool
	WorldHash        string
	Pinned           map[string][]string
	SeedInstructions string
	Note             *string
}

// QueryToolCall is one tool call of the agent in the query's session.
type QueryToolCall struct {
	SessionID string
	Tool      string
	Arguments string
}

// ToolAnswer is the twin's answer to a call, or, when Refused, why the tool plane could not run it (an unknown
// tool, arguments that are not an object): the agent sees that text as the tool's error.
type ToolAnswer struct {
	Content    string
	Error      bool
	Refused    bool
	Fidelity   string
	Rung       string
	Downgraded bool
	Ms         int64
	// Took is the call's time in the tool plane: the twin's answer and the journal's commit.
	Took time.Duration
}

// Conversation is a query's messages after the user's input: the model's turns and the tools' answers.
type Conversation []llm.ChatMessage

// WithTool is the conversation with the answer to the tool call id appended.
func (c Conversation) WithTool(id, content string) Conversation {
	return append(c, llm.ChatMessage{Role: "tool", ToolCallID: id, Content: content})
}

// ModelTurnInput is one model turn: the build whose agent profile and tools it runs with, the model, the user's
// input and the conversation after it.
type ModelTurnInput struct {
	BuildID  string
	Model    string
	Input    string
	Messages Conversation
	Seed     int64
}

// ModelTurnResult is the model's next message and what it cost.
type ModelTurnResult struct {
	Message llm.ChatMessage
	Model   string
	Usage   llm.Usage
	Ms      int64
	Took    time.Duration
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

// QueryUsage is what the model cost: requests and tokens as the endpoint reported them.
type QueryUsage struct {
	ModelCalls       int64 `json:"model_calls"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// QueryResult is a finished query (spec §2.2, plus how it ran).
type QueryResult struct {
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
	Usage            QueryUsage          `json:"usage"`
}

// FinishQueryInput records how a query ended: its result, or its error and the error's type.
type FinishQueryInput struct {
	QueryID   string
	SessionID string
	Result    *QueryResult
	Error     string
	ErrorKind string
	Usage     QueryUsage
}

// MarshalResult encodes a result for the queries row.
func MarshalResult(r *QueryResult) ([]byte, error) { return json.Marshal(r) }
