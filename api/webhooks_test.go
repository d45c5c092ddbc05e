package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

type startRecorder struct {
	mu      sync.Mutex
	started []string // "id reason"
}

func (s *startRecorder) StartDelivery(_ context.Context, id, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = append(s.started, id+" "+reason)
	return nil
}

func TestWebhookVerbs(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		db := schematest.Open(t, driver)
		ws, _ := store.CreateWorkspace(bg, db, "acme")
		other, _ := store.CreateWorkspace(bg, db, "other")
		_, key, _ := store.CreateKey(bg, db, ws.ID, cred.KindWorkspace, "k")
		_, otherKey, _ := store.CreateKey(bg, db, other.ID, cred.KindWorkspace, "k")
		rec := &startRecorder{}
		allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
		wr := &api.WebhookRoutes{Guard: &webhook.Guard{Allow: allow}, Deliveries: rec}
		h, _ := api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){wr.Register}})
		do := func(method, path, key string, body any) *httptest.ResponseRecorder {
			var b []byte
			if body != nil {
				b, _ = json.Marshal(body)
			}
			r := httptest.NewRequest(method, path, bytes.NewReader(b))
			r.Header.Set("Authorization", "Bearer "+key)
			if body != nil {
				r.Header.Set("Content-Type", "application/json")
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}

		// Refused at create: forbidden addresses, bad schemes, unknown event types; nothing is stored.
		for _, tc := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"url": "http://169.254.169.254/latest/meta-data/"}, "body.url"},
			{map[string]any{"url": "http://10.1.2.3/"}, "body.url"},
			{map[string]any{"url": "http://[fe80::1]/"}, "body.url"},
			{map[string]any{"url": "http://[::10.0.0.1]/"}, "body.url"},
			{map[string]any{"url": "http://[::ffff:0:10.0.0.1]/"}, "body.url"},
			{map[string]any{"url": "http://[::169.254.169.254]/"}, "body.url"},
			{map[string]any{"url": "file:///etc/passwd"}, "body.url"},
			{map[string]any{"url": "http://127.0.0.1:9/", "events": []string{"build.exploded"}}, "body.events"},
		} {
			e := wantEnvelope(t, do(http.MethodPost, "/v1/webhooks", key, tc.body), http.StatusUnprocessableEntity, "invalid")
			if !strings.HasPrefix(e.Detail, tc.field) {
				t.Errorf("%v: detail %q does not name %s", tc.body, e.Detail, tc.field)
			}
		}
		if eps, _ := store.ListEndpoints(bg, db, ws.ID); len(eps) != 0 {
			t.Fatalf("refused creates stored %d endpoints", len(eps))
		}

		w := do(http.MethodPost, "/v1/webhooks", key, map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"session.opened", "session.closed"}})
		if w.Code != http.StatusCreated {
			t.Fatalf("create: %d %s", w.Code, w.Body)
		}
		var created api.CreatedWebhook
		_ = json.Unmarshal(w.Body.Bytes(), &created)
		if !webhook.ValidSecret(created.Secret) || len(created.Events) != 2 {
			t.Fatalf("created %+v", created)
		}
		w = do(http.MethodGet, "/v1/webhooks", key, nil)
		if w.Code != http.StatusOK || strings.Contains(w.Body.String(), created.Secret) || !strings.Contains(w.Body.String(), created.ID) {
			t.Fatalf("list shows the secret or misses the endpoint: %s", w.Body)
		}
		if w = do(http.MethodGet, "/v1/webhooks", otherKey, nil); strings.Contains(w.Body.String(), created.ID) {
			t.Fatalf("another workspace lists the endpoint: %s", w.Body)
		}
		for _, r := range []struct{ method, path string }{
			{http.MethodPatch, "/v1/webhooks/" + created.ID}, {http.MethodDelete, "/v1/webhooks/" + created.ID},
			{http.MethodPost, "/v1/webhooks/" + created.ID + "/test"}, {http.MethodGet, "/v1/webhooks/" + created.ID + "/deliveries"},
		} {
			var body any
			if r.method == http.MethodPatch {
				body = map[string]any{"disabled": true}
			}
			wantEnvelope(t, do(r.method, r.path, otherKey, body), http.StatusNotFound, "notFound")
		}

		// The filter decides which events make deliveries; update changes it and checks a new URL again.
		ep, _ := store.GetEndpoint(bg, db, ws.ID, created.ID)
		record := func(typ string) []string {
			ev, _ := store.NewEvent(ws.ID, typ, "x", "", map[string]string{})
			ids, err := store.RecordEvent(bg, db, ev)
			if err != nil {
				t.Fatal(err)
			}
			return ids
		}
		if n := len(record(events.SessionOpened)); n != 1 {
			t.Errorf("session.opened made %d deliveries, want 1", n)
		}
		if n := len(record(events.BuildSucceeded)); n != 0 {
			t.Errorf("build.succeeded made %d deliveries to an endpoint filtering it out", n)
		}
		for _, u := range []string{"http://192.168.0.1/", "http://[::10.0.0.1]/", "http://[::ffff:0:10.0.0.1]/"} {
			wantEnvelope(t, do(http.MethodPatch, "/v1/webhooks/"+ep.ID, key, map[string]any{"url": u}), http.StatusUnprocessableEntity, "invalid")
		}
		if w = do(http.MethodPatch, "/v1/webhooks/"+ep.ID, key, map[string]any{"events": []string{}}); w.Code != http.StatusOK {
			t.Fatalf("update: %d %s", w.Code, w.Body)
		}
		if n := len(record(events.BuildSucceeded)); n != 1 {
			t.Errorf("after clearing the filter build.succeeded made %d deliveries", n)
		}

		// test: a webhook.test delivery for this endpoint only, started with reason test.
		var q api.DeliveryQueued
		w = do(http.MethodPost, "/v1/webhooks/"+ep.ID+"/test", key, nil)
		if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &q) != nil || !strings.HasPrefix(q.EventID, "evt_") {
			t.Fatalf("test: %d %s", w.Code, w.Body)
		}
		if len(rec.started) != 1 || rec.started[0] != q.DeliveryID+" test" {
			t.Errorf("started %v", rec.started)
		}
		var ds []api.WebhookDelivery
		w = do(http.MethodGet, "/v1/webhooks/"+ep.ID+"/deliveries", key, nil)
		if err := json.Unmarshal(w.Body.Bytes(), &ds); err != nil || len(ds) != 3 || ds[0].EventType != events.WebhookTest {
			t.Fatalf("deliveries %d %s", w.Code, w.Body)
		}
		// A pending delivery is not redelivered (its retries continue); a finished one is, once.
		wantEnvelope(t, do(http.MethodPost, "/v1/webhooks/"+ep.ID+"/deliveries/"+ds[0].ID+"/redeliver", key, nil), http.StatusConflict, "conflict")
		if err := store.FinishDelivery(bg, db, ds[0].ID, "gave up"); err != nil {
			t.Fatal(err)
		}
		if w = do(http.MethodPost, "/v1/webhooks/"+ep.ID+"/deliveries/"+ds[0].ID+"/redeliver", key, nil); w.Code != http.StatusAccepted {
			t.Fatalf("redeliver: %d %s", w.Code, w.Body)
		}
		if last := rec.started[len(rec.started)-1]; last != ds[0].ID+" redeliver" {
			t.Errorf("redeliver started %q", last)
		}
		wantEnvelope(t, do(http.MethodPost, "/v1/webhooks/"+ep.ID+"/deliveries/"+ds[0].ID+"/redeliver", otherKey, nil), http.StatusNotFound, "notFound")

		// events.list: newest first, filtered by type; an unknown type names the query field.
		var evs []api.Event
		w = do(http.MethodGet, "/v1/events?type=build.succeeded", key, nil)
		if err := json.Unmarshal(w.Body.Bytes(), &evs); err != nil || len(evs) != 2 || evs[0].Timestamp.Before(evs[1].Timestamp) {
			t.Fatalf("events: %d %s", w.Code, w.Body)
		}
		wantEnvelope(t, do(http.MethodGet, "/v1/events?type=nope", key, nil), http.StatusUnprocessableEntity, "invalid")
		if w = do(http.MethodGet, "/v1/events", otherKey, nil); w.Body.String() != "[]\n" && w.Body.String() != "[]" {
			t.Errorf("another workspace sees events: %s", w.Body)
		}

		// Through tRPC (the CLI's transport) the PATCH verb is a mutation taking the path parameter in its input.
		c := trpcClient{t: t, h: h, token: key}
		if code, raw := c.mutation("webhooks.update", map[string]any{"id": ep.ID, "description": "via trpc", "disabled": true}); code != http.StatusOK ||
			!strings.Contains(string(raw), `"via trpc"`) || !strings.Contains(string(raw), `"disabled":true`) {
			t.Fatalf("trpc webhooks.update: %d %s", code, raw)
		}
		if n := len(record(events.SessionOpened)); n != 0 {
			t.Errorf("a disabled endpoint got %d new deliveries", n)
		}
		wantEnvelope(t, do(http.MethodPost, "/v1/webhooks/"+ep.ID+"/test", key, nil), http.StatusConflict, "conflict")

		// delete: the endpoint and its deliveries go; a second delete is 404.
		if w = do(http.MethodDelete, "/v1/webhooks/"+ep.ID, key, nil); w.Code != http.StatusOK {
			t.Fatalf("delete: %d %s", w.Code, w.Body)
		}
		if n, _ := db.NewSelect().Table("webhook_deliveries").Count(bg); n != 0 {
			t.Errorf("%d deliveries left after delete", n)
		}
		wantEnvelope(t, do(http.MethodDelete, "/v1/webhooks/"+ep.ID, key, nil), http.StatusNotFound, "notFound")
	})
}
