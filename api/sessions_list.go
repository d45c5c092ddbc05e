package api

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/schema"
)

// ListSessionsInput is GET /v1/envs/{slug}/sessions.
type ListSessionsInput struct {
	Slug   string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	Status string `query:"status" enum:"open,closed,expired,broken" doc:"Only sessions in this status (omitted: all)."`
	Limit  int    `query:"limit" minimum:"1" maximum:"500" default:"50" doc:"At most this many, newest first."`
}

// SessionSummary is a session as listed: its seeding, and its calls as the journal counts them.
type SessionSummary struct {
	ID          string      `json:"id" example:"ses_0123456789abcdef"`
	Status      string      `json:"status" enum:"open,closed,expired,broken"`
	BuildID     string      `json:"build_id"`
	Seed        int64       `json:"seed"`
	Seeded      bool        `json:"seeded" doc:"Whether seed instructions or a scenario shaped the world."`
	Scenario    string      `json:"scenario" doc:"The scenario named at open (empty: none)."`
	WorldHash   string      `json:"world_hash"`
	StateHash   string      `json:"state_hash" doc:"The world's hash after the last call (the world hash before any)."`
	NCalls      int64       `json:"n_calls"`
	NErrors     int64       `json:"n_errors"`
	NDowngraded int64       `json:"n_downgraded"`
	Fidelity    FidelityMix `json:"fidelity"`
	CreatedAt   time.Time   `json:"created_at"`
	LastUsedAt  time.Time   `json:"last_used_at"`
	ClosedAt    *time.Time  `json:"closed_at,omitempty"`
}

// ListSessionsOutput wraps the list.
type ListSessionsOutput struct {
	Body []SessionSummary
}

func (sr *SessionRoutes) registerList(a huma.API, d *Deps) {
	Declare(a, Verb[ListSessionsInput, ListSessionsOutput]{
		Name:    "sessions.list",
		Method:  http.MethodGet,
		Path:    "/v1/envs/{slug}/sessions",
		Summary: "List sessions",
		Description: "The environment's sessions, newest first: status, seed, world and state hashes, and the calls, " +
			"errors and fidelity mix journaled so far. `status` keeps one status; `limit` (default 50, at most 500).",
		Tags:     []string{"sessions"},
		Security: WorkspaceKeyAuth(),
		Handler: func(ctx context.Context, in *ListSessionsInput) (*ListSessionsOutput, error) {
			listed, err := sr.Plane.List(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug, in.Status, in.Limit)
			if err != nil {
				return nil, err
			}
			out := &ListSessionsOutput{Body: make([]SessionSummary, 0, len(listed))}
			for i := range listed {
				l := &listed[i]
				s := sessionSummary(&l.Session)
				for _, c := range l.Counts {
					s.NCalls += c.N
					s.NErrors += c.Errors
					s.NDowngraded += c.Downgraded
					s.Fidelity.add(c.Fidelity, c.N)
				}
				if l.Last != nil {
					s.StateHash = l.Last.StateHash
					if l.Last.CreatedAt.After(s.LastUsedAt) {
						s.LastUsedAt = l.Last.CreatedAt.UTC()
					}
				}
				out.Body = append(out.Body, s)
			}
			return out, nil
		},
	})
}

// sessionSummary is a session's row as listed, before its calls are counted from the journal. A fork's state
// starts as its parent's at the fork point.
func sessionSummary(s *schema.Session) SessionSummary {
	state := s.WorldHash
	if s.ForkedFrom != "" && s.StateHash != "" {
		state = s.StateHash
	}
	out := SessionSummary{ID: s.ID, Status: s.Status, BuildID: s.BuildID, Seed: s.Seed, Seeded: s.Seeded,
		Scenario: s.Scenario, WorldHash: s.WorldHash, StateHash: state, CreatedAt: s.CreatedAt.UTC(),
		LastUsedAt: s.LastUsedAt.UTC()}
	if s.ClosedAt != nil {
		t := s.ClosedAt.UTC()
		out.ClosedAt = &t
	}
	return out
}

// add counts n calls labelled fidelity.
func (m *FidelityMix) add(fidelity string, n int64) {
	switch fidelity {
	case schema.FidelityAExecuted:
		m.AExecuted += n
	case schema.FidelityBTwin:
		m.BTwin += n
	case schema.FidelityBReplayed:
		m.BReplayed += n
	case schema.FidelityBInferred:
		m.BInferred += n
	case schema.FidelityBSimulated:
		m.BSimulated += n
	}
}
