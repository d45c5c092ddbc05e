// Package twin runs a bundle: the immutable base world, copy-on-write sessions, seeding, hashing and the rung ladder.
package twin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// FormatVersion is the bundle format this package writes and reads.
const FormatVersion = 1

// Bindings: who answers a tool.
const (
	BindingProvided    = "provided"
	BindingSynthesized = "synthesized"
	BindingSimulated   = "simulated"
)

// Rungs, in ladder order, and the fidelity label each gives an answer.
const (
	RungProvided = "provided"
	RungTwin     = "twin"
	RungReplay   = "replay"
	RungInfer    = "infer"
	RungSimulate = "simulate"
)

// Fidelity labels (spec §2.5).
const (
	FidelityExecuted  = "A_executed"
	FidelityTwin      = "B_twin"
	FidelityReplayed  = "B_replayed"
	FidelityInferred  = "B_inferred"
	FidelitySimulated = "B_simulated"
)

// Rungs lists the ladder in order.
func Rungs() []string {
	return []string{RungProvided, RungTwin, RungReplay, RungInfer, RungSimulate}
}

// FidelityOf names the fidelity of an answer from rung r.
func FidelityOf(r string) string {
	switch r {
	case RungProvided:
		return FidelityExecuted
	case RungTwin:
		return FidelityTwin
	case RungReplay:
		return FidelityReplayed
	case RungInfer:
		return FidelityInferred
	case RungSimulate:
		return FidelitySimulated
	}
	return ""
}

func rungIndex(r string) int {
	for i, x := range Rungs() {
		if x == r {
			return i
		}
	}
	return -1
}

// Tool kinds the build recognises.
const (
	KindRead     = "read"     // answers a row of an entity by its key
	KindLookup   = "lookup"   // finds a row's key (or the row) by other fields
	KindWrite    = "write"    // changes the world
	KindConstant = "constant" // always the same answer
	KindTemplate = "template" // the same text with argument values in it
	KindPure     = "pure"     // a function of the arguments (e.g. arithmetic)
	KindQuery    = "query"    // other reads (searches, listings) answered from recordings
	KindState    = "state"    // reads state beyond rows (variables: state.go) without changing it
	KindUnknown  = "unknown"  // never seen in a trace
)

// Bundle is everything a twin needs, immutable once built. Marshal gives its
// canonical bytes and Hash its content address.
type Bundle struct {
	Format int `json:"format"`
	// Name, Framework and Language come from the build config.
	Name      string `json:"name,omitempty"`
	Framework string `json:"framework,omitempty"`
	Language  string `json:"language,omitempty"`
	// SchemaSource is "traces", or "provided" when tool definitions were uploaded.
	SchemaSource string `json:"schema_source"`
	// Style is how production spells JSON text.
	Style Style `json:"style"`
	// Clock is the default world time (RFC 3339) when a session fixes none.
	Clock string `json:"clock,omitempty"`
	Tools []Tool `json:"tools"`
	// Tables are the entity types and the base world's rows.
	Tables []Table `json:"tables"`
	// Recordings index recorded answers by tool and canonical arguments; Answers holds
	// each distinct answer text once.
	Recordings []Recording `json:"recordings"`
	Answers    []string    `json:"answers"`
	// Scenarios are named seed instructions from the build config.
	Scenarios map[string]string `json:"scenarios,omitempty"`
	Summary   Summary           `json:"summary"`
	// Agent is what the traces show of the agent that recorded them (nil in bundles built before it was learned).
	Agent *Agent `json:"agent,omitempty"`
	// World is the policy for ids the world does not hold: WorldOpen or WorldClosed ("" is DefaultWorld). A session
	// may override it at open (SessionSpec.World).
	World string `json:"world,omitempty"`
	// StateTable names the table holding state beyond rows (state.go; "" when the build learned none).
	StateTable string `json:"state_table,omitempty"`
	// TerminalTools are the build config's terminal tools: calling one ends an episode.
	TerminalTools []string `json:"terminal_tools,omitempty"`
}

// Agent is the agent as its traces show it: what a one-shot query runs (its prompt, tools and model) and the
// recorded runs replay mode picks from.
type Agent struct {
	// SystemPrompt is the system prompt most traces open with ("" when no trace has one); Prompts lists every
	// distinct one with how many traces used it, most used first (at most 8).
	SystemPrompt string        `json:"system_prompt,omitempty"`
	Prompts      []AgentPrompt `json:"prompts,omitempty"`
	// Models are the model ids the traces name, most used first.
	Models []AgentCount `json:"models,omitempty"`
	// Tools are the tools the traces call, sorted.
	Tools []string `json:"tools,omitempty"`
	// Framework and Language are the build config's, when it names them; FrameworkFrom and LanguageFrom say
	// where each came from ("config", or "" when the build did not say: the environment keeps what collect saw).
	Framework     string `json:"framework,omitempty"`
	FrameworkFrom string `json:"framework_from,omitempty"`
	Language      string `json:"language,omitempty"`
	LanguageFrom  string `json:"language_from,omitempty"`
	// Runs are the recorded runs, sorted by trace id: what replay mode ranks and replays.
	Runs []AgentRun `json:"runs,omitempty"`
}

// AgentPrompt is one distinct system prompt and the number of traces that open with it.
type AgentPrompt struct {
	Text   string `json:"text"`
	Traces int    `json:"traces"`
}

// AgentCount is a value and the number of traces showing it.
type AgentCount struct {
	Name   string `json:"name"`
	Traces int    `json:"traces"`
}

// AgentRun is one recorded run: its first user message, its tool calls in order and its final answer.
type AgentRun struct {
	TraceID string      `json:"trace_id"`
	Request string      `json:"request"`
	Calls   []AgentCall `json:"calls,omitempty"`
	Answer  string      `json:"answer"`
}

// AgentCall is one recorded tool call: the tool and its arguments as the model sent them (JSON text).
type AgentCall struct {
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
}

// HasAgent reports whether the traces show an agent a query can run: a system prompt and tools it calls.
func (a *Agent) HasAgent() bool {
	return a != nil && a.SystemPrompt != "" && len(a.Tools) > 0
}

// Tool is one production tool and how the twin answers it.
type Tool struct {
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Binding is provided, synthesized or simulated; Rung is the rung calls start at.
	Binding string `json:"binding"`
	Rung    string `json:"rung"`
	Kind    string `json:"kind"`
	// Source is the synthesized Starlark handler (readable; empty when none could be made);
	// Provided is the caller's own code, which runs first when set.
	Source   string `json:"source,omitempty"`
	Provided string `json:"provided,omitempty"`
	// Table and KeyArg name the entity the tool reads or writes and the argument holding its
	// key, so replay can tell recordings made from different states apart.
	Table  string `json:"table,omitempty"`
	KeyArg string `json:"key_arg,omitempty"`
	// PreferRecorded: the handler does not reproduce every recording, so a recorded answer
	// made from the very same state (same arguments, same target row) is used first; it is
	// labelled replay.
	PreferRecorded bool `json:"prefer_recorded,omitempty"`
	// StringsAsJSON: string answers are JSON-quoted ("\"x\"") rather than bare text.
	StringsAsJSON bool `json:"strings_as_json,omitempty"`
	// Defined: the tool has an uploaded definition (a tool the traces never called is then answered, without a
	// model, from the recorded tool most like it: similar.go).
	Defined bool `json:"defined,omitempty"`
	// DescriptionFrom says where Description came from: DescribedByDefinition (an uploaded or traced tool
	// definition) or DescribedByName (none carried one: PlainDescription); "" in bundles built before it.
	DescriptionFrom string `json:"description_from,omitempty"`
	// State says which variables the tool's answers show (nil: none; state.go).
	State *ToolState `json:"state,omitempty"`
	// Args are the argument rules calls are refused by before any rung answers (nil: only the input schema's
	// types are checked, as bundles built before them did).
	Args *ArgRules `json:"args,omitempty"`
	// Attention lists what a user should know about this tool's twin.
	Attention []string `json:"attention,omitempty"`
	Scores    Scores   `json:"scores"`
}

// Scores are a tool's build-time figures.
type Scores struct {
	// Calls and Errors count recorded calls and recorded error answers.
	Calls  int `json:"calls"`
	Errors int `json:"errors"`
	// Fit is the share of recorded calls the synthesized handler reproduced exactly when run on
	// the recorded state (0 when there is no handler); FitCalls is how many it was tried on.
	Fit      float64 `json:"fit"`
	FitCalls int     `json:"fit_calls"`
}

// Table is an entity type: its key, its base rows and what may be asked of it.
type Table struct {
	Name string `json:"name"`
	// Key is the field (or, when KeyInRow is false, the argument) that names a row.
	Key      string `json:"key"`
	KeyInRow bool   `json:"key_in_row"`
	// KeyShape is the shape of keys seen, for generated keys: 9 a digit, A an upper-case and
	// a a lower-case letter, \x the character x ("#W" + 7 digits is "#\W9999999").
	KeyShape string `json:"key_shape,omitempty"`
	// Rows are the base world, sorted by key; each row's JSON keeps production's key order.
	Rows []Row `json:"rows"`
	// Indexes are field paths world.find is asked about (each "a.b" path, optionally folded).
	Indexes []Index `json:"indexes,omitempty"`
	// Subs name nested objects addressable by one of their fields (world.sub).
	Subs []SubIndex `json:"subs,omitempty"`
	// Refs are fields holding keys of other tables (for seeding related rows).
	Refs []Ref `json:"refs,omitempty"`
	// KeyPattern is the id format the recordings show (a regular expression): in an open world an unknown id
	// that matches it is made up on first read; others are not found.
	KeyPattern string `json:"key_pattern,omitempty"`
	// KeyParts are the fields an id embeds ("james_sanchez_3954": part 0 is name.first_name, title-cased).
	KeyParts []KeyPart `json:"key_parts,omitempty"`
	// KeyWords are fields whose value begins with the words the key embeds, in KeyParts order (an email
	// "james.sanchez3954@…"): a search by one names the entity those words name.
	KeyWords []string `json:"key_words,omitempty"`
	// Facts are what the recordings show of entities the base world does not hold (inside other entities'
	// answers, or named by their keys): partial rows, completed when first read (labelled B_inferred).
	Facts []Row `json:"facts,omitempty"`
	// Absent are ids production answered not found for: never made up, in an open world either.
	Absent []string `json:"absent,omitempty"`
}

// KeyPart says part Index of a key split at "_" is the value of field Path (title-cased when Title).
type KeyPart struct {
	Index int    `json:"index"`
	Path  string `json:"path"`
	Title bool   `json:"title,omitempty"`
}

// Row is one base-world row.
type Row struct {
	Key  string `json:"key"`
	JSON string `json:"json"`
	// From names the first recorded mentions ("trace#call") a fact row was learned from.
	From []string `json:"from,omitempty"`
}

// Index is a lookup path over a table's rows.
type Index struct {
	Path string `json:"path"`
	Fold bool   `json:"fold,omitempty"`
}

// SubIndex addresses nested objects: Path walks from the row ("variants.*" is every value of
// the variants object, "items[]" every element of the items list) to objects whose Field names them.
type SubIndex struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Field string `json:"field"`
}

// Ref says a row's field holds keys of another table: a string (Many false) or a list (Many true).
type Ref struct {
	Field string `json:"field"`
	Table string `json:"table"`
	Many  bool   `json:"many,omitempty"`
}

// Recording is one recorded call, indexed for replay and inference.
type Recording struct {
	Tool string `json:"tool"`
	// Args is the canonical JSON of the arguments.
	Args   string `json:"args"`
	Answer int    `json:"answer"`
	Error  bool   `json:"error,omitempty"`
	// State fingerprints the tool's target row before the call ("" when unknown, "-" when absent).
	State string `json:"state,omitempty"`
	Trace string `json:"trace"`
	Call  int    `json:"call"`
}

// Summary is the build's headline figures.
type Summary struct {
	NTraces      int     `json:"n_traces"`
	NCalls       int     `json:"n_calls"`
	NTools       int     `json:"n_tools"`
	CoveredPct   float64 `json:"covered_pct"`
	SimulatedPct float64 `json:"simulated_pct"`
	Headline     string  `json:"headline"`
}

// ErrBadBundle is wrapped by every bundle decoding or validation error.
var ErrBadBundle = errors.New("bad bundle")

// Marshal answers the bundle's canonical bytes: JSON with every object's keys
// sorted and no insignificant whitespace. The same bundle always gives the same bytes.
func (b *Bundle) Marshal() ([]byte, error) {
	var blocks blockWriter
	if err := b.WriteCanonical(&blocks); err != nil {
		return nil, err
	}
	return blocks.bytes(), nil
}

// Hash is the bundle's content address: "sha256:" + hex of its canonical bytes.
func (b *Bundle) Hash() string {
	h := sha256.New()
	if err := b.WriteCanonical(h); err != nil {
		return ""
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// HashBytes is "sha256:" + hex SHA-256 of data.
func HashBytes(data []byte) string {
	s := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(s[:])
}

// UnmarshalBundle decodes and validates bundle bytes.
func UnmarshalBundle(data []byte) (*Bundle, error) {
	var b Bundle
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadBundle, err)
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return &b, nil
}

// Validate checks the bundle's shape; errors name the offending field.
func (b *Bundle) Validate() error {
	if b.Format != FormatVersion {
		return fmt.Errorf("%w: format: version %d, this build reads %d", ErrBadBundle, b.Format, FormatVersion)
	}
	if err := checkWorld(b.World); err != nil {
		return fmt.Errorf("%w: world: %w", ErrBadBundle, err)
	}
	tables := map[string]bool{}
	for i, t := range b.Tables {
		if _, err := compileKeyPattern(t.KeyPattern); err != nil {
			return fmt.Errorf("%w: tables[%d].key_pattern: %w", ErrBadBundle, i, err)
		}
		if t.Name == "" {
			return fmt.Errorf("%w: tables[%d].name: empty", ErrBadBundle, i)
		}
		if tables[t.Name] {
			return fmt.Errorf("%w: tables[%d].name: duplicate %q", ErrBadBundle, i, t.Name)
		}
		tables[t.Name] = true
	}
	names := map[string]bool{}
	for i, t := range b.Tools {
		if t.Name == "" {
			return fmt.Errorf("%w: tools[%d].name: empty", ErrBadBundle, i)
		}
		if names[t.Name] {
			return fmt.Errorf("%w: tools[%d].name: duplicate %q", ErrBadBundle, i, t.Name)
		}
		names[t.Name] = true
		switch t.Binding {
		case BindingProvided, BindingSynthesized, BindingSimulated:
		default:
			return fmt.Errorf("%w: tools[%d].binding: %q", ErrBadBundle, i, t.Binding)
		}
		if rungIndex(t.Rung) < 0 {
			return fmt.Errorf("%w: tools[%d].rung: %q", ErrBadBundle, i, t.Rung)
		}
		if t.Table != "" && !tables[t.Table] {
			return fmt.Errorf("%w: tools[%d].table: no table %q", ErrBadBundle, i, t.Table)
		}
	}
	for i, r := range b.Recordings {
		if !names[r.Tool] {
			return fmt.Errorf("%w: recordings[%d].tool: no tool %q", ErrBadBundle, i, r.Tool)
		}
		if r.Answer < 0 || r.Answer >= len(b.Answers) {
			return fmt.Errorf("%w: recordings[%d].answer: %d out of range", ErrBadBundle, i, r.Answer)
		}
	}
	return nil
}

// ToolByName answers the named tool.
func (b *Bundle) ToolByName(name string) (*Tool, bool) {
	for i := range b.Tools {
		if b.Tools[i].Name == name {
			return &b.Tools[i], true
		}
	}
	return nil, false
}

// oldGenerated matches the generated descriptions bundles built before PlainDescription carried
// ("get user details (described from 121 recorded calls)"): provenance that belongs in a tool's figures, not its text.
var oldGenerated = regexp.MustCompile(`^[^()]* \(described from \d+ recorded calls?\)$`)

// PlainDescription is the description of a tool no definition describes: its name as a sentence
// (get_user_details: "Get user details.").
func PlainDescription(name string) string {
	words := strings.Fields(strings.NewReplacer("_", " ", "-", " ", ".", " ").Replace(name))
	if len(words) == 0 {
		return "A tool."
	}
	s := strings.Join(words, " ")
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:] + "."
}

// ToolDescription is the description a listing shows for t: its definition's, else a plain one. A bundle built
// before PlainDescription existed holds a generated text with its provenance; that is shown as the plain one.
func ToolDescription(t Tool) (desc, from string) {
	switch {
	case t.DescriptionFrom != "":
		return t.Description, t.DescriptionFrom
	case t.Description == "" || oldGenerated.MatchString(t.Description):
		return PlainDescription(t.Name), DescribedByName
	}
	return t.Description, DescribedByDefinition
}

// Where a tool's description came from (Tool.DescriptionFrom).
const (
	DescribedByDefinition = "definition"
	DescribedByName       = "name"
)
