package flow

import (
	"time"

	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
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

// FinishQueryInput records how a query ended: its result, or its error and the error's type.
type FinishQueryInput struct {
	QueryID   string
	SessionID string
	Result    *query.Result
	Error     string
	ErrorKind string
	Usage     query.Usage
}
