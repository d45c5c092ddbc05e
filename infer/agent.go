package infer

import (
	"cmp"
	"slices"
	"strings"

	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// maxAgentPrompts bounds the distinct system prompts a profile keeps.
const maxAgentPrompts = 8

// LearnAgent derives what the traces show of the agent: its system prompts, models and tools, the framework and
// language the build config names, and each trace's run (first user message, tool calls, final answer). Traces
// are read in trace-id order, so the profile is deterministic.
func LearnAgent(traces []trace.Trace, cfg Config) *twin.Agent {
	a := &twin.Agent{}
	if f := strings.TrimSpace(cfg.Framework); f != "" {
		a.Framework, a.FrameworkFrom = f, "config"
	}
	if l := strings.TrimSpace(cfg.Language); l != "" {
		a.Language, a.LanguageFrom = l, "config"
	}
	sorted := slices.Clone(traces)
	slices.SortStableFunc(sorted, func(x, y trace.Trace) int { return cmp.Compare(x.ID, y.ID) })
	prompts, models, tools := map[string]int{}, map[string]int{}, map[string]bool{}
	for _, t := range sorted {
		if m := strings.TrimSpace(t.Model); m != "" {
			models[m]++
		}
		run := twin.AgentRun{TraceID: t.ID}
		sys := ""
		for _, m := range t.Messages {
			text := ""
			if m.Content != nil {
				text = *m.Content
			}
			switch m.Role {
			case trace.RoleSystem:
				if sys == "" && strings.TrimSpace(text) != "" {
					sys = text
				}
			case trace.RoleUser:
				if run.Request == "" {
					run.Request = text
				}
			case trace.RoleAssistant:
				for _, c := range m.ToolCalls {
					tools[c.Function.Name] = true
					run.Calls = append(run.Calls, twin.AgentCall{Tool: c.Function.Name, Arguments: c.Function.Arguments})
				}
				if len(m.ToolCalls) == 0 && strings.TrimSpace(text) != "" {
					run.Answer = text // the last text the assistant said is its final answer
				}
			}
		}
		if sys != "" {
			prompts[sys]++
		}
		if run.Request != "" {
			a.Runs = append(a.Runs, run)
		}
	}
	for text, n := range prompts {
		a.Prompts = append(a.Prompts, twin.AgentPrompt{Text: text, Traces: n})
	}
	slices.SortFunc(a.Prompts, func(x, y twin.AgentPrompt) int {
		return cmp.Or(cmp.Compare(y.Traces, x.Traces), cmp.Compare(x.Text, y.Text))
	})
	if len(a.Prompts) > maxAgentPrompts {
		a.Prompts = a.Prompts[:maxAgentPrompts]
	}
	if len(a.Prompts) > 0 {
		a.SystemPrompt = a.Prompts[0].Text
	}
	for name, n := range models {
		a.Models = append(a.Models, twin.AgentCount{Name: name, Traces: n})
	}
	slices.SortFunc(a.Models, func(x, y twin.AgentCount) int {
		return cmp.Or(cmp.Compare(y.Traces, x.Traces), cmp.Compare(x.Name, y.Name))
	})
	for name := range tools {
		a.Tools = append(a.Tools, name)
	}
	slices.Sort(a.Tools)
	return a
}
