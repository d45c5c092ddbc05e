package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
	"github.com/uptrace/bun"
)

// firstUserMessage is a trace's first user message.
func firstUserMessage(tr trace.Trace) string {
	for _, m := range tr.Messages {
		if m.Role == trace.RoleUser && m.Content != nil {
			return *m.Content
		}
	}
	return ""
}

// openDevState opens a `doppel dev` data dir's state as the process would: its SQLite database (migrated, with
// the workspace of key bootstrapped) and its local blob store. The caller closes the database.
func openDevState(t *testing.T, dir, key string) (*bun.DB, *schema.Workspace, *blob.Local) {
	t.Helper()
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: schema.DriverSQLite, DSN: "file:" + filepath.Join(dir, "doppel.db")})
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db); err != nil {
		db.Close()
		t.Fatal(err)
	}
	ws, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: key})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	blobs, err := blob.NewLocal(filepath.Join(dir, "blobs"))
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	return db, ws, blobs
}

// seedUnscheduledBatch stores tau-retail's traces in a fresh data dir the way collect does, but without scheduling
// a rebuild: the state a process leaves when it dies between the batch's commit and the scheduling.
func seedUnscheduledBatch(t *testing.T, dir, key string) trace.Batch {
	t.Helper()
	ctx := context.Background()
	data, err := sampledata.Read(e2eRetailTraces)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ingest.Decode(data, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, ws, blobs := openDevState(t, dir, key)
	defer db.Close()
	enc, err := ingest.EncodeBlob(&parsed.Batch)
	if err != nil {
		t.Fatal(err)
	}
	bkey := blob.ContentKey("batches/"+ws.ID, enc)
	if err := blobs.Put(ctx, bkey, bytes.NewReader(enc), int64(len(enc)), ingest.BlobContentType); err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, parsed.Batch.Project)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.InsertTraceBatch(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: bkey, Bytes: int64(len(data))}, parsed.TraceIDs()); err != nil {
		t.Fatal(err)
	}
	return parsed.Batch
}

// TestE2ESessions: a batch whose rebuild was never scheduled is built once the stack starts; then the tool plane
// works end to end, on a real child-process twin over its HTTP RPC and on `doppel dev`'s default in-process twin
// reached directly: wake, open, calls that replay a real trace, the session read and transcript, close with the
// token revoked at once.
func TestE2ESessions(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	for _, drv := range []string{"process", "inproc"} {
		t.Run(drv, func(t *testing.T) { e2eSessions(t, drv) })
	}
}

func e2eSessions(t *testing.T, twinDriver string) {
	dir := t.TempDir()
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	batch := seedUnscheduledBatch(t, dir, m.Plaintext)
	s := startE2EStack(t, dir, m.Plaintext, e2eFreeAddr(t), e2eFreeAddr(t), e2eFreeAddr(t), "--twin-driver", twinDriver)
	const slug = "tau2-retail"

	e2ePoll(t, 10*time.Minute, time.Second, "the missed rebuild", func() (bool, string) {
		var env struct {
			Status string `json:"status"`
		}
		s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
		return env.Status == "ready", env.Status + " " + s.e2eBuildsState(slug)
	})

	e2ePoll(t, 2*time.Minute, 100*time.Millisecond, "wake", func() (bool, string) {
		st, body := s.try(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, "")
		if st != http.StatusOK && st != http.StatusAccepted {
			t.Fatalf("wake: %d %s", st, body)
		}
		return st == http.StatusOK, string(body)
	})
	var env struct {
		TwinState string `json:"twin_state"`
	}
	s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
	if env.TwinState != "ready" {
		t.Errorf("twin_state after wake = %q, want ready", env.TwinState)
	}
	if twinDriver == "process" {
		e2eWakeAfterTwinDied(t, s, dir, slug)
	}

	type opened struct {
		SessionToken string `json:"session_token"`
		WorldHash    string `json:"world_hash"`
		SessionID    string `json:"sessionId"`
		Token        string `json:"token"`
		Receipts     struct {
			Seed      int64  `json:"seed"`
			WorldHash string `json:"worldHash"`
		} `json:"receipts"`
	}
	open := func() opened {
		var o opened
		s.call(t, http.MethodPost, "/v1/envs/"+slug+"/sessions", strings.NewReader(`{"seed": 7, "recordOutputs": true}`),
			"application/json", http.StatusCreated, &o)
		if !strings.HasPrefix(o.Token, "ms_") || o.Token != o.SessionToken || o.WorldHash != o.Receipts.WorldHash || o.Receipts.Seed != 7 {
			t.Fatalf("open answer = %+v", o)
		}
		return o
	}
	a, b := open(), open()
	if a.WorldHash != b.WorldHash {
		t.Errorf("same seed, different worlds: %s vs %s", a.WorldHash, b.WorldHash)
	}

	// Replay the first trace's calls in session a and compare with the recorded answers.
	var calls []trace.Call
	for _, tr := range batch.Traces {
		if calls = trace.Calls(tr); len(calls) >= 4 {
			break
		}
	}
	agree := 0
	for _, c := range calls {
		body, _ := json.Marshal(map[string]any{"name": c.Tool, "arguments": json.RawMessage(c.RawArgs), "requestor": "assistant"})
		st, data := s.try(http.MethodPost, "/v1/sessions/"+a.SessionID+"/call", a.Token, bytes.NewReader(body), "application/json")
		if st != http.StatusOK {
			t.Fatalf("call %s: %d %s", c.Tool, st, data)
		}
		var res struct {
			Content, Fidelity, Rung, CallID string
			Error                           bool
		}
		if err := json.Unmarshal(data, &res); err != nil {
			t.Fatal(err)
		}
		if res.Fidelity == "" || res.Rung == "" {
			t.Errorf("call %s: no fidelity or rung: %s", c.Tool, data)
		}
		if sameAnswer(res.Content, c.Result) {
			agree++
		}
	}
	t.Logf("replayed %d calls of one trace in a session: %d answered exactly as recorded", len(calls), agree)
	if agree == 0 {
		t.Errorf("none of %d replayed calls matched its recording", len(calls))
	}

	// Session b is isolated: a's token cannot reach it.
	if st, body := s.try(http.MethodGet, "/v1/sessions/"+b.SessionID, a.Token, nil, ""); st != http.StatusNotFound {
		t.Errorf("a's token on b: %d %s, want 404", st, body)
	}
	var read struct {
		NCalls    int            `json:"n_calls"`
		StateHash string         `json:"state_hash"`
		Fidelity  map[string]int `json:"fidelity"`
	}
	s.call(t, http.MethodGet, "/v1/sessions/"+a.SessionID, nil, "", http.StatusOK, &read)
	if read.NCalls != len(calls) || !strings.HasPrefix(read.StateHash, "sha256:") {
		t.Errorf("session read = %+v, want %d calls", read, len(calls))
	}
	// A one-shot query through the whole stack: replay mode (no model is configured), its session opened by the
	// session-open workflow, its own QueryWorkflow on the dev server; seed 7 and no instructions give a's world.
	var q struct {
		ID            string `json:"id"`
		Status        string `json:"status"`
		Mode          string `json:"mode"`
		WorldHash     string `json:"world_hash"`
		NSpans        int    `json:"n_spans"`
		Response      string `json:"response"`
		ReplayedTrace string `json:"replayed_trace"`
	}
	qbody, _ := json.Marshal(map[string]any{"input": firstUserMessage(batch.Traces[0]), "seed": 7})
	s.call(t, http.MethodPost, "/v1/envs/"+slug+"/query", bytes.NewReader(qbody), "application/json", http.StatusOK, &q)
	if q.Status != "succeeded" || q.Mode != "replay" || q.WorldHash != a.WorldHash || q.NSpans < 2 || q.Response == "" || q.ReplayedTrace == "" {
		t.Errorf("query = %+v (session world %s)", q, a.WorldHash)
	}
	s.call(t, http.MethodGet, "/v1/queries/"+q.ID, nil, "", http.StatusOK, nil)
	transcript := s.call(t, http.MethodGet, "/v1/sessions/"+a.SessionID+"/transcript", nil, "", http.StatusOK, nil)
	if !strings.Contains(string(transcript), calls[0].Tool) {
		t.Errorf("transcript lacks %s: %s", calls[0].Tool, transcript)
	}

	// doppel bench against this stack: sessions, replayed calls, the raw round trip beside them.
	var bench bytes.Buffer
	err = run(context.Background(), []string{"bench", "--url", s.apiURL, "--key", s.key, "--env", slug,
		"--traces", sampledata.File(t, e2eRetailTraces), "--sessions", "2", "--rate", "50", "--duration", "1s",
		"--seed-instructions", "2 orders with status pending"},
		nil, &bench, io.Discard)
	if err != nil {
		t.Fatalf("doppel bench: %v\n%s", err, bench.String())
	}
	for _, want := range []string{"raw GET /healthz at 50/s", "session open (2 seeded,", " 0 failed", "[cpu: server ", "B_twin"} {
		if !strings.Contains(bench.String(), want) {
			t.Errorf("bench output lacks %q:\n%s", want, bench.String())
		}
	}
	t.Logf("doppel bench:\n%s", bench.String())

	var del struct {
		Existed bool `json:"existed"`
	}
	st, data := s.try(http.MethodDelete, "/v1/sessions/"+a.SessionID, a.Token, nil, "")
	if st != http.StatusOK || json.Unmarshal(data, &del) != nil || !del.Existed {
		t.Fatalf("delete: %d %s", st, data)
	}
	if st, body := s.try(http.MethodPost, "/v1/sessions/"+a.SessionID+"/call", a.Token, strings.NewReader(`{"name":"x","arguments":{}}`), "application/json"); st != http.StatusUnauthorized {
		t.Errorf("closed session's token: %d %s, want 401", st, body)
	}
	// A graceful stop of doppel dev stops the child-process twins it started (issue 13: they ran on, with nothing
	// to reap them until the next start).
	if twinDriver == "process" {
		s.stop(t)
		d, err := driver.NewProcess(driver.ProcessOptions{StateDir: filepath.Join(dir, "twins")})
		if err != nil {
			t.Fatal(err)
		}
		if hs, err := d.List(context.Background()); err != nil || len(hs) != 0 {
			t.Errorf("after a graceful stop, %d twin processes still run (%v): %+v", len(hs), err, hs)
		}
	}
}

// sameAnswer is the fidelity comparison: JSON-equal when both parse as JSON, else text-equal.
func sameAnswer(got, want string) bool {
	var g, w any
	if json.Unmarshal([]byte(got), &g) == nil && json.Unmarshal([]byte(want), &w) == nil {
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		return bytes.Equal(gb, wb)
	}
	return got == want
}

// chatServer speaks the OpenAI chat-completions protocol on loopback: the stand-in for the paid model API a
// deployment configures. It answers every request with answer().
func chatServer(t *testing.T, answer func() string) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			http.Error(w, `{"error":{"message":"no such route"}}`, http.StatusNotFound)
			return
		}
		mu.Lock()
		content := answer()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-e2e", "object": "chat.completion", "model": "e2e-model",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": content}}},
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestE2EModelSeeding: with a model configured, seed instructions the twin's parser cannot read become rows made
// by the model, in a real child-process twin; the receipts say seeded and the rows are in the session's world.
func TestE2EModelSeeding(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	userTable := ""
	model := chatServer(t, func() string {
		return `{"rows":{"` + userTable + `":[{"user_id":"ada_lovelace_1815","email":"ada@analytical.example"}]},"note":""}`
	})
	dir := t.TempDir()
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	seedUnscheduledBatch(t, dir, m.Plaintext)
	s := startE2EStack(t, dir, m.Plaintext, e2eFreeAddr(t), e2eFreeAddr(t), e2eFreeAddr(t),
		"--model-base-url", model.URL+"/v1", "--model-name", "e2e-model", "--model-api-key", "not-a-real-key",
		"--twin-driver", "process")
	const slug = "tau2-retail"
	var build string
	e2ePoll(t, 10*time.Minute, time.Second, "the build", func() (bool, string) {
		var env struct {
			Status      string `json:"status"`
			ActiveBuild *struct {
				ID string `json:"id"`
			} `json:"active_build"`
		}
		s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
		if env.ActiveBuild != nil {
			build = env.ActiveBuild.ID
		}
		return env.Status == "ready", env.Status
	})
	var report struct {
		Build struct {
			Tables []struct{ Name, Key string } `json:"tables"`
		} `json:"build"`
	}
	s.call(t, http.MethodGet, "/v1/envs/"+slug+"/builds/"+build+"/report", nil, "", http.StatusOK, &report)
	for _, tb := range report.Build.Tables {
		if tb.Key == "user_id" {
			userTable = tb.Name
		}
	}
	if userTable == "" {
		t.Fatalf("no table keyed by user_id in %+v", report.Build.Tables)
	}

	var o struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
		Receipts  struct {
			Seeded bool    `json:"seeded"`
			Note   *string `json:"note"`
		} `json:"receipts"`
		Pinned map[string][]string `json:"pinned"`
	}
	s.call(t, http.MethodPost, "/v1/envs/"+slug+"/sessions",
		strings.NewReader(`{"seedInstructions": "a customer called Ada Lovelace who writes programs for engines", "seed": 1815}`),
		"application/json", http.StatusCreated, &o)
	if !o.Receipts.Seeded || o.Receipts.Note != nil || len(o.Pinned[userTable]) != 1 || o.Pinned[userTable][0] != "ada_lovelace_1815" {
		t.Fatalf("open answer: %+v", o)
	}
	st, data := s.try(http.MethodPost, "/v1/sessions/"+o.SessionID+"/call", o.Token,
		strings.NewReader(`{"name": "get_user_details", "arguments": {"user_id": "ada_lovelace_1815"}}`), "application/json")
	if st != http.StatusOK || !strings.Contains(string(data), "ada@analytical.example") {
		t.Fatalf("call on the model-seeded user: %d %s", st, data)
	}
}

// e2eWakeAfterTwinDied kills the ready twin's process (as docker rm -f removes a container): the next wake answers
// 202 booting, not the stale 200 ready, and a later one 200 with a new twin (issue 21).
func e2eWakeAfterTwinDied(t *testing.T, s *e2eStack, dir, slug string) {
	d, err := driver.NewProcess(driver.ProcessOptions{StateDir: filepath.Join(dir, "twins")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hs, err := d.List(ctx)
	if err != nil || len(hs) != 1 {
		t.Fatalf("twins before the kill: %+v %v, want one", hs, err)
	}
	dead := hs[0]
	if err := syscall.Kill(dead.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st, body := s.try(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, ""); st != http.StatusAccepted ||
		!strings.Contains(string(body), `"booting"`) {
		t.Errorf("wake after the twin died: %d %s, want 202 booting", st, body)
	}
	e2ePoll(t, 2*time.Minute, 100*time.Millisecond, "wake after the restart", func() (bool, string) {
		st, body := s.try(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, "")
		return st == http.StatusOK, string(body)
	})
	hs, err = d.List(ctx)
	alive := 0
	for _, h := range hs {
		if h.ID == dead.ID {
			continue
		}
		if st, err := d.Inspect(ctx, h); err == nil && st.State == driver.StateReady {
			alive++
		}
	}
	if err != nil || alive != 1 {
		t.Errorf("twins after the restart: %+v %v, want one new ready twin", hs, err)
	}
}
