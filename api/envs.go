package api

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/schema"
)

// EnvSummary is an environment as GET /v1/envs lists it (spec §2.1, plus headline, twin state and times).
type EnvSummary struct {
	ID             string    `json:"id" doc:"Prefixed env_." example:"env_0123456789abcdef"`
	Name           string    `json:"name" doc:"The project name traces were collected under."`
	Slug           string    `json:"slug" doc:"Path identifier of the environment."`
	Status         string    `json:"status" enum:"collecting,building,ready,failed"`
	Framework      string    `json:"framework" doc:"Name of the agent framework."`
	NTraces        int64     `json:"n_traces" doc:"Number of distinct collected traces."`
	NTools         int64     `json:"n_tools" doc:"Number of tools."`
	SchemaSource   string    `json:"schema_source" example:"traces"`
	CoveredPct     float64   `json:"covered_pct" doc:"Percentage of recorded calls the twin answers as recorded."`
	SimulatedPct   float64   `json:"simulated_pct" doc:"Percentage of calls answered by simulation."`
	HasAgent       bool      `json:"has_agent"`
	Language       string    `json:"language" doc:"Agent language name."`
	Headline       string    `json:"headline" doc:"One line on the environment's state and fidelity."`
	TwinState      string    `json:"twin_state" enum:"stopped,booting,ready"`
	CollectedBytes int64     `json:"collected_bytes"`
	CreatedAt      time.Time `json:"created_at" format:"date-time"`
	UpdatedAt      time.Time `json:"updated_at" format:"date-time"`
}

// BuildSummary is a build as an environment read shows it.
type BuildSummary struct {
	ID         string     `json:"id" doc:"Prefixed bld_." example:"bld_0123456789abcdef"`
	Status     string     `json:"status" enum:"queued,running,succeeded,failed"`
	Progress   float64    `json:"progress" minimum:"0" maximum:"1"`
	Stage      string     `json:"stage"`
	BundleHash string     `json:"bundle_hash"`
	Error      string     `json:"error"`
	CreatedAt  time.Time  `json:"created_at" format:"date-time"`
	FinishedAt *time.Time `json:"finished_at" nullable:"true" format:"date-time"`
}

// EnvDetail is one environment as GET /v1/envs/{slug} returns it: the summary plus its active build.
type EnvDetail struct {
	EnvSummary
	ActiveBuild *BuildSummary `json:"active_build" doc:"The build the twin serves; null before the first successful build."`
}

// EnvSummaryOf renders an environment row.
func EnvSummaryOf(e *schema.Environment) EnvSummary {
	return EnvSummary{
		ID: e.ID, Name: e.Name, Slug: e.Slug, Status: e.Status, Framework: e.Framework,
		NTraces: e.NTraces, NTools: e.NTools, SchemaSource: e.SchemaSource, CoveredPct: e.CoveredPct,
		SimulatedPct: e.SimulatedPct, HasAgent: e.HasAgent, Language: e.Language, Headline: e.Headline,
		TwinState: e.TwinState, CollectedBytes: e.CollectedBytes, CreatedAt: e.CreatedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC(),
	}
}

// BuildSummaryOf renders a build row.
func BuildSummaryOf(b *schema.Build) *BuildSummary {
	s := &BuildSummary{ID: b.ID, Status: b.Status, Progress: b.Progress, Stage: b.Stage, BundleHash: b.BundleHash,
		Error: b.Error, CreatedAt: b.CreatedAt.UTC()}
	if b.FinishedAt != nil {
		t := b.FinishedAt.UTC()
		s.FinishedAt = &t
	}
	return s
}

// ListEnvsOutput is GET /v1/envs.
type ListEnvsOutput struct {
	Body []EnvSummary
}

// SlugInput names an environment in the path.
type SlugInput struct {
	Slug string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
}

// GetEnvOutput is GET /v1/envs/{slug}.
type GetEnvOutput struct {
	Body EnvDetail
}

func registerEnvs(a huma.API, d *Deps) {
	svc := &control.Envs{DB: d.DB}
	Declare(a, Verb[struct{}, ListEnvsOutput]{
		Name:        "envs.list",
		Method:      http.MethodGet,
		Path:        "/v1/envs",
		Summary:     "List environments",
		Description: "The workspace's environments, newest first.",
		Tags:        []string{"envs"},
		Security:    WorkspaceKeyAuth(),
		Handler: func(ctx context.Context, _ *struct{}) (*ListEnvsOutput, error) {
			p := PrincipalFrom(ctx)
			envs, err := svc.List(ctx, p.Workspace.ID)
			if err != nil {
				return nil, err
			}
			out := &ListEnvsOutput{Body: make([]EnvSummary, 0, len(envs))}
			for i := range envs {
				out.Body = append(out.Body, EnvSummaryOf(&envs[i]))
			}
			return out, nil
		},
	})

	Declare(a, Verb[SlugInput, GetEnvOutput]{
		Name:    "envs.get",
		Method:  http.MethodGet,
		Path:    "/v1/envs/{slug}",
		Summary: "Show an environment",
		Description: "One environment: the summary fields, its active build, twin state and headline. " +
			"A slug of another workspace answers 404.",
		Tags:     []string{"envs"},
		Security: WorkspaceKeyAuth(),
		Handler: func(ctx context.Context, in *SlugInput) (*GetEnvOutput, error) {
			p := PrincipalFrom(ctx)
			env, active, err := svc.Get(ctx, p.Workspace.ID, in.Slug)
			if err != nil {
				return nil, err
			}
			out := &GetEnvOutput{Body: EnvDetail{EnvSummary: EnvSummaryOf(env)}}
			if d.TwinState != nil {
				if st, err := d.TwinState(ctx, env.ID); err == nil {
					out.Body.TwinState = st
				} else {
					loggerFrom(ctx).WarnContext(ctx, "live twin state", "env", env.ID, "error", err)
				}
			}
			if active != nil {
				out.Body.ActiveBuild = BuildSummaryOf(active)
			}
			return out, nil
		},
	})
	nullableRef(a.OpenAPI(), "EnvDetail", "active_build")
}
