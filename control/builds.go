package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/envinputs"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// inputsAttempts bounds how often Start starts over when a concurrent build replaced the inputs it read.
const inputsAttempts = 3

// BuildStarter starts the build workflow for a queued build row.
type BuildStarter interface {
	StartBuild(ctx context.Context, workspaceID, envID, buildID string) (workflowID string, err error)
}

// Builds is the service of an environment's builds.
type Builds struct {
	DB      bun.IDB
	Blobs   blob.Store
	Starter BuildStarter
	// Log answers the logger of a call's context (nil: not logged).
	Log func(context.Context) *slog.Logger
}

// List answers the environment's builds, newest first (at most 100).
func (s *Builds) List(ctx context.Context, workspaceID, slug string) ([]schema.Build, error) {
	env, err := envBySlug(ctx, s.DB, workspaceID, slug)
	if err != nil {
		return nil, err
	}
	return store.ListBuilds(ctx, s.DB, env.ID, 100)
}

// Get answers a build of the environment slug, with the environment.
func (s *Builds) Get(ctx context.Context, workspaceID, slug, id string) (*schema.Environment, *schema.Build, error) {
	env, err := envBySlug(ctx, s.DB, workspaceID, slug)
	if err != nil {
		return nil, nil, err
	}
	b, err := store.GetBuild(ctx, s.DB, workspaceID, id)
	if err != nil || b.EnvID != env.ID {
		return nil, nil, notFound("build " + id + " not found in environment " + env.Slug)
	}
	return env, b, nil
}

// Start queues a build of env and starts its workflow. With parts (nil: none given), the parts replace the current
// inputs' (infer.Upload.With), the result is validated as a whole and stored, and it becomes the environment's
// current inputs in the transaction that creates the build row; inputs that do not validate are refused naming the
// part, and change nothing. A workflow that cannot start marks the build failed and answers unavailable.
func (s *Builds) Start(ctx context.Context, env *schema.Environment, parts *infer.Upload) (*schema.Build, error) {
	b := &schema.Build{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Status: schema.BuildQueued, Stage: "queued"}
	if err := s.queue(ctx, env, parts, b); err != nil {
		return nil, err
	}
	wid, err := s.Starter.StartBuild(ctx, env.WorkspaceID, env.ID, b.ID)
	if err != nil {
		b.Status, b.Stage, b.Error = schema.BuildFailed, "failed", "could not start: "+err.Error()
		_ = store.UpdateBuild(ctx, s.DB, b, "status", "stage", "error")
		return nil, unavailable("temporal: " + err.Error())
	}
	b.WorkflowID = wid
	if err := store.UpdateBuild(ctx, s.DB, b, "workflow_id"); err != nil {
		return nil, err
	}
	return b, nil
}

// queue creates build row b over the environment's inputs, with parts as Start says.
func (s *Builds) queue(ctx context.Context, env *schema.Environment, parts *infer.Upload, b *schema.Build) error {
	if parts == nil {
		return store.CreateBuild(ctx, s.DB, b)
	}
	what := "environment " + env.Slug
	for attempt := 1; ; attempt++ {
		cur, err := envinputs.Read(ctx, s.Blobs, env.InputsKey)
		if err != nil {
			return err
		}
		next := cur.With(*parts)
		if _, err := next.Options(); err != nil {
			return InputsError(err)
		}
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("encode build inputs: %w", err)
		}
		key, err := blob.PutContent(ctx, s.Blobs, "uploads/", data, "application/json")
		if err != nil {
			if s.Log != nil {
				s.Log(ctx).WarnContext(ctx, "build: store inputs", slog.Any("error", err))
			}
			return unavailable("the blob store is not answering; no build was started, retry")
		}
		err = store.CreateBuildWithInputs(ctx, s.DB, b, env.InputsKey, key)
		if !errors.Is(err, store.ErrConflict) || attempt == inputsAttempts {
			return storeError(err, what)
		}
		// Another build replaced the inputs since they were read: start over from the new ones.
		if env, err = store.GetEnvByID(ctx, s.DB, b.EnvID); err != nil {
			return storeError(err, what)
		}
	}
}

// InputsError is the refusal of inputs that do not validate, located at the part the message names (body.tools,
// body.code.<tool>, body.config.bindings.<tool>, …).
func InputsError(err error) error {
	loc, msg := "body", TrimBadInput(err)
	if field, rest, ok := strings.Cut(msg, ": "); ok && !strings.Contains(field, " ") {
		loc, msg = "body."+field, rest
	}
	return &toolplane.Error{Kind: toolplane.Invalid, Field: loc, Detail: msg}
}

// TrimBadInput is err's message without infer's "bad input" prefix.
func TrimBadInput(err error) string {
	return strings.TrimPrefix(err.Error(), infer.ErrBadInput.Error()+": ")
}
