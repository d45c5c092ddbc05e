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
// language the build config names, and each trace's run (first user message, tool calls, final answer). Runs are
// in trace-id order (traces of one id in the order given), so the profile is deterministic.
func LearnAgent(traces []trace.Trace, cfg Config) *twin.Agent {
	var l agentLearner
	for i := range traces {
		l.add(&traces[i])
	}
	return l.agent(cfg)
}

// agentLearner gathers the agent profile one trace at a time, keeping only what the profile holds.
type agentLearner struct {
	prompts, models map[string]int
	tools           map[string]bool
	runs            []twin.AgentRun
}

func (l *agentLearner) add(t *trace.Trace) {
	if l.prompts == nil {
		l.prompts, l.models, l.tools = map[string]int{}, map[string]int{}, map[string]bool{}
	}
	if m := strings.TrimSpace(t.Model); m != "" {
		l.models[m]++
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
				l.tools[c.Function.Name] = true
				run.Calls = append(run.Calls, twin.AgentCall{Tool: c.Function.Name, Arguments: c.Function.Arguments})
			}
			if len(m.ToolCalls) == 0 && strings.TrimSpace(text) != "" {
				run.Answer = text // the last text the assistant said is its final answer
			}
		}
	}
	if sys != "" {
		l.prompts[sys]++
	}
	if run.Request != "" {
		l.runs = append(l.runs, run)
	}
}

// agent answers the profile of the traces added so far.
func (l *agentLearner) agent(cfg Config) *twin.Agent {
	a := &twin.Agent{}
	if f := strings.TrimSpace(cfg.Framework); f != "" {
		a.Framework, a.FrameworkFrom = f, "config"
	}
	if l := strings.TrimSpace(cfg.Language); l != "" {
		a.Language, a.LanguageFrom = l, "config"
	}
	slices.SortStableFunc(l.runs, func(x, y twin.AgentRun) int { return cmp.Compare(x.TraceID, y.TraceID) })
	a.Runs = slices.Clone(l.runs)
	for text, n := range l.prompts {
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
	for name, n := range l.models {
		a.Models = append(a.Models, twin.AgentCount{Name: name, Traces: n})
	}
	slices.SortFunc(a.Models, func(x, y twin.AgentCount) int {
		return cmp.Or(cmp.Compare(y.Traces, x.Traces), cmp.Compare(x.Name, y.Name))
	})
	for name := range l.tools {
		a.Tools = append(a.Tools, name)
	}
	slices.Sort(a.Tools)
	return a
}
