package toolplane

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

func TestReap(t *testing.T) {
	for _, d := range schematest.Drivers() {
		t.Run(d, func(t *testing.T) { testReapIdleSessions(t, d) })
	}
}

// reapEnv is a database with an environment whose active build has no running twin (the reaper drops no world).
func reapEnv(t *testing.T, driver string) (*bun.DB, *schema.Environment) {
	t.Helper()
	ctx := context.Background()
	db := schematest.Open(t, driver)
	ws, err := store.CreateWorkspace(ctx, db, "w")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "bank")
	if err != nil {
		t.Fatal(err)
	}
	b := &schema.Build{EnvID: env.ID, Status: schema.BuildSucceeded, BundleKey: "bundles/x", BundleHash: "sha256:x"}
	if err := store.CreateBuild(ctx, db, b); err != nil {
		t.Fatal(err)
	}
	env.ActiveBuildID, env.Status = b.ID, schema.EnvReady
	if err := store.UpdateEnv(ctx, db, env, "active_build_id", "status"); err != nil {
		t.Fatal(err)
	}
	return db, env
}

func testReapIdleSessions(t *testing.T, driver string) {
	ctx := context.Background()
	db, env := reapEnv(t, driver)
	a := New(Options{DB: db})
	open := func() *schema.Session {
		s := &schema.Session{EnvID: env.ID, BuildID: env.ActiveBuildID}
		if _, err := store.CreateSession(ctx, db, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	quiet, used, closed := open(), open(), open()
	if _, err := store.EndSession(ctx, db, closed.ID, schema.SessionClosed); err != nil {
		t.Fatal(err)
	}
	t0 := quiet.CreatedAt
	for seq, fid := range []string{schema.FidelityBTwin, schema.FidelityBReplayed} {
		c := schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: used.ID, Seq: int64(seq + 1), Tool: "get_account",
			Arguments: json.RawMessage(`{"id":"a1"}`), Error: seq == 1, Fidelity: fid, StateHash: "sha256:s" + fid,
			CreatedAt: t0.Add(50 * time.Minute)}
		if _, err := db.NewInsert().Model(&c).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Reap(ctx, t0, 0, 0); err == nil {
		t.Fatalf("idle 0: %v", err)
	}
	// 30 minutes in: nothing is due.
	expired, extended, err := a.Reap(ctx, t0.Add(30*time.Minute), time.Hour, 0)
	if err != nil || len(expired) != 0 || extended != 0 {
		t.Fatalf("early reap = %+v, %v", expired, err)
	}
	// 70 minutes in: quiet expires; used (last call at 50 minutes) gets its expiry moved to 110 minutes.
	expired, extended, err = a.Reap(ctx, t0.Add(70*time.Minute), time.Hour, 0)
	if err != nil || len(expired) != 1 || expired[0] != quiet.ID || extended != 1 {
		t.Fatalf("reap = %+v, %v", expired, err)
	}
	got, err := store.GetSessionByID(ctx, db, used.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schema.SessionOpen || !got.ExpiresAt.Equal(t0.Add(110*time.Minute)) {
		t.Fatalf("used session = %s expiring %v, want open until %v", got.Status, got.ExpiresAt, t0.Add(110*time.Minute))
	}
	got, err = store.GetSessionByID(ctx, db, quiet.ID)
	if err != nil || got.Status != schema.SessionExpired {
		t.Fatalf("quiet session = %+v, %v", got, err)
	}
	// 111 minutes in: used expires too, and its counters are snapshotted into its row.
	expired, extended, err = a.Reap(ctx, t0.Add(111*time.Minute), time.Hour, 0)
	if err != nil || len(expired) != 1 || expired[0] != used.ID {
		t.Fatalf("late reap = %+v, %v", expired, err)
	}
	got, err = store.GetSessionByID(ctx, db, used.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schema.SessionExpired || got.NCalls != 2 || got.NErrors != 1 || got.NBTwin != 1 || got.NBReplayed != 1 ||
		got.StateHash != "sha256:s"+schema.FidelityBReplayed {
		t.Fatalf("expired session row = %+v", got)
	}
	if s, _ := store.GetSessionByID(ctx, db, closed.ID); s.Status != schema.SessionClosed {
		t.Fatalf("closed session became %s", s.Status)
	}
}
