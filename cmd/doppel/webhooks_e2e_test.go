package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/internal/hooktest"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// TestWebhooksE2E runs the production shape (`doppel serve` and `doppel worker`, PostgreSQL, MinIO, a real
// Temporal server, process twins) with a webhook receiver that checks every signature with a verifier written
// from the Standard Webhooks text. A real flow — collect → build (one succeeds, one fails on a corrupt batch) →
// session open → close → idle expiry → twin idle stop — must deliver every event kind. Then the receiver goes down,
// more events happen, the worker is killed (-9) while their deliveries back off, and once the receiver is up every
// event arrives, duplicates with the same webhook-id.
func TestWebhooksE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("webhooks e2e: builds the binary and runs serve and worker processes")
	}
	temporalAddr := testenv.Temporal(t)
	be := realBackend(t, nil, nil)
	dir := t.TempDir()
	bin := crashBuild(t, dir)
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	rcv := hooktest.NewReceiver()
	defer rcv.Close()
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	s := &faultStack{t: t, bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), temporal: temporalAddr,
		env: append([]string{
			"DOPPEL_BOOTSTRAP_KEY=" + m.Plaintext,
			"DOPPEL_TEMPORAL_ADDRESS=" + temporalAddr,
			"DOPPEL_TEMPORAL_TASK_QUEUE=hooks-" + suffix,
			"DOPPEL_TWIN_DRIVER=process", "DOPPEL_TWIN_IDLE=6s",
			"DOPPEL_SESSION_IDLE=4s",
			"DOPPEL_COLLECT_REBUILD_DEBOUNCE=2s",
			"DOPPEL_WEBHOOKS_ALLOW_CIDRS=127.0.0.0/8",
			"DOPPEL_WEBHOOKS_BACKOFF_INITIAL=300ms", "DOPPEL_WEBHOOKS_BACKOFF_MAX=2s",
			"DOPPEL_WEBHOOKS_ATTEMPT_TIMEOUT=2s", "DOPPEL_WEBHOOKS_SWEEP_EVERY=1s",
			// The default 127.0.0.1:9464 would be any other worker's on this machine: a free port instead.
			"DOPPEL_METRICS_WORKER_ADDR=" + e2eFreeAddr(t),
		}, be.env...)}
	// The worker is killed (-9) on the way and at the end. The process twins it leaves running, which a next worker
	// would adopt, are stopped once every process of the stack is gone (cleanups run last first).
	t.Cleanup(func() { reapProcessTwins(t, dir) })
	migrate := exec.Command(bin, "migrate")
	migrate.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, s.env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("doppel migrate: %v\n%s", err, out)
	}
	s.api = s.start("serve")
	s.worker = s.start("worker")

	// Server-side request forgery: the metadata address and private ranges are refused at create.
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/hook", "http://[::1]:9/"} {
		if st, data, _ := s.do(http.MethodPost, "/v1/webhooks", s.key, map[string]any{"url": u}, nil); st != http.StatusUnprocessableEntity || !strings.Contains(string(data), "body.url") {
			t.Errorf("create %s: %d %s, want 422 naming body.url", u, st, data)
		}
	}
	var ep api.CreatedWebhook
	s.must(http.MethodPost, "/v1/webhooks", s.key, map[string]any{"url": rcv.URL + "/hooks", "description": "e2e"}, http.StatusCreated, &ep)
	if !strings.HasPrefix(ep.Secret, "whsec_") {
		t.Fatalf("secret %q", ep.Secret)
	}
	rcv.SetSecret(ep.Secret)

	// collect → build.succeeded, env.ready
	corpus := crashTraces(t)[:40]
	slug := hookCollect(t, s, "hooks-retail", corpus)
	// A second project whose only batch is corrupted in the blob store before its build runs → build.failed.
	broken := hookCollect(t, s, "hooks-broken", corpus[:3])
	db, err := schema.Open(context.Background(), schema.Options{Driver: be.driver, DSN: be.dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	benv, err := store.GetEnv(context.Background(), db, hookWorkspace(t, db), broken)
	if err != nil {
		t.Fatal(err)
	}
	batches, err := store.ListTraceBatches(context.Background(), db, benv.ID)
	if err != nil || len(batches) != 1 {
		t.Fatalf("batches of %s: %v %v", broken, batches, err)
	}
	garbage := []byte("not a gzip batch")
	if err := be.blobs.Put(context.Background(), batches[0].BlobKey, bytes.NewReader(garbage), int64(len(garbage)), "application/gzip"); err != nil {
		t.Fatal(err)
	}
	e2ePoll(t, 10*time.Minute, 300*time.Millisecond, "the retail build", func() (bool, string) {
		bs := s.builds(slug)
		return len(bs) > 0 && bs[0].Status == "succeeded", fmt.Sprintf("%+v", bs)
	})

	// session open (wakes the twin: twin.ready) → close; a second session left to expire; the twin then idles out.
	began := time.Now()
	var open1, open2 struct {
		SessionID string `json:"session_id"`
	}
	s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key, map[string]any{"seed": 1}, http.StatusCreated, &open1)
	opened := time.Now()
	s.must(http.MethodDelete, "/v1/sessions/"+open1.SessionID, s.key, nil, http.StatusOK, nil)
	closed := time.Now()
	s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key, map[string]any{"seed": 2}, http.StatusCreated, &open2)

	kinds := []string{"build.succeeded", "build.failed", "env.ready", "twin.ready", "twin.stopped",
		"session.opened", "session.closed", "session.expired"}
	got, ok := rcv.Wait(3*time.Minute, func(ms []hooktest.Message) bool {
		seen := map[string]bool{}
		for _, m := range ms {
			seen[m.Type] = true
		}
		for _, k := range kinds {
			if !seen[k] {
				return false
			}
		}
		return true
	})
	byKind := map[string][]hooktest.Message{}
	for _, m := range got {
		if m.Err != nil {
			t.Errorf("%s %s: signature: %v", m.Type, m.ID, m.Err)
		}
		byKind[m.Type] = append(byKind[m.Type], m)
	}
	if !ok {
		t.Fatalf("not every kind arrived within 3 minutes: %v", keysOf(byKind))
	}
	figure(t, "every event kind delivered and verified: %v (%d messages); session flow to last event %s",
		kinds, len(got), time.Since(began).Round(100*time.Millisecond))
	has := func(kind, field, want string) {
		t.Helper()
		for _, m := range byKind[kind] {
			if m.Data[field] == want {
				return
			}
		}
		t.Errorf("no %s with %s=%s: %+v", kind, field, want, byKind[kind])
	}
	for _, m := range got {
		switch {
		case m.Type == "session.opened" && m.Data["session_id"] == open1.SessionID:
			figure(t, "session.opened received %s after the open answered", m.At.Sub(opened).Round(time.Millisecond))
		case m.Type == "session.closed" && m.Data["session_id"] == open1.SessionID:
			figure(t, "session.closed received %s after the close answered", m.At.Sub(closed).Round(time.Millisecond))
		}
	}
	has("build.succeeded", "env", slug)
	has("env.ready", "env", slug)
	has("build.failed", "env", broken)
	has("session.opened", "session_id", open1.SessionID)
	has("session.closed", "session_id", open1.SessionID)
	has("session.expired", "session_id", open2.SessionID)
	has("twin.ready", "env", slug)
	has("twin.stopped", "env", slug)

	t.Run("test-and-redeliver", func(t *testing.T) { hookTestAndRedeliver(t, s, rcv, ep.ID) })
	t.Run("receiver-down-worker-killed", func(t *testing.T) { hookOutage(t, s, rcv, ep.ID, slug) })
	s.api.term(t)
	s.worker.term(t)
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func hookWorkspace(t *testing.T, db *bun.DB) string {
	t.Helper()
	var ws []schema.Workspace
	if err := db.NewSelect().Model(&ws).Scan(context.Background()); err != nil || len(ws) != 1 {
		t.Fatalf("workspaces: %v %v", ws, err)
	}
	return ws[0].ID
}

// hookCollect posts traces under project and answers the environment's slug.
func hookCollect(t *testing.T, s *faultStack, project string, traces any) string {
	t.Helper()
	var acc api.CollectAccepted
	s.must(http.MethodPost, "/api/collect", s.key, map[string]any{"project": project, "traces": traces}, http.StatusAccepted, &acc)
	return acc.Env
}

func (s *faultStack) deliveries(t *testing.T, endpoint string) []api.WebhookDelivery {
	t.Helper()
	var ds []api.WebhookDelivery
	s.must(http.MethodGet, "/v1/webhooks/"+endpoint+"/deliveries?limit=500", s.key, nil, http.StatusOK, &ds)
	return ds
}

// hookTestAndRedeliver: webhooks.test reaches the receiver; a redelivered event arrives again with its webhook-id.
func hookTestAndRedeliver(t *testing.T, s *faultStack, rcv *hooktest.Receiver, endpoint string) {
	var q api.DeliveryQueued
	s.must(http.MethodPost, "/v1/webhooks/"+endpoint+"/test", s.key, nil, http.StatusAccepted, &q)
	if _, ok := rcv.Wait(time.Minute, func(ms []hooktest.Message) bool {
		return slices.ContainsFunc(ms, func(m hooktest.Message) bool { return m.ID == q.EventID && m.Type == "webhook.test" && m.Err == nil })
	}); !ok {
		t.Fatalf("the test event %s did not arrive", q.EventID)
	}
	var succeeded *api.WebhookDelivery
	e2ePoll(t, time.Minute, 200*time.Millisecond, "a succeeded delivery", func() (bool, string) {
		for _, d := range s.deliveries(t, endpoint) {
			if d.Status == "succeeded" && d.EventType == "session.opened" {
				succeeded = &d
				return true, ""
			}
		}
		return false, "none yet"
	})
	before := 0
	for _, m := range rcv.Messages() {
		if m.ID == succeeded.EventID {
			before++
		}
	}
	s.must(http.MethodPost, "/v1/webhooks/"+endpoint+"/deliveries/"+succeeded.ID+"/redeliver", s.key, nil, http.StatusAccepted, &q)
	if q.EventID != succeeded.EventID {
		t.Fatalf("redeliver answered event %s, want %s", q.EventID, succeeded.EventID)
	}
	if _, ok := rcv.Wait(time.Minute, func(ms []hooktest.Message) bool {
		n := 0
		for _, m := range ms {
			if m.ID == succeeded.EventID && m.Err == nil {
				n++
			}
		}
		return n > before
	}); !ok {
		t.Fatalf("the redelivered event %s did not arrive again", succeeded.EventID)
	}
	// The attempt is logged just after the receiver answered it.
	e2ePoll(t, time.Minute, 200*time.Millisecond, "the redelivery logged", func() (bool, string) {
		for _, d := range s.deliveries(t, endpoint) {
			if d.ID == succeeded.ID {
				last := d.Log[len(d.Log)-1]
				return len(d.Log) >= 2 && last.Reason == "redeliver" && last.StatusCode == http.StatusNoContent && d.Status == "succeeded",
					fmt.Sprintf("%s %+v", d.Status, d.Log)
			}
		}
		return false, "delivery gone"
	})
}

// hookOutage: the receiver is down while sessions open and close; their deliveries back off; the worker is
// killed -9 and restarted meanwhile; once the receiver is up every event arrives.
func hookOutage(t *testing.T, s *faultStack, rcv *hooktest.Receiver, endpoint, slug string) {
	rcv.SetDown(true)
	const n = 10
	want := map[string]bool{} // "type session"
	for i := range n {
		var o struct {
			SessionID string `json:"session_id"`
		}
		s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key, map[string]any{"seed": 100 + i}, http.StatusCreated, &o)
		s.must(http.MethodDelete, "/v1/sessions/"+o.SessionID, s.key, nil, http.StatusOK, nil)
		want["session.opened "+o.SessionID], want["session.closed "+o.SessionID] = true, true
	}
	// Every one of them is being retried: at least one failed attempt each (503 from the receiver).
	e2ePoll(t, 2*time.Minute, 300*time.Millisecond, "a failed attempt of every delivery", func() (bool, string) {
		failing := 0
		for _, d := range s.deliveries(t, endpoint) {
			if d.Status == "pending" && d.Attempts > 0 && d.LastStatusCode == http.StatusServiceUnavailable {
				failing++
			}
		}
		return failing >= len(want), fmt.Sprintf("%d of %d failing", failing, len(want))
	})
	s.worker.kill(t)
	time.Sleep(time.Second)
	s.worker = s.start("worker")
	up := time.Now()
	rcv.SetDown(false)
	got, ok := rcv.Wait(3*time.Minute, func(ms []hooktest.Message) bool {
		seen := 0
		have := map[string]bool{}
		for _, m := range ms {
			k := m.Type + " " + fmt.Sprint(m.Data["session_id"])
			if want[k] && !have[k] {
				have[k] = true
				seen++
			}
		}
		return seen == len(want)
	})
	if !ok {
		t.Fatalf("not every event arrived after the outage: %d messages", len(got))
	}
	drained := time.Since(up)
	ids := map[string][]byte{}
	dups := 0
	for _, m := range got {
		if m.Err != nil {
			t.Errorf("%s %s: %v", m.Type, m.ID, m.Err)
		}
		if prev, seen := ids[m.ID]; seen {
			if want[m.Type+" "+fmt.Sprint(m.Data["session_id"])] {
				dups++
			}
			if !bytes.Equal(prev, m.Body) {
				t.Errorf("webhook-id %s arrived twice with different bodies", m.ID)
			}
		}
		ids[m.ID] = m.Body
	}
	// Each delivery is marked succeeded once its attempt's answer is recorded, just after the receiver answered.
	attempts := 0
	e2ePoll(t, time.Minute, 200*time.Millisecond, "every delivery succeeded", func() (bool, string) {
		attempts = 0
		var pending []string
		for _, d := range s.deliveries(t, endpoint) {
			attempts += int(d.Attempts)
			if d.Status != "succeeded" {
				pending = append(pending, d.ID+" "+d.EventType+" "+d.Status)
			}
		}
		return len(pending) == 0, strings.Join(pending, ", ")
	})
	figure(t, "receiver down for %d events with a worker kill -9: all %d arrived %s after it came up; %d of them twice (same webhook-id, same body); %d attempts logged over all deliveries",
		len(want), len(want), drained.Round(100*time.Millisecond), dups, attempts)
}
