package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/otlp"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/trace"
)

// Spans is the service that stages OpenTelemetry spans (POST /v1/traces) until their conversations settle.
type Spans struct {
	DB bun.IDB
	// MaxEnvBytes caps an environment's collected bytes; an export that would pass it stages nothing.
	MaxEnvBytes int64
	// Log answers the logger of a call's context (nil: not logged).
	Log func(context.Context) *slog.Logger
}

// errEnvFull rolls back a staging transaction whose environment would pass its cap.
var errEnvFull = errors.New("control: environment full")

// Stage writes the extracted spans of workspace ws, every project's environment made on its first spans, in one
// transaction, and answers the environments that gained spans. A project whose environment would pass MaxEnvBytes
// stages nothing (TooLarge). What the spans tell of an agent is noted where its environment knows nothing yet.
func (s *Spans) Stage(ctx context.Context, ws string, ex *otlp.Extracted) ([]string, error) {
	if len(ex.Projects) == 0 {
		return nil, nil // nothing to stage: no span of it records a conversation
	}
	var envs []string
	var full error
	var agents []ingest.Agent
	err := s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		envs, full, agents = envs[:0], nil, agents[:0]
		for _, pr := range ex.Projects {
			env, err := store.UpsertEnvByProject(ctx, tx, ws, pr.Name)
			if err != nil {
				return err
			}
			rows := make([]schema.StagedSpan, len(pr.Spans))
			var size int64
			for i, sp := range pr.Spans {
				rows[i] = schema.StagedSpan{EnvID: env.ID, TraceID: sp.TraceID, SpanID: sp.SpanID, ParentID: sp.Parent,
					ConversationID: sp.Conversation, Bytes: int64(len(sp.Data)), Span: sp.Data}
				size += int64(len(sp.Data))
			}
			if env.CollectedBytes+size > s.MaxEnvBytes {
				full = &toolplane.Error{Kind: toolplane.TooLarge, Detail: fmt.Sprintf(
					"environment %s holds %d collected bytes; the %d bytes of this export's spans would pass its cap of %d",
					env.Slug, env.CollectedBytes, size, s.MaxEnvBytes)}
				return errEnvFull
			}
			added, err := store.StageSpans(ctx, tx, rows)
			if err != nil {
				return err
			}
			if added > 0 {
				envs = append(envs, env.ID)
				var a ingest.Agent
				if env.Framework == "" || env.Language == "" { // what the spans tell, where the environment knows nothing yet
					a = agentOf(pr)
				}
				agents = append(agents, a)
			}
		}
		return nil
	})
	if errors.Is(err, errEnvFull) {
		return nil, full
	}
	if err != nil {
		return nil, err
	}
	s.noteAgents(ctx, envs, agents)
	return envs, nil
}

// agentOf tells a project's framework and language from its instrumentation scopes and SDK language.
func agentOf(pr otlp.Project) ingest.Agent {
	lang := pr.Language
	switch lang {
	case "nodejs", "webjs":
		lang = "javascript"
	case "dotnet":
		lang = "csharp"
	}
	// The spans' texts are not read for it: the scopes name instrumentations (langchain, llama_index, …).
	return ingest.Detect(&trace.Batch{}, ingest.Hints{UserAgent: strings.Join(pr.Scopes, " "), Language: lang})
}

// noteAgents records what the spans tell of an environment's agent where the environment knows nothing yet. It is
// best effort: a failure is logged.
func (s *Spans) noteAgents(ctx context.Context, envs []string, agents []ingest.Agent) {
	for i, id := range envs {
		a := agents[i]
		if a.Framework == "" && a.Language == "" {
			continue
		}
		env, err := store.GetEnvByID(ctx, s.DB, id)
		if err != nil {
			continue
		}
		var cols []string
		if env.Framework == "" && a.Framework != "" {
			env.Framework = a.Framework
			cols = append(cols, "framework")
		}
		if env.Language == "" && a.Language != "" {
			env.Language = a.Language
			cols = append(cols, "language")
		}
		if len(cols) > 0 {
			if err := store.UpdateEnv(ctx, s.DB, env, cols...); err != nil && s.Log != nil {
				s.Log(ctx).WarnContext(ctx, "traces: note agent", slog.String("env", id), slog.Any("error", err))
			}
		}
	}
}
