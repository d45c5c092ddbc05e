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
)

// Issue #13: a build that fails says what failed, never where the server keeps its files; its reason is shown by
// GET /v1/envs/{slug}/builds/{id}.
func TestBuildErrorsNameNoPaths(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	root := filepath.Join(t.TempDir(), "blobs")
	blobs, err := blob.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := store.CreateWorkspace(ctx, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("a batch")
	key := blob.ContentKey("batches/"+ws.ID, data)
	if err := blobs.Put(ctx, key, bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := store.InsertTraceBatch(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: key, Bytes: 7}, []string{"t1"}); err != nil {
		t.Fatal(err)
	}
	// The batch's file is damaged on disk.
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			err = os.WriteFile(p, []byte("DPLBLOB1 damaged"), 0o644)
		}
		return err
	})

	b := &Builds{DB: db, Blobs: blobs}
	buildID, err := b.QueueBuild(ctx, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := b.PlanBuild(ctx, env.ID, buildID)
	if err != nil {
		t.Fatal(err)
	}
	var s testsuite.WorkflowTestSuite
	aenv := s.NewTestActivityEnvironment()
	aenv.RegisterActivity(b)
	_, err = aenv.ExecuteActivity(b.InferBundle, plan)
	if err == nil {
		t.Fatal("a build over a damaged batch succeeded")
	}
	if err := b.FailBuild(ctx, env.ID, buildID, err.Error()); err != nil {
		t.Fatal(err)
	}
	row, err := store.GetBuildByID(ctx, db, buildID)
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
