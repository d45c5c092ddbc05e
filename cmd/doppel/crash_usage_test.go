package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
)

// seedReadyEnv makes dir's SQLite metadata hold the bootstrap workspace (key) with an environment whose active
// build is a small hand-written bundle in dir's blob store: sessions open on it at once, with no build to wait for.
func seedReadyEnv(t *testing.T, dir, key string) string {
	t.Helper()
	ctx := context.Background()
	orderArg := json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`)
	b := &twin.Bundle{
		Format: twin.FormatVersion, SchemaSource: "provided", Clock: "2025-01-01T00:00:00Z",
		Tools: []twin.Tool{{Name: "get_order_details", Description: "Get an order.", InputSchema: orderArg, Binding: twin.BindingProvided,
			Rung: twin.RungProvided, Kind: twin.KindRead, Table: "orders", KeyArg: "order_id",
			Provided: "def handle(args):\n    row = world.get(\"orders\", args[\"order_id\"])\n    if row == None:\n        return error(\"Error: order not found\")\n    return row\n"}},
		Tables: []twin.Table{{Name: "orders", Key: "order_id", KeyInRow: true, KeyShape: "#W9999999", Rows: []twin.Row{
			{Key: "#W0000001", JSON: `{"order_id": "#W0000001", "status": "delivered"}`}}}},
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	db, ws, blobs := openDevState(t, dir, key)
	defer db.Close()
	bkey := blob.ContentKey("bundles", data)
	if err := blobs.Put(ctx, bkey, bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	build := &schema.Build{EnvID: env.ID, Status: schema.BuildSucceeded, BundleKey: bkey, BundleHash: twin.HashBytes(data)}
	if err := store.CreateBuild(ctx, db, build); err != nil {
		t.Fatal(err)
	}
	env.Status, env.ActiveBuildID = schema.EnvReady, build.ID
	if err := store.UpdateEnv(ctx, db, env, "status", "active_build_id"); err != nil {
		t.Fatal(err)
	}
	return env.Slug
}

// recordedUsage is what the durable records say, read straight from the rows, at a given moment: every
// session's billed seconds by the documented rule, and the journaled calls. It shares no code with the meters.
func recordedUsage(t *testing.T, dir string, at time.Time, idle time.Duration) (seconds map[string]int64, calls int64) {
	t.Helper()
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: schema.DriverSQLite, DSN: "file:" + filepath.Join(dir, "doppel.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sessions []schema.Session
	if err := db.NewSelect().Model(&sessions).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	seconds = map[string]int64{}
	for _, s := range sessions {
		var rows []schema.Call
		if err := db.NewSelect().Model(&rows).Where("session_id = ?", s.ID).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		calls += int64(len(rows))
		last := s.CreatedAt
		if s.LastUsedAt.After(last) {
			last = s.LastUsedAt
		}
		for _, c := range rows {
			if c.CreatedAt.After(last) {
				last = c.CreatedAt
			}
		}
		deadline := last.Add(idle)
		if s.ExpiresAt.After(deadline) {
			deadline = s.ExpiresAt
		}
		end := at
		if s.ClosedAt != nil {
			end = *s.ClosedAt
		}
		if deadline.Before(end) {
			end = deadline
		}
		seconds[s.ID] = int64((end.Sub(s.CreatedAt) + time.Second - 1) / time.Second)
	}
	return seconds, calls
}

type usageAnswer struct {
	At          time.Time `json:"at"`
	TaskMinutes struct {
		Used    float64 `json:"used"`
		Seconds int64   `json:"seconds"`
	} `json:"taskMinutes"`
	Meters []struct {
		Name string  `json:"name"`
		Used float64 `json:"used"`
	} `json:"meters"`
}

func (u usageAnswer) meter(name string) float64 {
	for _, m := range u.Meters {
		if m.Name == name {
			return m.Used
		}
	}
	return -1
}

// TestCrashUsage kills `doppel dev` (kill -9) with sessions open and calls journaled; after a restart GET
// /v1/usage equals what the durable records say, session by session summed, and stays so across a second kill once
// every session is closed: no session is billed twice, none lost.
func TestCrashUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("crash: builds and kills the real binary")
	}
	bin := crashBuild(t, t.TempDir())
	dir := t.TempDir()
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	slug := seedReadyEnv(t, dir, m.Plaintext)
	srv := &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t),
		env: []string{"DOPPEL_TWIN_DRIVER=inproc"}}
	hc := &http.Client{Timeout: time.Minute}
	do := func(method, path, token string, body any, want int, out any) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, srv.apiURL()+path, rd)
		req.Header.Set("Authorization", "Bearer "+token)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
		}
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	readUsage := func() usageAnswer {
		var u usageAnswer
		do(http.MethodGet, "/v1/usage", m.Plaintext, nil, http.StatusOK, &u)
		return u
	}
	check := func(stage string) usageAnswer {
		t.Helper()
		u := readUsage()
		secs, calls := recordedUsage(t, dir, u.At, time.Hour)
		var sum int64
		for _, s := range secs {
			sum += s
		}
		if u.TaskMinutes.Seconds != sum || u.TaskMinutes.Used != float64(sum)/60 || u.meter("tool_calls") != float64(calls) {
			t.Fatalf("%s: usage says %d s and %g calls; the records say %d s (%v) and %d calls", stage, u.TaskMinutes.Seconds, u.meter("tool_calls"), sum, secs, calls)
		}
		figure(t, "%s: usage %d task-seconds (%.4f task-minutes), %d calls = the records' sum over %d sessions", stage, sum, u.TaskMinutes.Used, calls, len(secs))
		return u
	}

	p := srv.start(t)
	type opened struct {
		ID    string `json:"sessionId"`
		Token string `json:"token"`
	}
	var sessions []opened
	for i := 0; i < 4; i++ {
		var o opened
		do(http.MethodPost, "/v1/envs/"+slug+"/sessions", m.Plaintext, map[string]any{"seed": i}, http.StatusCreated, &o)
		sessions = append(sessions, o)
	}
	answered := 0
	for i, s := range sessions {
		for k := 0; k <= i; k++ {
			do(http.MethodPost, "/v1/sessions/"+s.ID+"/call", s.Token, map[string]any{"name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}}, http.StatusOK, nil)
			answered++
		}
	}
	do(http.MethodDelete, "/v1/sessions/"+sessions[0].ID, sessions[0].Token, nil, http.StatusOK, nil)
	time.Sleep(1500 * time.Millisecond) // open time accrues
	before := check("before the kill")
	if before.meter("tool_calls") != float64(answered) || before.meter("open_sessions") != 3 {
		t.Fatalf("before the kill: %v calls, %v open; want %d and 3", before.meter("tool_calls"), before.meter("open_sessions"), answered)
	}

	p.kill(t) // kill -9 with three sessions open
	p = srv.start(t)
	time.Sleep(1200 * time.Millisecond) // the three sessions open at the kill go on accruing, by their rows
	after := check("after kill -9 and restart")
	if after.TaskMinutes.Seconds <= before.TaskMinutes.Seconds || after.meter("tool_calls") != float64(answered) {
		t.Fatalf("after the restart: %d s, %v calls; before: %d s, %d calls", after.TaskMinutes.Seconds, after.meter("tool_calls"), before.TaskMinutes.Seconds, answered)
	}
	// The sessions open at the kill are still open (their rows say so) and still usable; close them all.
	for _, s := range sessions[1:] {
		do(http.MethodDelete, "/v1/sessions/"+s.ID, m.Plaintext, nil, http.StatusOK, nil)
	}
	closed := check("all closed")
	p.kill(t)
	p = srv.start(t)
	time.Sleep(1100 * time.Millisecond)
	again := check("after a second kill -9, all closed")
	if again.TaskMinutes.Seconds != closed.TaskMinutes.Seconds || again.meter("tool_calls") != closed.meter("tool_calls") {
		t.Fatalf("closed sessions' usage moved across a kill: %d s then %d s", closed.TaskMinutes.Seconds, again.TaskMinutes.Seconds)
	}
	p.term(t)
}
