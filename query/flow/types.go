package flow

import (
	"time"

	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/toolplane"
)

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
	SeedUsage query.Usage
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

// FinishQueryInput records how a query ended: its result, or its error and the error's type. A query of the
// query-v1 change passes its result without the trace: the run record at RunKey holds the tool spans (none when
// RunKey is ""), to which Final, the final answer's span, is appended.
type FinishQueryInput struct {
	QueryID   string
	SessionID string
	Result    *query.Result
	Error     string
	ErrorKind string
	Usage     query.Usage
	RunKey    string      `json:",omitempty"`
	Final     *query.Span `json:",omitempty"`
}

// The steps below are those of queries that started with the query-v1 change: the session opened by a child
// session-open workflow, model turns as heartbeating activities, and the conversation and trace kept in the blob
// store (the run record), the workflow passing its key.

// RecordSessionInput records a query's session once a child workflow opened its world.
type RecordSessionInput struct {
	Pending toolplane.PendingOpen
	Opened  toolplane.OpenedWorld
}

// AgentTurnInput is one model turn: the query, the run record it continues ("" on the first turn, which then
// carries the user's Input), the build whose agent profile and tools it runs with, the model, the seed and the
// turn's number.
type AgentTurnInput struct {
	QueryID string
	BuildID string
	Model   string
	Seed    int64
	Step    int
	RunKey  string
	Input   string `json:",omitempty"`
}

// AgentTurnResult is the model's next move: the tool calls it asks for (none: it answered, and the run record
// holds the answer), the run record with its message, and what the turn cost.
type AgentTurnResult struct {
	RunKey string
	Calls  []llm.ToolCall
	Usage  llm.Usage
	Ms     int64
	Took   time.Duration
}

// RunToolInput is one tool call of the run in the query's session. CallID is the model's id of the call (""
// in replay mode, which keeps no conversation); the answer goes into the run record after RunKey.
type RunToolInput struct {
	QueryID   string
	SessionID string
	RunKey    string
	CallID    string `json:",omitempty"`
	Tool      string
	Arguments string
	Replayed  bool `json:",omitempty"`
}

// RunToolResult is what the workflow keeps of a call: the run record holding its answer, and its fidelity.
type RunToolResult struct {
	RunKey   string
	Fidelity string
}
