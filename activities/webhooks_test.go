package activities

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/internal/hooktest"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

// Deliver makes one attempt and logs it: a 2xx succeeds the delivery (a later run does nothing), anything else
// is a retryable failure with the status in the log; a disabled endpoint ends the delivery, a deleted one is done.
func TestDeliver(t *testing.T) {
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db := schematest.Open(t, driver)
			ws, _ := store.CreateWorkspace(ctx, db, "acme")
			rcv := hooktest.NewReceiver()
			defer rcv.Close()
			redirect := httptest.NewServer(http.RedirectHandler("http://169.254.169.254/", http.StatusFound))
			defer redirect.Close()
			allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
			w := &Webhooks{DB: db, Sender: webhook.NewSender(&webhook.Guard{Allow: allow}, 0)}
			newDelivery := func(url string) (*schema.WebhookEndpoint, string) {
				ep := &schema.WebhookEndpoint{WorkspaceID: ws.ID, URL: url, Secret: webhook.NewSecret(), EventTypes: events.SessionOpened}
				if err := store.CreateEndpoint(ctx, db, ep); err != nil {
					t.Fatal(err)
				}
				ev, _ := store.NewEvent(ws.ID, events.SessionOpened, "ses_1", "", events.SessionData{SessionID: "ses_1"})
				if _, err := store.RecordEvent(ctx, db, ev); err != nil {
					t.Fatal(err)
				}
				ds, err := store.ListDeliveries(ctx, db, ep.ID, "", 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("deliveries of %s: %v %v", ep.ID, ds, err)
				}
				return ep, ds[0].ID
			}
			attempts := func(id string) []schema.WebhookAttempt {
				as, err := store.ListAttempts(ctx, db, []string{id})
				if err != nil {
					t.Fatal(err)
				}
				return as[id]
			}

			ep, id := newDelivery(rcv.URL)
			rcv.SetSecret(ep.Secret)
			rcv.SetDown(true)
			err := w.Deliver(ctx, DeliverInput{DeliveryID: id})
			var appErr *temporal.ApplicationError
			if err == nil || !errors.As(err, &appErr) || appErr.Type() != ErrTypeDeliveryFailed || appErr.NonRetryable() {
				t.Fatalf("receiver down: %v, want a retryable attempt failure", err)
			}
			rcv.SetDown(false)
			if err := w.Deliver(ctx, DeliverInput{DeliveryID: id}); err != nil {
				t.Fatal(err)
			}
			if err := w.Deliver(ctx, DeliverInput{DeliveryID: id}); err != nil { // done: no third attempt
				t.Fatal(err)
			}
			as := attempts(id)
			if len(as) != 2 || as[0].StatusCode != http.StatusServiceUnavailable || as[1].StatusCode != http.StatusNoContent || as[1].N != 2 {
				t.Fatalf("attempts %+v", as)
			}
			d, _ := store.GetDelivery(ctx, db, "", id)
			if d.Status != schema.DeliverySucceeded || d.Attempts != 2 || d.FinishedAt == nil {
				t.Fatalf("delivery %+v", d)
			}
			if ms := rcv.Messages(); len(ms) != 1 || ms[0].Err != nil || ms[0].Type != events.SessionOpened {
				t.Fatalf("received %+v", ms)
			}

			// A redirect is a failed attempt, not followed to where it points.
			_, id = newDelivery(redirect.URL)
			if err := w.Deliver(ctx, DeliverInput{DeliveryID: id}); err == nil {
				t.Fatal("a redirect succeeded")
			}
			if as := attempts(id); len(as) != 1 || as[0].StatusCode != http.StatusFound {
				t.Fatalf("redirect attempts %+v", as)
			}

			// Disabled: the delivery ends without an attempt. Deleted: nothing to do.
			ep, id = newDelivery(rcv.URL)
			ep.Disabled = true
			if err := store.UpdateEndpoint(ctx, db, ep, "disabled"); err != nil {
				t.Fatal(err)
			}
			if err := w.Deliver(ctx, DeliverInput{DeliveryID: id}); err == nil || !errors.As(err, &appErr) || !appErr.NonRetryable() {
				t.Fatalf("disabled endpoint: %v, want a non-retryable error", err)
			}
			if _, err := store.DeleteEndpoint(ctx, db, ws.ID, ep.ID); err != nil {
				t.Fatal(err)
			}
			if err := w.Deliver(ctx, DeliverInput{DeliveryID: id}); err != nil {
				t.Fatalf("deleted endpoint: %v", err)
			}
		})
	}
}
