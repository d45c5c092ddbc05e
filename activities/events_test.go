package activities

import (
	"context"
	"slices"
	"testing"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

type kicked struct{ ids []string }

func (k *kicked) Kick(ids []string) { k.ids = append(k.ids, ids...) }

// Build events are recorded in the transaction that finishes the build, once however often the activity runs (a
// retry after a lost answer), and their deliveries are kicked after it commits. env.ready is told when the
// environment enters ready, not on every later build; a failed build is build.failed.
func TestBuildEvents(t *testing.T) {
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db := schematest.Open(t, driver)
			ws, _ := store.CreateWorkspace(ctx, db, "acme")
			env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
			if err != nil {
				t.Fatal(err)
			}
			ep := &schema.WebhookEndpoint{WorkspaceID: ws.ID, URL: "https://hooks.example.com/", Secret: webhook.NewSecret()}
			if err := store.CreateEndpoint(ctx, db, ep); err != nil {
				t.Fatal(err)
			}
			k := &kicked{}
			b := &Builds{DB: db, Events: &EventLog{DB: db, Dispatch: k}}
			build := func() string {
				id, err := b.QueueBuild(ctx, env.ID)
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			first, second, third := build(), build(), build()
			for range 2 { // the second run is a retry: nothing more is recorded
				if err := b.ActivateBuild(ctx, BuildPlan{EnvID: env.ID, BuildID: first}, Inferred{BundleHash: "sha256:1"}, SelfChecked{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.ActivateBuild(ctx, BuildPlan{EnvID: env.ID, BuildID: second}, Inferred{BundleHash: "sha256:2"}, SelfChecked{}); err != nil {
				t.Fatal(err)
			}
			if err := b.FailBuild(ctx, env.ID, third, "inference: no tools"); err != nil {
				t.Fatal(err)
			}
			evs, err := store.ListEvents(ctx, db, ws.ID, "", "", 100)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for i := len(evs) - 1; i >= 0; i-- {
				got = append(got, evs[i].Type+" "+evs[i].Subject)
			}
			want := []string{events.BuildSucceeded + " " + first, events.EnvReady + " " + first,
				events.BuildSucceeded + " " + second, events.BuildFailed + " " + third}
			if !slices.Equal(got, want) {
				t.Fatalf("events %q, want %q", got, want)
			}
			if len(k.ids) != 4 {
				t.Errorf("kicked %d deliveries, want 4", len(k.ids))
			}
		})
	}
}
