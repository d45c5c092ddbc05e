// Package infer builds a twin bundle from recorded agent traces: tools, entities, base world, synthesized handlers.
package infer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/twin"
)

// Options are a build's inputs besides the traces.
type Options struct {
	// Tools are provided tool definitions; they win over what the traces show.
	Tools []ToolDef
	// Code is provided Starlark handler code per tool name (see twin.HandlerAPI).
	Code map[string]string
	// Config is the environment's build config.
	Config Config
	// Folds is for SelfCheck only: check in this many folds instead of leave-one-out
	// (0: leave-one-out up to MaxLeaveOneOut traces, else 10 folds).
	Folds int
}

// ToolDef is one provided tool definition in the native shape.
type ToolDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// Config is the build config a user may upload.
type Config struct {
	Name      string `json:"name,omitempty"`
	Framework string `json:"framework,omitempty"`
	Language  string `json:"language,omitempty"`
	// Scenarios are named seed instructions sessions may ask for by name.
	Scenarios map[string]string `json:"scenarios,omitempty"`
	// Bindings override a tool's binding: provided, synthesized or simulated.
	Bindings map[string]string `json:"bindings,omitempty"`
	// Clock is the default world time (RFC 3339).
	Clock string `json:"clock,omitempty"`
	// World is the policy for ids the world does not hold: "open" (the default: an unknown id in the recorded
	// id format is made up, consistent with what the recordings imply, labelled B_inferred) or "closed"
	// (production's not-found error). Sessions may override it at open.
	World string `json:"world,omitempty"`
	// TerminalTools end an episode (a session opened with a task) when called, e.g. transfer_to_human_agents.
	TerminalTools []string `json:"terminal_tools,omitempty"`
}

// ErrBadInput is wrapped by every error about the build's inputs; the message names the field.
var ErrBadInput = errors.New("bad build input")

// ParseToolDefs reads tool definitions in any of the shapes agents are given
// tools in: native {name, description, inputSchema}, OpenAI {type: "function",
// function: {name, description, parameters}}, Anthropic {name, description,
// input_schema}, or bare {name, description, parameters}; as an array or as an
// object with a "tools" array.
func ParseToolDefs(data []byte) ([]ToolDef, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, nil
	}
	var items []json.RawMessage
	if data[0] == '{' {
		var wrap struct {
			Tools *[]json.RawMessage `json:"tools"`
		}
		if err := json.Unmarshal(data, &wrap); err != nil {
			return nil, fmt.Errorf("%w: tools: %w", ErrBadInput, err)
		}
		if wrap.Tools == nil {
			// A single definition.
			items = []json.RawMessage{data}
		} else {
			items = *wrap.Tools
		}
	} else if err := json.Unmarshal(data, &items); err != nil {
		return nil, fmt.Errorf("%w: tools: not an array of tool definitions: %w", ErrBadInput, err)
	}
	var out []ToolDef
	seen := map[string]int{}
	for i, raw := range items {
		var d struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
			InputSnake  json.RawMessage `json:"input_schema"`
			Parameters  json.RawMessage `json:"parameters"`
			Function    *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("%w: tools[%d]: %w", ErrBadInput, i, err)
		}
		td := ToolDef{Name: d.Name, Description: d.Description}
		switch {
		case d.Function != nil:
			td = ToolDef{Name: d.Function.Name, Description: d.Function.Description, InputSchema: d.Function.Parameters}
		case len(d.InputSchema) > 0:
			td.InputSchema = d.InputSchema
		case len(d.InputSnake) > 0:
			td.InputSchema = d.InputSnake
		case len(d.Parameters) > 0:
			td.InputSchema = d.Parameters
		}
		if td.Name == "" {
			field := "name"
			if d.Function != nil {
				field = "function.name"
			}
			return nil, fmt.Errorf("%w: tools[%d].%s: missing", ErrBadInput, i, field)
		}
		if len(td.InputSchema) == 0 || string(td.InputSchema) == "null" {
			td.InputSchema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		var schema map[string]any
		if err := json.Unmarshal(td.InputSchema, &schema); err != nil {
			return nil, fmt.Errorf("%w: tools[%d] (%s): input schema is not a JSON object: %w", ErrBadInput, i, td.Name, err)
		}
		if j, dup := seen[td.Name]; dup {
			return nil, fmt.Errorf("%w: tools[%d].name: %q already defined at tools[%d]", ErrBadInput, i, td.Name, j)
		}
		seen[td.Name] = i
		var buf bytes.Buffer
		if err := json.Compact(&buf, td.InputSchema); err != nil {
			return nil, fmt.Errorf("%w: tools[%d] (%s): %w", ErrBadInput, i, td.Name, err)
		}
		td.InputSchema = buf.Bytes()
		out = append(out, td)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (o *Options) validate() error {
	for name, b := range o.Config.Bindings {
		switch b {
		case twin.BindingProvided:
			if strings.TrimSpace(o.Code[name]) == "" {
				return fmt.Errorf("%w: config.bindings.%s: provided, but no code was provided for it", ErrBadInput, name)
			}
		case twin.BindingSynthesized, twin.BindingSimulated:
		default:
			return fmt.Errorf("%w: config.bindings.%s: %q is not provided, synthesized or simulated", ErrBadInput, name, b)
		}
	}
	switch o.Config.World {
	case "", twin.WorldOpen, twin.WorldClosed:
	default:
		return fmt.Errorf("%w: config.world: %q is not %q or %q", ErrBadInput, o.Config.World, twin.WorldOpen, twin.WorldClosed)
	}
	for name := range o.Config.Scenarios {
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("%w: config.scenarios: empty scenario name", ErrBadInput)
		}
	}
	for i, name := range o.Config.TerminalTools {
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("%w: config.terminal_tools[%d]: empty tool name", ErrBadInput, i)
		}
	}
	for i, d := range o.Tools {
		if d.Name == "" {
			return fmt.Errorf("%w: tools[%d].name: missing", ErrBadInput, i)
		}
	}
	return nil
}
