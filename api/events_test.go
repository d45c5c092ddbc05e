package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

// Session events are recorded by the tool plane with the change: session.opened with the open, session.closed
// with the close, session.expired with the reaper's expiry; each with a delivery to a subscribed endpoint. A close
// of a closed session records nothing more. With events off, nothing is recorded.
func TestSessionEvents(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		ev := &activities.EventLog{}
		p := newPlane(t, driver, shopBundle(t), planeOptions{events: ev, idle: time.Hour})
		ev.DB = p.db
		ep := &schema.WebhookEndpoint{WorkspaceID: p.ws.ID, URL: "https://hooks.example.com/", Secret: webhook.NewSecret(),
			EventTypes: events.SessionOpened + "," + events.SessionExpired}
		if err := store.CreateEndpoint(bg, p.db, ep); err != nil {
			t.Fatal(err)
		}
		a := p.open(map[string]any{"seed": 1})
		b := p.open(map[string]any{"seed": 2})
		for range 2 {
			if code, out := p.do(http.MethodDelete, "/v1/sessions/"+a.ID, p.key, nil); code != http.StatusOK {
				t.Fatalf("close: %d %v", code, out)
			}
		}
		expired, _, err := p.tp.Reap(bg, time.Now().Add(2*time.Hour), time.Hour, 0)
		if err != nil || len(expired) != 1 || expired[0] != b.ID {
			t.Fatalf("reap: %v %v", expired, err)
		}
		evs, err := store.ListEvents(bg, p.db, p.ws.ID, "", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i := len(evs) - 1; i >= 0; i-- {
			var d events.SessionData
			if err := json.Unmarshal(evs[i].Data, &d); err != nil {
				t.Fatal(err)
			}
			if d.Env != p.env.Slug || d.EnvID != p.env.ID || d.BuildID != p.build.ID {
				t.Errorf("%s data %+v", evs[i].Type, d)
			}
			got = append(got, evs[i].Type+" "+d.SessionID)
		}
		want := []string{"session.opened " + a.ID, "session.opened " + b.ID, "session.closed " + a.ID, "session.expired " + b.ID}
		if len(got) != len(want) {
			t.Fatalf("events %q, want %q", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("events %q, want %q", got, want)
			}
		}
		// The endpoint takes opened and expired only: three deliveries.
		ds, err := store.ListDeliveries(bg, p.db, ep.ID, "", 100)
		if err != nil || len(ds) != 3 {
			t.Fatalf("deliveries %d (%v), want 3", len(ds), err)
		}

		off := newPlane(t, driver, shopBundle(t), planeOptions{})
		s := off.open(map[string]any{"seed": 1})
		off.do(http.MethodDelete, "/v1/sessions/"+s.ID, off.key, nil)
		if evs, _ := store.ListEvents(bg, off.db, off.ws.ID, "", "", 10); len(evs) != 0 {
			t.Errorf("events off recorded %d events", len(evs))
		}
	})
}
