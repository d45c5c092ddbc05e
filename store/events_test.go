package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// Pruning deletes old events with their finished deliveries and attempts, and keeps an old event whose delivery
// is still pending (its retries continue) and every recent one. A replayed dedup key records nothing.
func TestPruneEvents(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		ws, err := store.CreateWorkspace(ctx, db, "acme")
		if err != nil {
			t.Fatal(err)
		}
		ep := &schema.WebhookEndpoint{WorkspaceID: ws.ID, URL: "https://hooks.example.com/", Secret: "whsec_x"}
		if err := store.CreateEndpoint(ctx, db, ep); err != nil {
			t.Fatal(err)
		}
		record := func(dedup string) (*schema.Event, string) {
			ev, _ := store.NewEvent(ws.ID, "session.opened", "ses_1", dedup, map[string]string{"session_id": "ses_1"})
			ids, err := store.RecordEvent(ctx, db, ev)
			if err != nil || len(ids) != 1 {
				t.Fatalf("record: %v %v", ids, err)
			}
			return ev, ids[0]
		}
		done, doneD := record("a")
		pending, _ := record("b")
		recent, recentD := record("c")
		if ids, err := store.RecordEvent(ctx, db, func() *schema.Event { e, _ := store.NewEvent(ws.ID, "session.opened", "ses_1", "a", nil); return e }()); err != nil || ids != nil {
			t.Fatalf("a repeated dedup key recorded deliveries %v (%v)", ids, err)
		}
		for _, id := range []string{doneD, recentD} {
			d, _ := store.GetDelivery(ctx, db, "", id)
			if err := store.RecordAttempt(ctx, db, d, &schema.WebhookAttempt{Reason: "auto", StatusCode: 204}, true); err != nil {
				t.Fatal(err)
			}
		}
		cut := time.Now().Add(time.Hour)
		// Only "recent" is younger than the cut: move it past it.
		if _, err := db.NewUpdate().Model((*schema.Event)(nil)).Set("created_at = ?", cut.Add(time.Hour)).Where("id = ?", recent.ID).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := store.PruneEvents(ctx, db, cut, 100)
		if err != nil || n != 1 {
			t.Fatalf("pruned %d (%v), want 1", n, err)
		}
		if _, err := store.GetEvent(ctx, db, done.ID); err == nil {
			t.Error("the old delivered event is still there")
		}
		for _, ev := range []*schema.Event{pending, recent} {
			if _, err := store.GetEvent(ctx, db, ev.ID); err != nil {
				t.Errorf("event %s pruned: %v", ev.ID, err)
			}
		}
		if n, _ := db.NewSelect().Table("webhook_attempts").Count(ctx); n != 1 {
			t.Errorf("%d attempts left, want the recent event's 1", n)
		}
	})
}
