package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/store"
)

// WakeRoutes serve POST /v1/envs/{slug}/wake.
type WakeRoutes struct {
	// Twins wakes environments' twins (the TwinWorkflow's wake update).
	Twins activities.TwinDirectory
}

// TwinInfo is a twin's state as the wake route answers it.
type TwinInfo struct {
	Env       string `json:"env" doc:"Environment slug."`
	State     string `json:"state" enum:"booting,ready" doc:"booting: poll again (202); ready: sessions open at once (200)."`
	TwinState string `json:"twin_state" enum:"booting,ready" doc:"The same, snake_case variant."`
	BuildID   string `json:"build_id" doc:"The build whose bundle the twin serves (the active build)."`
	BuildIDB  string `json:"buildId" doc:"The same, camelCase variant."`
}

// WakeOutput wraps TwinInfo with 200 or 202.
type WakeOutput struct {
	Status int
	Body   TwinInfo
}

// Register adds the wake route.
func (wr *WakeRoutes) Register(a huma.API, d *Deps) {
	huma.Register(a, huma.Operation{
		OperationID: "envs.wake",
		Method:      http.MethodPost,
		Path:        "/v1/envs/{slug}/wake",
		Summary:     "Wake an environment's twin",
		Description: "Starts the twin of the environment's active build without opening a session. Answers 202 while " +
			"it boots (poll again) and 200 once it is ready. 409 notReady when the environment has no build yet; 503 " +
			"when the twin cannot be started (e.g. the Docker engine is unreachable), with the reason.",
		Tags:          []string{"envs"},
		Security:      WorkspaceKeyAuth(),
		DefaultStatus: http.StatusOK,
		Responses: map[string]*huma.Response{
			"202": {Description: "The twin is booting: poll again."},
		},
	}, func(ctx context.Context, in *SlugInput) (*WakeOutput, error) {
		p := PrincipalFrom(ctx)
		env, err := store.GetEnv(ctx, d.DB, p.Workspace.ID, in.Slug)
		if err != nil {
			return nil, StoreError(err, "environment "+in.Slug)
		}
		active, err := activities.ActiveTwinBuild(ctx, d.DB, env)
		if errors.Is(err, store.ErrNotFound) {
			return nil, NotReady("environment %s has no build yet (status %s): nothing to wake", env.Slug, env.Status)
		}
		if err != nil {
			return nil, err
		}
		if wr.Twins == nil {
			return nil, Unavailable("no twin directory is configured")
		}
		st, err := wr.Twins.WakeTwin(ctx, activities.TwinWake{EnvID: env.ID, Active: active})
		if err != nil {
			return nil, Unavailable("waking the twin of %s: %v", env.Slug, err)
		}
		state := st.State
		status := http.StatusAccepted
		switch st.State {
		case activities.TwinStateReady:
			status = http.StatusOK
		case activities.TwinStateFailed:
			_ = store.SetTwinState(ctx, d.DB, env.ID, activities.TwinStateStopped, "")
			return nil, Unavailable("the twin of %s failed to start: %s", env.Slug, st.Error)
		default:
			state = activities.TwinStateBooting
		}
		if err := store.SetTwinState(ctx, d.DB, env.ID, state, st.Addr); err != nil {
			return nil, err
		}
		return &WakeOutput{Status: status, Body: TwinInfo{Env: env.Slug, State: state, TwinState: state,
			BuildID: active.BuildID, BuildIDB: active.BuildID}}, nil
	})
}
