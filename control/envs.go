package control

import (
	"context"
	"errors"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// Envs is the service of a workspace's environments.
type Envs struct {
	DB bun.IDB
}

// List answers the workspace's environments, newest first.
func (e *Envs) List(ctx context.Context, workspaceID string) ([]schema.Environment, error) {
	return store.ListEnvs(ctx, e.DB, workspaceID)
}

// Get answers the environment slug of the workspace and its active build (nil when it has none, or when that
// build's row is gone).
func (e *Envs) Get(ctx context.Context, workspaceID, slug string) (*schema.Environment, *schema.Build, error) {
	env, err := envBySlug(ctx, e.DB, workspaceID, slug)
	if err != nil {
		return nil, nil, err
	}
	if env.ActiveBuildID == "" {
		return env, nil, nil
	}
	b, err := store.GetBuild(ctx, e.DB, workspaceID, env.ActiveBuildID)
	switch {
	case err == nil:
		return env, b, nil
	case errors.Is(err, store.ErrNotFound):
		return env, nil, nil
	}
	return nil, nil, err
}

// Lookup answers the environment slug of the workspace.
func (e *Envs) Lookup(ctx context.Context, workspaceID, slug string) (*schema.Environment, error) {
	return envBySlug(ctx, e.DB, workspaceID, slug)
}

// envBySlug answers the environment slug of the workspace, or NotFound naming it.
func envBySlug(ctx context.Context, db bun.IDB, workspaceID, slug string) (*schema.Environment, error) {
	env, err := store.GetEnv(ctx, db, workspaceID, slug)
	if err != nil {
		return nil, storeError(err, "environment "+slug)
	}
	return env, nil
}

// Active answers the environment slug of the workspace and its active build; an environment with no build yet is
// not ready.
func (e *Envs) Active(ctx context.Context, workspaceID, slug string) (*schema.Environment, *schema.Build, error) {
	env, err := e.Lookup(ctx, workspaceID, slug)
	if err != nil {
		return nil, nil, err
	}
	b, err := activeBuild(ctx, e.DB, env)
	if err != nil {
		return nil, nil, err
	}
	return env, b, nil
}

// activeBuild answers env's active build; an environment with no build yet is not ready.
func activeBuild(ctx context.Context, db bun.IDB, env *schema.Environment) (*schema.Build, error) {
	if env.ActiveBuildID == "" {
		return nil, &toolplane.Error{Kind: toolplane.NotReady,
			Detail: "environment " + env.Slug + " has no build yet (status " + env.Status + ")"}
	}
	b, err := store.GetBuild(ctx, db, env.WorkspaceID, env.ActiveBuildID)
	if err != nil {
		return nil, storeError(err, "build "+env.ActiveBuildID)
	}
	return b, nil
}
