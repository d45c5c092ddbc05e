package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	metering "github.com/doppel-dev/doppel/usage"

	"net/http/httptest"
)

func TestUsageCLI(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	const boot = "mk_live_clitestclitestclitestclitest0123"
	ws, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: boot})
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	// One closed session of 15 minutes this period: a quarter of a 60-minute plan.
	opened := schema.Now().Add(-20 * time.Minute)
	closed := opened.Add(15 * time.Minute)
	s := &schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: env.ID, WorkspaceID: ws.ID, TokenHash: "h", Status: schema.SessionClosed,
		CreatedAt: opened, LastUsedAt: opened, ExpiresAt: opened.Add(time.Hour), ClosedAt: &closed}
	if _, err := db.NewInsert().Model(s).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	src := &metering.Source{DB: db, Plans: metering.Plans{Default: "hour", ByName: map[string]metering.Plan{"hour": {TaskMinutes: 60, OpenSessions: 4}}}}
	h, _ := api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){(&api.UsageRoutes{Source: src}).Register}})
	srv := httptest.NewServer(h)
	defer srv.Close()

	var out, errb bytes.Buffer
	if err := run(ctx, []string{"usage"}, []string{"DOPPEL_URL=" + srv.URL, "DOPPEL_KEY=" + boot}, &out, &errb); err != nil {
		t.Fatalf("usage: %v (%s)", err, errb.String())
	}
	got := out.String()
	quarter := "║" + strings.Repeat("█", 6) + strings.Repeat("░", 18) + "║"
	for _, want := range []string{"plan hour", "Task-minutes: 15 of 60 (900 seconds)", "task_minutes", quarter, "25%", "open_sessions", "tool_calls", "no limit"} {
		if !strings.Contains(got, want) {
			t.Errorf("usage output lacks %q:\n%s", want, got)
		}
	}
	t.Logf("\n%s", got)
}
