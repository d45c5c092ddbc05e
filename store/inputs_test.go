package store_test

import (
	"errors"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// Builds record the environment's current inputs; replacing them is a compare-and-swap done with the row's insert.
func TestBuildInputs(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
		if err != nil {
			t.Fatal(err)
		}
		build := func(step string, b *schema.Build, wantKey string) {
			t.Helper()
			got, err := store.GetBuildByID(ctx, db, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			e, err := store.GetEnvByID(ctx, db, env.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.UploadKey != wantKey || b.UploadKey != wantKey || e.InputsKey != wantKey && wantKey != "" {
				t.Errorf("%s: build used %q (row %q), env inputs %q; want %q", step, b.UploadKey, got.UploadKey, e.InputsKey, wantKey)
			}
		}

		plain := &schema.Build{EnvID: env.ID, UploadKey: "uploads/ignored"}
		if err := store.CreateBuild(ctx, db, plain); err != nil {
			t.Fatal(err)
		}
		build("a build before any inputs", plain, "")

		up := &schema.Build{EnvID: env.ID}
		if err := store.CreateBuildWithInputs(ctx, db, up, "", "uploads/a"); err != nil {
			t.Fatal(err)
		}
		build("a build with new inputs", up, "uploads/a")
		re := &schema.Build{EnvID: env.ID}
		if err := store.CreateBuild(ctx, db, re); err != nil {
			t.Fatal(err)
		}
		build("a rebuild", re, "uploads/a")

		// Inputs read before another build replaced them are refused, and nothing is written.
		stale := &schema.Build{EnvID: env.ID}
		if err := store.CreateBuildWithInputs(ctx, db, stale, "", "uploads/b"); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("stale inputs: %v, want ErrConflict", err)
		}
		if n, _ := db.NewSelect().Model((*schema.Build)(nil)).Count(ctx); n != 3 {
			t.Errorf("%d builds after the refused one, want 3", n)
		}
		build("after the refused build", re, "uploads/a")
		missing := &schema.Build{EnvID: "env_nope"}
		if err := store.CreateBuildWithInputs(ctx, db, missing, "", "uploads/b"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing env: %v, want ErrNotFound", err)
		}
	})
}
