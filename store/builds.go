package store

import (
	"context"
	"fmt"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twinstate"
)

// CreateBuild inserts a build for b.EnvID over the environment's current inputs: b.UploadKey is set to the
// environment's inputs key ("" when it has none), read in the same transaction as the insert, so every build
// (a rebuild after collected traces included) records the inputs it used. It fills ID, WorkspaceID (from the
// environment), Status (queued) and the times when they are empty.
func CreateBuild(ctx context.Context, db bun.IDB, b *schema.Build) error {
	return inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		env, err := GetEnvByID(ctx, tx, b.EnvID)
		if err != nil {
			return fmt.Errorf("store: create build: %w", err)
		}
		b.UploadKey = env.InputsKey
		return insertBuild(ctx, tx, env, b)
	})
}

// CreateBuildWithInputs makes inputsKey the environment's current inputs and inserts build b over them
// (b.UploadKey = inputsKey), in one transaction. prevKey is the inputs the caller read and built inputsKey from:
// when another build replaced them meanwhile, it fails with ErrConflict and changes nothing.
func CreateBuildWithInputs(ctx context.Context, db bun.IDB, b *schema.Build, prevKey, inputsKey string) error {
	return inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		res, err := tx.NewUpdate().Model((*schema.Environment)(nil)).
			Set("inputs_key = ?", inputsKey).Set("updated_at = ?", now()).
			Where("id = ? AND inputs_key = ?", b.EnvID, prevKey).Exec(ctx)
		if err != nil {
			return wrap(err, "set inputs of env %q", b.EnvID)
		}
		env, err := GetEnvByID(ctx, tx, b.EnvID)
		if err != nil {
			return fmt.Errorf("store: create build: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("store: create build: env %q: %w: its inputs changed since they were read", b.EnvID, ErrConflict)
		}
		b.UploadKey = inputsKey
		return insertBuild(ctx, tx, env, b)
	})
}

func insertBuild(ctx context.Context, db bun.IDB, env *schema.Environment, b *schema.Build) error {
	if b.WorkspaceID != "" && b.WorkspaceID != env.WorkspaceID {
		return fmt.Errorf("store: create build: env %q: %w", b.EnvID, ErrNotFound)
	}
	b.WorkspaceID = env.WorkspaceID
	if b.ID == "" {
		b.ID = schema.NewID(schema.PrefixBuild)
	}
	if b.Status == "" {
		b.Status = schema.BuildQueued
	}
	t := now()
	if b.CreatedAt.IsZero() {
		b.CreatedAt = t
	}
	b.UpdatedAt = t
	if _, err := db.NewInsert().Model(b).Exec(ctx); err != nil {
		return wrap(err, "create build for env %q", b.EnvID)
	}
	return nil
}

// GetBuild returns a workspace's build; another workspace's build is ErrNotFound.
func GetBuild(ctx context.Context, db bun.IDB, workspaceID, id string) (*schema.Build, error) {
	b := new(schema.Build)
	if err := db.NewSelect().Model(b).Where("id = ? AND workspace_id = ?", id, workspaceID).Scan(ctx); err != nil {
		return nil, wrap(err, "get build %q", id)
	}
	return b, nil
}

// GetBuildByID returns a build whatever its workspace (for workers, not for requests).
func GetBuildByID(ctx context.Context, db bun.IDB, id string) (*schema.Build, error) {
	b := new(schema.Build)
	if err := db.NewSelect().Model(b).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get build %q", id)
	}
	return b, nil
}

// ActiveTwinBuild returns the environment's active build as twins name it, or an error wrapping ErrNotFound when it
// has none.
func ActiveTwinBuild(ctx context.Context, db bun.IDB, env *schema.Environment) (twinstate.Build, error) {
	if env.ActiveBuildID == "" {
		return twinstate.Build{}, fmt.Errorf("environment %s has no active build: %w", env.ID, ErrNotFound)
	}
	b, err := GetBuildByID(ctx, db, env.ActiveBuildID)
	if err != nil {
		return twinstate.Build{}, err
	}
	return TwinBuildOf(b), nil
}

// TwinBuildOf names a build row's bundle as twins name it.
func TwinBuildOf(b *schema.Build) twinstate.Build {
	return twinstate.Build{BuildID: b.ID, BundleKey: b.BundleKey, BundleHash: b.BundleHash}
}

// ListBuilds returns an environment's builds, newest first; limit ≤ 0 means all.
func ListBuilds(ctx context.Context, db bun.IDB, envID string, limit int) ([]schema.Build, error) {
	builds := []schema.Build{}
	q := db.NewSelect().Model(&builds).Where("env_id = ?", envID).Order("created_at DESC", "id DESC")
	if limit > 0 {
		q = q.Limit(int64(limit))
	}
	if err := q.Scan(ctx); err != nil {
		return nil, wrap(err, "list builds of env %q", envID)
	}
	return builds, nil
}

// UpdateBuild writes the named columns of b (all mutable columns when none are named) and stamps updated_at.
func UpdateBuild(ctx context.Context, db bun.IDB, b *schema.Build, columns ...string) error {
	b.UpdatedAt = now()
	q := db.NewUpdate().Model(b).WherePK()
	if len(columns) > 0 {
		q = q.Column(append(columns, "updated_at")...)
	} else {
		q = q.ExcludeColumn("id", "env_id", "workspace_id", "created_at")
	}
	res, err := q.Exec(ctx)
	if err != nil {
		return wrap(err, "update build %q", b.ID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: update build %q: %w", b.ID, ErrNotFound)
	}
	return nil
}

// EnvsNeedingBuild returns the ids of environments holding a batch of new traces that no build was queued after:
// traces whose rebuild was never scheduled (a process that died between the batch's commit and the scheduling).
func EnvsNeedingBuild(ctx context.Context, db bun.IDB) ([]string, error) {
	var ids []string
	err := db.NewSelect().Model((*schema.Environment)(nil)).Column("id").
		Where("EXISTS (SELECT 1 FROM trace_batches AS tb WHERE tb.env_id = environment.id AND tb.n_traces > 0 "+
			"AND NOT EXISTS (SELECT 1 FROM builds AS b WHERE b.env_id = environment.id AND b.created_at >= tb.created_at))").
		Order("id").Scan(ctx, &ids)
	if err != nil {
		return nil, wrap(err, "environments needing a build")
	}
	return ids, nil
}
