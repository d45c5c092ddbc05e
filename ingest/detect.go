package ingest

import (
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// Agent is what a batch and its request tell about the agent that recorded it; "" means unknown.
type Agent struct {
	Framework string
	Language  string
}

// Hints are facts about the request that carried a batch.
type Hints struct {
	// UserAgent is the request's User-Agent header.
	UserAgent string
	// Framework and Language are what the sender states outright (the API reads them from the
	// X-Doppel-Framework and X-Doppel-Language headers); they win over anything detected.
	Framework, Language string
}

// fingerprints are default system prompts of agent frameworks: a system message holding one tells
// the framework.
var fingerprints = []struct{ marker, framework string }{
	{"\nYour personal goal is: ", "crewai"},
	{"Solve tasks using your coding and language skills.", "autogen"},
	{"You are an expert assistant who can solve any task using code blobs.", "smolagents"},
	{"You are an expert assistant who can solve any task using tool calls.", "smolagents"},
}

// userAgentTokens map lower-case User-Agent substrings to a framework or a language; the first match of each wins.
var userAgentTokens = []struct{ token, framework, language string }{
	{"langgraph", "langgraph", ""},
	{"langchain", "langchain", ""},
	{"llama-index", "llamaindex", ""},
	{"llama_index", "llamaindex", ""},
	{"llamaindex", "llamaindex", ""},
	{"crewai", "crewai", ""},
	{"autogen", "autogen", ""},
	{"openai-agents", "openai-agents", ""},
	{"pydantic-ai", "pydantic-ai", ""},
	{"smolagents", "smolagents", ""},
	{"haystack", "haystack", ""},
	{"semantic-kernel", "semantic-kernel", ""},
	{"mastra", "mastra", ""},
	{"doppel-collector-go", "", "go"},
	{"go-http-client", "", "go"},
	{"python", "", "python"},
	{"aiohttp", "", "python"},
	{"httpx", "", "python"},
	{"urllib", "", "python"},
	{"node", "", "javascript"},
	{"undici", "", "javascript"},
	{"axios", "", "javascript"},
	{"deno", "", "javascript"},
	{"bun/", "", "javascript"},
	{"okhttp", "", "java"},
	{"java", "", "java"},
	{"ruby", "", "ruby"},
	{"faraday", "", "ruby"},
	{"reqwest", "", "rust"},
	{".net", "", "csharp"},
	{"dotnet", "", "csharp"},
}

// Detect tells the agent's framework and language where the request or the traces say: stated hints
// first, then known User-Agent tokens (http libraries tell the language, framework names the
// framework), then known framework system prompts in the traces. Traces are scanned in order, so
// the answer is deterministic.
func Detect(b *trace.Batch, h Hints) Agent {
	a := Agent{Framework: strings.TrimSpace(h.Framework), Language: strings.TrimSpace(h.Language)}
	ua := strings.ToLower(h.UserAgent)
	for _, t := range userAgentTokens {
		if !strings.Contains(ua, t.token) {
			continue
		}
		if a.Framework == "" && t.framework != "" {
			a.Framework = t.framework
		}
		if a.Language == "" && t.language != "" {
			a.Language = t.language
		}
	}
	if a.Framework != "" {
		return a
	}
	for i := range b.Traces {
		for j := range b.Traces[i].Messages {
			m := &b.Traces[i].Messages[j]
			if m.Role != trace.RoleSystem || m.Content == nil {
				continue
			}
			for _, f := range fingerprints {
				if strings.Contains(*m.Content, f.marker) {
					a.Framework = f.framework // ports to other languages exist: the language stays as told
					return a
				}
			}
		}
	}
	return a
}
