package api

import (
	"context"
	"net/http"
	"reflect"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twinstate"
)

// WakeRoutes serve POST /v1/envs/{slug}/wake.
type WakeRoutes struct {
	Plane *toolplane.Plane
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
	if wr.Plane == nil {
		wr.Plane = toolplane.New(toolplane.Options{DB: d.DB})
	}
	Declare(a, Verb[SlugInput, WakeOutput]{
		Name:    "envs.wake",
		Method:  http.MethodPost,
		Path:    "/v1/envs/{slug}/wake",
		Summary: "Wake an environment's twin",
		Description: "Starts the twin of the environment's active build without opening a session. Answers 202 while " +
			"it boots (poll again) and 200 once it is ready. 409 notReady when the environment has no build yet; 503 " +
			"when the twin cannot be started (e.g. the Docker engine is unreachable), with the reason.",
		Tags:     []string{"envs"},
		Security: WorkspaceKeyAuth(),
		Status:   http.StatusOK,
		Responses: map[string]*huma.Response{
			"202": {Description: "The twin is booting: poll again.", Content: map[string]*huma.MediaType{
				"application/json": {Schema: a.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[TwinInfo](), true, "TwinInfo")},
			}},
		},
		Handler: func(ctx context.Context, in *SlugInput) (*WakeOutput, error) {
			w, err := wr.Plane.Wake(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug)
			if err != nil {
				return nil, err
			}
			status := http.StatusAccepted
			if w.State == twinstate.Ready {
				status = http.StatusOK
			}
			return &WakeOutput{Status: status, Body: TwinInfo{Env: w.Env, State: w.State, TwinState: w.State,
				BuildID: w.BuildID, BuildIDB: w.BuildID}}, nil
		},
	})
}
