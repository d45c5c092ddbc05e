package store_test

import (
	"fmt"
	"sort"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

func TestEnvsNeedingBuild(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		batch := func(env *schema.Environment, ids ...string) {
			t.Helper()
			b := &schema.TraceBatch{EnvID: env.ID, BlobKey: "batches/" + env.ID + fmt.Sprint(ids), Bytes: 10}
			if _, err := store.InsertTraceBatch(ctx, db, b, ids); err != nil {
				t.Fatal(err)
			}
		}
		build := func(env *schema.Environment) {
			t.Helper()
			if err := store.CreateBuild(ctx, db, &schema.Build{EnvID: env.ID, WorkspaceID: ws.ID, Status: schema.BuildQueued}); err != nil {
				t.Fatal(err)
			}
		}
		want := func(step string, envs ...*schema.Environment) {
			t.Helper()
			got, err := store.EnvsNeedingBuild(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, e := range envs {
				ids = append(ids, e.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(sortedIDs(ids)) {
				t.Errorf("%s: got %v, want %v", step, got, sortedIDs(ids))
			}
		}

		empty, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "empty")
		a, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "a")
		b, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "b")
		_ = empty
		want("no traces anywhere")
		batch(a, "t1", "t2")
		batch(b, "u1")
		want("new traces, no build", a, b)
		build(a)
		want("a built after its batch", b)
		batch(a, "t1", "t2") // only duplicates: nothing new to build
		want("a resent batch adds nothing", b)
		batch(a, "t3")
		want("new traces after a's build", a, b)
		build(a)
		build(b)
		want("all built")
	})
}

func sortedIDs(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.Strings(out)
	return out
}
