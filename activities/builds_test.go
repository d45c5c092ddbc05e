package activities

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/uptrace/bun"
)

// Issue #13: a build that fails says what failed, never where the server keeps its files; its reason is shown by
// GET /v1/envs/{slug}/builds/{id}.
func TestBuildErrorsNameNoPaths(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "blobs")
	db, blobs, env := buildFixture(t, root, "shop")
	key := storeBatch(t, db, blobs, env, []byte("a batch"), []string{"t1"})
	// The batch's file is damaged on disk.
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			err = os.WriteFile(p, []byte("DPLBLOB1 damaged"), 0o644)
		}
		return err
	})

	b := &Builds{DB: db, Blobs: blobs}
	plan := planBuild(t, b, env)
	var s testsuite.WorkflowTestSuite
	aenv := s.NewTestActivityEnvironment()
	aenv.RegisterActivity(b)
	_, err := aenv.ExecuteActivity(b.InferBundle, plan)
	if err == nil {
		t.Fatal("a build over a damaged batch succeeded")
	}
	if err := b.FailBuild(ctx, env.ID, plan.BuildID, err.Error()); err != nil {
		t.Fatal(err)
	}
	row, err := store.GetBuildByID(ctx, db, plan.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Error == "" || strings.Contains(row.Error, filepath.Dir(root)) {
		t.Errorf("build error %q names the blob store's directory", row.Error)
	}
	if !strings.Contains(row.Error, key) {
		t.Errorf("build error %q does not name the blob %s", row.Error, key)
	}
}

// buildFixture is a SQLite database with one workspace and an environment named project, and a local blob store
// at root: what a build's activities read from.
func buildFixture(t *testing.T, root, project string) (*bun.DB, *blob.Local, *schema.Environment) {
	t.Helper()
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	blobs, err := blob.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := store.CreateWorkspace(ctx, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, project)
	if err != nil {
		t.Fatal(err)
	}
	return db, blobs, env
}

// planBuild queues a build of env and plans it, as the build workflow's first activities do.
func planBuild(t *testing.T, b *Builds, env *schema.Environment) BuildPlan {
	t.Helper()
	ctx := context.Background()
	buildID, err := b.QueueBuild(ctx, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := b.PlanBuild(ctx, env.ID, buildID)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// storeBatch stores data as a trace batch of env holding the traces ids, as collect does, and returns its blob key.
func storeBatch(t *testing.T, db *bun.DB, blobs *blob.Local, env *schema.Environment, data []byte, ids []string) string {
	t.Helper()
	ctx := context.Background()
	key := blob.ContentKey("batches/"+env.WorkspaceID, data)
	if err := blobs.Put(ctx, key, bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := store.InsertTraceBatch(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: key, Bytes: int64(len(data))}, ids); err != nil {
		t.Fatal(err)
	}
	return key
}
