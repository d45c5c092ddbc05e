package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twinstate"
)

// Slugify turns a project name into its environment slug by ingest.Slug's rule (lowercase ASCII letters and
// digits joined by single hyphens, at most 63 characters, a hash suffix when cut). A name with nothing slug-able
// gets "p-" and a short hash of the name, so distinct projects keep distinct slugs.
func Slugify(project string) string {
	if s := ingest.Slug(project); s != "" {
		return s
	}
	sum := sha256.Sum256([]byte(project))
	return "p-" + hex.EncodeToString(sum[:])[:10]
}

// UpsertEnvByProject returns the workspace's environment for a project, creating it
// (status collecting) on first sight. Safe under concurrent calls: one row per (workspace, slug).
func UpsertEnvByProject(ctx context.Context, db bun.IDB, workspaceID, project string) (*schema.Environment, error) {
	if strings.TrimSpace(project) == "" {
		return nil, fmt.Errorf("store: upsert env: %w: project is empty", ErrInvalid)
	}
	t := now()
	env := &schema.Environment{
		ID: schema.NewID(schema.PrefixEnv), WorkspaceID: workspaceID, Slug: Slugify(project), Name: project,
		Status: schema.EnvCollecting, SchemaSource: "traces", TwinState: twinstate.Stopped, CreatedAt: t, UpdatedAt: t,
	}
	err := db.NewInsert().Model(env).
		On("CONFLICT (workspace_id, slug) DO UPDATE").
		Set("updated_at = EXCLUDED.updated_at").
		Returning("*").
		Scan(ctx)
	if err != nil {
		return nil, wrap(err, "upsert env %q", project)
	}
	return env, nil
}

// GetEnv returns a workspace's environment by slug; another workspace's slug is ErrNotFound.
func GetEnv(ctx context.Context, db bun.IDB, workspaceID, slug string) (*schema.Environment, error) {
	env := new(schema.Environment)
	if err := db.NewSelect().Model(env).Where("workspace_id = ? AND slug = ?", workspaceID, slug).Scan(ctx); err != nil {
		return nil, wrap(err, "get env %q", slug)
	}
	return env, nil
}

// GetEnvByID returns an environment by id, whatever its workspace (for workers, not for requests).
func GetEnvByID(ctx context.Context, db bun.IDB, id string) (*schema.Environment, error) {
	env := new(schema.Environment)
	if err := db.NewSelect().Model(env).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get env %q", id)
	}
	return env, nil
}

// ListEnvs returns a workspace's environments, newest first.
func ListEnvs(ctx context.Context, db bun.IDB, workspaceID string) ([]schema.Environment, error) {
	envs := []schema.Environment{}
	err := db.NewSelect().Model(&envs).Where("workspace_id = ?", workspaceID).
		Order("created_at DESC", "id DESC").Scan(ctx)
	if err != nil {
		return nil, wrap(err, "list envs")
	}
	return envs, nil
}

// UpdateEnv writes the named columns of env (all columns when none are named) and stamps updated_at.
func UpdateEnv(ctx context.Context, db bun.IDB, env *schema.Environment, columns ...string) error {
	env.UpdatedAt = now()
	q := db.NewUpdate().Model(env).WherePK()
	if len(columns) > 0 {
		q = q.Column(append(columns, "updated_at")...)
	} else {
		q = q.ExcludeColumn("id", "workspace_id", "slug", "created_at")
	}
	res, err := q.Exec(ctx)
	if err != nil {
		return wrap(err, "update env %q", env.ID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: update env %q: %w", env.ID, ErrNotFound)
	}
	return nil
}

// SetTwinState records an environment's twin state and where it answers.
func SetTwinState(ctx context.Context, db bun.IDB, envID, state, endpoint string) error {
	switch state {
	case twinstate.Stopped, twinstate.Booting, twinstate.Ready:
	default:
		return fmt.Errorf("store: set twin state: %w: %q is not stopped|booting|ready", ErrInvalid, state)
	}
	res, err := db.NewUpdate().Model((*schema.Environment)(nil)).
		Set("twin_state = ?", state).Set("twin_endpoint = ?", endpoint).Set("updated_at = ?", now()).
		Where("id = ?", envID).Exec(ctx)
	if err != nil {
		return wrap(err, "set twin state of env %q", envID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: set twin state of env %q: %w", envID, ErrNotFound)
	}
	return nil
}
