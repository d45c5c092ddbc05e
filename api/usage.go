package api

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/usage"
)

// UsageRoutes serve GET /v1/usage (usage.get) and the admin verbs that manage workspaces.
type UsageRoutes struct {
	Source *usage.Source
	// Gate, when set, is told when an admin changes a workspace, so its next check reads it afresh.
	Gate *usage.Gate
	// AdminKey is the admin credential (config admin.key); "" leaves the admin verbs refusing every caller.
	AdminKey string
	// Now is the clock of readings (default time.Now).
	Now func() time.Time
}

// MeterOut is one meter of a usage reading.
type MeterOut struct {
	Name  string   `json:"name" enum:"task_minutes,tool_calls,queries,model_tokens,open_sessions,sessions,collected_bytes" doc:"The meter. model_tokens counts the prompt and completion tokens of one-shot queries' model calls."`
	Env   string   `json:"env,omitempty" doc:"For per-environment meters (collected_bytes): the environment's slug."`
	Used  float64  `json:"used" doc:"Used this period (open_sessions and collected_bytes: now)."`
	Limit *float64 `json:"limit" nullable:"true" doc:"The plan's hard limit; null when there is none."`
	Unit  string   `json:"unit" enum:"minutes,calls,queries,tokens,sessions,bytes" doc:"The meter's unit."`
}

// TaskMinutesOut is task-minutes used against the plan allowance.
type TaskMinutesOut struct {
	Used    float64  `json:"used" doc:"Billed task-minutes: seconds / 60 (see seconds)."`
	Limit   *float64 `json:"limit" nullable:"true" doc:"The plan's allowance; null when there is none."`
	Seconds int64    `json:"seconds" doc:"Billed seconds, exact: each session's open time in the period rounded up to the whole second."`
}

// UsageBody is a workspace's usage in the current period.
type UsageBody struct {
	PeriodStart time.Time      `json:"periodStart" format:"date-time" doc:"Start of the period (UTC), inclusive."`
	PeriodEnd   time.Time      `json:"periodEnd" format:"date-time" doc:"End of the period (UTC), exclusive."`
	At          time.Time      `json:"at" format:"date-time" doc:"When the reading was taken; open sessions count up to it."`
	Plan        string         `json:"plan" doc:"The workspace's plan (\"\" for none: no limits)."`
	CardOnFile  bool           `json:"cardOnFile" doc:"Whether a card is on file."`
	TaskMinutes TaskMinutesOut `json:"taskMinutes"`
	Meters      []MeterOut     `json:"meters" doc:"Every meter of the period. queries counts one-shot queries (envs.query) and model_tokens their model calls' tokens."`
}

// UsageOutput is GET /v1/usage.
type UsageOutput struct {
	Body UsageBody
}

// Register adds usage.get and the admin verbs.
func (u *UsageRoutes) Register(a huma.API, d *Deps) {
	if u.Source == nil {
		u.Source = &usage.Source{DB: d.DB}
	}
	Declare(a, Verb[struct{}, UsageOutput]{
		Name:    "usage.get",
		Method:  http.MethodGet,
		Path:    "/v1/usage",
		Summary: "Usage this period",
		Description: "Task-minutes used against the plan allowance, and every meter of the current period (a calendar " +
			"month in UTC unless usage.period says otherwise) as `{name, used, limit, unit}`. Read from the durable " +
			"records (sessions and environments), so it is exact: a session's open time — open to close, or to its " +
			"idle deadline when it expired, or to now while open — rounded up to the whole second.",
		Tags:     []string{"usage"},
		Security: WorkspaceKeyAuth(),
		Handler:  u.get,
	})
	u.registerAdmin(a, d)
}

func (u *UsageRoutes) now() time.Time {
	if u.Now != nil {
		return u.Now()
	}
	return time.Now()
}

func (u *UsageRoutes) get(ctx context.Context, _ *struct{}) (*UsageOutput, error) {
	ws := PrincipalFrom(ctx).Workspace
	r, err := u.Source.Read(ctx, ws, u.now())
	if err != nil {
		return nil, err
	}
	return &UsageOutput{Body: usageBody(r, ws.CardOnFile)}, nil
}

func usageBody(r *usage.Reading, card bool) UsageBody {
	limit := func(v float64) *float64 {
		if v <= 0 {
			return nil
		}
		return &v
	}
	b := UsageBody{PeriodStart: r.Start, PeriodEnd: r.End, At: r.At.UTC(), Plan: r.Plan, CardOnFile: card,
		Meters: make([]MeterOut, 0, len(r.Meters))}
	for _, m := range r.Meters {
		b.Meters = append(b.Meters, MeterOut{Name: m.Name, Env: m.Env, Used: m.Used, Limit: limit(m.Limit), Unit: m.Unit})
		if m.Name == usage.MeterTaskMinutes {
			b.TaskMinutes = TaskMinutesOut{Used: m.Used, Limit: limit(m.Limit), Seconds: r.TaskSeconds}
		}
	}
	return b
}
