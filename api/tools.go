package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
)

// Tool listing formats (GET /v1/envs/{slug}/tools?format=).
const (
	FormatNative    = "native"
	FormatOpenAI    = "openai"           // Chat Completions: {type: function, function: {name, description, parameters}}
	FormatResponses = "openai-responses" // the Responses API: {type: function, name, description, parameters, strict}
	FormatAnthropic = "anthropic"
)

// NativeTool is a tool listing entry in the native format.
type NativeTool struct {
	Name            string          `json:"name" doc:"The production tool's name." example:"get_order_details"`
	Description     string          `json:"description" doc:"The tool's description: its definition's (uploaded, or carried by traces), else a plain sentence made from its name."`
	DescriptionFrom string          `json:"descriptionFrom" enum:"definition,name" doc:"Where description came from: definition, or name when no definition described the tool. How many recorded calls the tool was inferred from is scores.calls."`
	InputSchema     json.RawMessage `json:"inputSchema" doc:"JSON Schema of the arguments (an object schema)."`
	Binding         string          `json:"binding" enum:"provided,synthesized,simulated" doc:"Who answers: provided (the caller's own tool code runs against the seeded world), synthesized (code generated from the recordings runs), simulated (a model answers from the recordings and the schema)."`
	Rung            string          `json:"rung" enum:"provided,twin,replay,infer,simulate" doc:"The rung calls to this tool start at. The ladder, in order: provided (A_executed), twin (B_twin, the synthesized handler over the session world), replay (B_replayed, a recorded answer for canonically equal arguments), infer (B_inferred, the nearest recorded call with this call's values), simulate (B_simulated, the configured model). A call that falls below its starting rung is marked downgraded."`
	Attention       []string        `json:"attention" doc:"What a user should know about this tool's twin, one plain sentence each (e.g. that a write is only replayed); empty when nothing."`
	Scores          ToolScores      `json:"scores" doc:"The build's figures for this tool."`
	Twin            ToolTwinFacts   `json:"twin" doc:"Facts about how the twin serves this tool."`
	Answerable      bool            `json:"answerable" doc:"Whether anything can answer a call: a handler, a recording or a configured model. A tool nothing can answer is left out of the openai and anthropic formats, and attention says why."`
}

// ToolScores are a tool's build-time figures.
type ToolScores struct {
	Calls    int     `json:"calls" doc:"Recorded calls of the tool in the collected traces."`
	Errors   int     `json:"errors" doc:"Recorded error answers among them."`
	Fit      float64 `json:"fit" minimum:"0" maximum:"1" doc:"Share of recorded calls the synthesized handler reproduced exactly on the recorded state (0 when there is no handler)."`
	FitCalls int     `json:"fitCalls" doc:"How many recorded calls the fit was measured on."`
}

// ToolTwinFacts describe how the twin serves a tool.
type ToolTwinFacts struct {
	Kind         string          `json:"kind" enum:"read,lookup,write,constant,template,pure,query,unknown" doc:"What the build recognised the tool as: read (a row by its key), lookup (a key by other fields), write (changes the world), constant, template, pure (a function of the arguments), query (other reads, from recordings), unknown (never seen in a trace)."`
	Entity       string          `json:"entity,omitempty" doc:"The entity table the tool reads or writes."`
	KeyArg       string          `json:"keyArg,omitempty" doc:"The argument holding that entity's key."`
	Handler      bool            `json:"handler" doc:"Whether a synthesized handler exists (readable in the bundle)."`
	Provided     bool            `json:"provided" doc:"Whether provided code runs first."`
	OutputSchema json.RawMessage `json:"outputSchema,omitempty" doc:"JSON Schema of a successful answer, inferred from recorded results."`
	BuildID      string          `json:"buildId" doc:"The active build serving the tool."`
	BundleHash   string          `json:"bundleHash" doc:"Content address of the build's bundle."`
}

// OpenAITool is a listing entry in the shape of an OpenAI-style tools= parameter.
type OpenAITool struct {
	Type     string         `json:"type" enum:"function"`
	Function OpenAIFunction `json:"function"`
}

// OpenAIFunction is the function of an OpenAITool.
type OpenAIFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters" doc:"JSON Schema of the arguments."`
}

// AnthropicTool is a listing entry in the shape of an Anthropic-style tools= parameter.
type AnthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema" doc:"JSON Schema of the arguments."`
}

// ResponsesTool is a listing entry in the shape of the OpenAI Responses API's function tool (tools= of
// responses.create).
type ResponsesTool struct {
	Type        string          `json:"type" enum:"function"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters" doc:"JSON Schema of the arguments."`
	Strict      bool            `json:"strict" doc:"Always false: the schemas are the recorded or uploaded ones, which strict mode (every property required, additionalProperties false) would reject or change. The Responses API defaults strict to true, so it is stated."`
}

// ToolList is the tools listing: entries of one format.
type ToolList []any

// ToolEntry documents one listing entry: the fields of every format in one object, each present in the formats its
// description names. It is the document's, not the wire's: each format's entry carries only its own fields (and
// so validates against this schema), and a generated client decodes every format into it. A oneOf of the formats
// could not be told apart (the openai formats are both {type: function, …}; an empty listing matches all).
type ToolEntry struct {
	Type            string          `json:"type,omitempty" enum:"function" doc:"openai, openai-responses: function."`
	Function        *OpenAIFunction `json:"function,omitempty" doc:"openai: the function."`
	Name            string          `json:"name,omitempty" doc:"native, anthropic, openai-responses: the production tool's name." example:"get_order_details"`
	Description     string          `json:"description,omitempty" doc:"native, anthropic, openai-responses: the tool's description (its definition's, else a plain sentence from its name)."`
	DescriptionFrom string          `json:"descriptionFrom,omitempty" enum:"definition,name" doc:"native: where description came from (definition, or name)."`
	InputSchema     json.RawMessage `json:"inputSchema,omitempty" doc:"native: JSON Schema of the arguments (an object schema)."`
	InputSchemaA    json.RawMessage `json:"input_schema,omitempty" doc:"anthropic: JSON Schema of the arguments."`
	Parameters      json.RawMessage `json:"parameters,omitempty" doc:"openai-responses: JSON Schema of the arguments."`
	Strict          *bool           `json:"strict,omitempty" doc:"openai-responses: false (see ResponsesTool)."`
	Binding         string          `json:"binding,omitempty" enum:"provided,synthesized,simulated" doc:"native: who answers (see NativeTool)."`
	Rung            string          `json:"rung,omitempty" enum:"provided,twin,replay,infer,simulate" doc:"native: the rung calls start at (see NativeTool)."`
	Attention       []string        `json:"attention,omitempty" doc:"native: what a user should know about this tool's twin."`
	Scores          *ToolScores     `json:"scores,omitempty" doc:"native: the build's figures for this tool."`
	Twin            *ToolTwinFacts  `json:"twin,omitempty" doc:"native: how the twin serves this tool."`
	Answerable      *bool           `json:"answerable,omitempty" doc:"native: whether anything can answer a call."`
}

// Schema documents the listing as an array of ToolEntry.
func (ToolList) Schema(r huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeArray, Items: r.Schema(reflect.TypeFor[ToolEntry](), true, "ToolEntry"),
		Description: "One entry per tool, sorted by name, in the requested format: native (NativeTool's fields), " +
			"openai ({type, function}), openai-responses ({type, name, description, parameters, strict}) or " +
			"anthropic ({name, description, input_schema})."}
}

// ListToolsInput is GET /v1/envs/{slug}/tools.
type ListToolsInput struct {
	Slug   string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	Format string `query:"format" enum:"native,openai,openai-responses,anthropic" default:"native" doc:"Entry shape: native (default), openai (Chat Completions), openai-responses (the Responses API) or anthropic. The provider formats go straight into the matching SDK's tools= parameter."`
}

// ListToolsOutput answers GET /v1/envs/{slug}/tools.
type ListToolsOutput struct {
	Body ToolList
}

var emptyObjectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// unanswerable is the attention sentence of a tool nothing can answer.
const unanswerable = "Nothing can answer this tool: it has no handler, no recorded answer and no definition to infer one by, " +
	"and no model is configured (model.base_url); it is left out of the openai, openai-responses and anthropic formats."

// ToolEntries renders a bundle's tools in format, sorted by name. model says whether a model is configured (the
// simulate rung answers): without one, a tool with no handler and no recording cannot be answered, so the provider
// formats leave it out — an agent handed it could only fail — and its native entry says why.
func ToolEntries(b *twin.Bundle, build *schema.Build, format string, model bool) (ToolList, error) {
	tools := append([]twin.Tool(nil), b.Tools...)
	sortTools(tools)
	recorded, anySuccess := map[string]bool{}, false
	for _, r := range b.Recordings {
		recorded[r.Tool] = true
		anySuccess = anySuccess || !r.Error
	}
	out := make(ToolList, 0, len(tools))
	for _, t := range tools {
		// A defined tool the traces never called is answered from the recorded tool most like it (B_inferred).
		answerable := model || t.Provided != "" || t.Source != "" || recorded[t.Name] || t.Defined && anySuccess
		in := t.InputSchema
		if len(in) == 0 || string(in) == "null" {
			in = emptyObjectSchema
		}
		desc, from := twin.ToolDescription(t)
		switch format {
		case FormatNative, "":
			att := t.Attention
			if att == nil {
				att = []string{}
			}
			if !answerable {
				att = append(att[:len(att):len(att)], unanswerable)
			}
			out = append(out, NativeTool{
				Name: t.Name, Description: desc, DescriptionFrom: from, InputSchema: in,
				Binding: t.Binding, Rung: t.Rung, Attention: att,
				Scores: ToolScores{Calls: t.Scores.Calls, Errors: t.Scores.Errors, Fit: t.Scores.Fit, FitCalls: t.Scores.FitCalls},
				Twin: ToolTwinFacts{Kind: t.Kind, Entity: t.Table, KeyArg: t.KeyArg, Handler: t.Source != "",
					Provided: t.Provided != "", OutputSchema: t.OutputSchema, BuildID: build.ID, BundleHash: build.BundleHash},
				Answerable: answerable,
			})
		case FormatOpenAI, FormatResponses, FormatAnthropic:
			if !answerable {
				continue
			}
			switch format {
			case FormatAnthropic:
				out = append(out, AnthropicTool{Name: t.Name, Description: desc, InputSchema: in})
			case FormatResponses:
				out = append(out, ResponsesTool{Type: "function", Name: t.Name, Description: desc, Parameters: in})
			default:
				out = append(out, OpenAITool{Type: "function", Function: OpenAIFunction{Name: t.Name, Description: desc, Parameters: in}})
			}
		default:
			return nil, Invalid("query.format", fmt.Sprintf("%q is not one of native, openai, openai-responses, anthropic", format))
		}
	}
	return out, nil
}

func sortTools(ts []twin.Tool) {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
}

func registerTools(a huma.API, db *bun.DB, bundles *toolplane.Bundles, model bool) {
	envs := &control.Envs{DB: db}
	Declare(a, Verb[ListToolsInput, ListToolsOutput]{
		Name:    "envs.tools",
		Method:  http.MethodGet,
		Path:    "/v1/envs/{slug}/tools",
		Summary: "List an environment's tools",
		Description: "The active build's tools, sorted by name. `format=openai` (Chat Completions), " +
			"`format=openai-responses` (the Responses API) and `format=anthropic` give entries " +
			"in the shape of those SDKs' `tools=` parameter; `native` (the default) adds `binding`, `rung`, " +
			"`attention`, `scores` and `twin` facts. An environment with no build yet answers 409 notReady.",
		Tags:     []string{"envs", "tools"},
		Security: WorkspaceKeyAuth(),
		Errors:   []int{http.StatusConflict, http.StatusServiceUnavailable},
		Handler: func(ctx context.Context, in *ListToolsInput) (*ListToolsOutput, error) {
			p := PrincipalFrom(ctx)
			_, build, err := envs.Active(ctx, p.Workspace.ID, in.Slug)
			if err != nil {
				return nil, err
			}
			b, err := bundles.Get(ctx, build)
			if err != nil {
				return nil, err
			}
			list, err := ToolEntries(b, build, in.Format, model)
			if err != nil {
				return nil, err
			}
			return &ListToolsOutput{Body: list}, nil
		},
	})
}
