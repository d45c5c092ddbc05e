package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

var (
	repoRetailOnce   sync.Once
	repoRetailBundle []byte
	repoRetailTraces []trace.Trace
	repoRetailErr    error
)

// repoRetail builds the tau-retail bundle once per test binary from the repository's copy of the dev traces,
// which it answers sorted by id.
func repoRetail(t testing.TB) ([]byte, []trace.Trace) {
	t.Helper()
	repoRetailOnce.Do(func() {
		if repoRetailTraces, repoRetailErr = sampledata.Traces("retail"); repoRetailErr != nil {
			return
		}
		sort.Slice(repoRetailTraces, func(i, j int) bool { return repoRetailTraces[i].ID < repoRetailTraces[j].ID })
		b, _, err := infer.Build(repoRetailTraces, infer.Options{})
		if err != nil {
			repoRetailErr = err
			return
		}
		repoRetailBundle, repoRetailErr = b.Marshal()
	})
	if repoRetailErr != nil {
		t.Fatal(repoRetailErr)
	}
	return repoRetailBundle, repoRetailTraces
}

// holdTraces stores traces as a collected batch of the plane's environment.
func (p *mcpPlane) holdTraces(t testing.TB, traces []trace.Trace) {
	t.Helper()
	ctx := context.Background()
	data, err := ingest.EncodeBlob(&trace.Batch{Project: "tau2-retail", Traces: traces})
	if err != nil {
		t.Fatal(err)
	}
	key := blob.ContentKey("traces", data)
	if err := p.blobs.Put(ctx, key, bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(traces))
	for i, tr := range traces {
		ids[i] = tr.ID
	}
	if _, err := store.InsertTraceBatch(ctx, p.db, &schema.TraceBatch{EnvID: p.env.ID, BlobKey: key, Bytes: int64(len(data))}, ids); err != nil {
		t.Fatal(err)
	}
}

// TestSessionOpenFromTrace: sessions.open takes trace — one in the collect format, or the id of one the
// environment holds — over REST, tRPC, MCP and an environment's MCP address alike; the world is the one the trace
// saw (its receipts name the trace and hash the calls used; the same trace gives the same world hash), a held
// trace is replayed call by call, and bad traces are refused naming the field.
func TestSessionOpenFromTrace(t *testing.T) {
	bundle, traces := repoRetail(t)
	p := newMCPPlane(t, schema.DriverSQLite, bundle)
	tr := traces[0]
	p.holdTraces(t, traces[:3])

	byObject := p.open(map[string]any{"seed": 1, "trace": tr})
	rc, _ := byObject.Open["receipts"].(map[string]any)
	rt, _ := rc["trace"].(map[string]any)
	if rt == nil || rt["id"] != tr.ID || !strings.HasPrefix(str(rt["hash"]), "sha256:") || rt["used"].(float64) < 1 ||
		rt["firstWrite"] == "" || byObject.Open["world_hash"] == p.unseededHash(1) {
		t.Fatalf("opened from a trace object: %v", byObject.Open)
	}
	again := p.open(map[string]any{"seed": 1, "trace": tr})
	byID := p.open(map[string]any{"seed": 1, "trace": tr.ID})
	if again.Open["world_hash"] != byObject.Open["world_hash"] || byID.Open["world_hash"] != byObject.Open["world_hash"] {
		t.Fatalf("same trace, worlds %v, %v and (by id) %v", byObject.Open["world_hash"], again.Open["world_hash"], byID.Open["world_hash"])
	}
	prefix := tr
	prefix.Messages = tr.Messages[:4]
	if short := p.open(map[string]any{"seed": 1, "trace": prefix}); short.Open["world_hash"] == byObject.Open["world_hash"] {
		t.Errorf("a shorter prefix opened the same world %v", short.Open["world_hash"])
	}
	// The session read carries the trace receipt.
	code, read := p.do(http.MethodGet, "/v1/sessions/"+byID.ID, p.key, nil)
	if got, _ := read["receipts"].(map[string]any)["trace"].(map[string]any); code != 200 || got["hash"] != rt["hash"] {
		t.Fatalf("session read: %d %v", code, read)
	}
	// A held trace is replayed as it was recorded, call by call.
	for i, c := range trace.Calls(tr) {
		code, res := p.call(byID, c.Tool, json.RawMessage(c.RawArgs))
		if code != 200 || res["content"] != c.Result {
			t.Fatalf("call %d %s: %d %v, recorded %.200q", i, c.Tool, code, res, c.Result)
		}
	}

	// tRPC and MCP (verbs as tools) open the same world.
	trpc := trpcClient{t: t, h: p.h, token: p.key}
	code, out := trpc.mutation("sessions.open", map[string]any{"slug": p.env.Slug, "seed": 1, "trace": tr.ID})
	var env struct {
		Result struct {
			Data struct {
				WorldHash string `json:"world_hash"`
			} `json:"data"`
		} `json:"result"`
	}
	if code != 200 || json.Unmarshal(out, &env) != nil || env.Result.Data.WorldHash != byObject.Open["world_hash"] {
		t.Fatalf("tRPC sessions.open: %d %s", code, out)
	}
	ctx := context.Background()
	cs := p.connect(t, "/mcp", p.key)
	opened, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions_open", Arguments: map[string]any{"slug": p.env.Slug, "seed": 1, "trace": tr}})
	if err != nil || opened.IsError {
		t.Fatalf("MCP sessions.open: %+v %v", opened, err)
	}
	var mo map[string]any
	if err := json.Unmarshal([]byte(textOf(t, opened)), &mo); err != nil || mo["world_hash"] != byObject.Open["world_hash"] {
		t.Fatalf("MCP sessions.open: %s", textOf(t, opened))
	}
	// The environment's MCP address opens it from ?trace=<id>.
	face := p.connect(t, "/mcp/envs/"+p.env.Slug+"?seed=1&trace="+url.QueryEscape(tr.ID), p.key)
	if m := metaOf(t, face.InitializeResult().Meta, api.MetaSession); m["worldHash"] != byObject.Open["world_hash"] || m["trace"] == nil {
		t.Fatalf("environment MCP session from a trace: %v", m)
	}

	// Refusals name the field and change nothing.
	before := countSessions(t, p.db)
	for _, c := range []struct {
		body  map[string]any
		code  int
		field string
	}{
		{map[string]any{"trace": tr.ID, "seed_instructions": "1 order with status pending"}, 422, "body.trace"},
		{map[string]any{"trace": "no-such-trace"}, 404, ""},
		{map[string]any{"trace": map[string]any{"id": "x"}}, 422, "body.trace"},
		{map[string]any{"trace": map[string]any{"messages": []any{map[string]any{"role": "robot", "content": "hi"}}}}, 422, "body.trace.messages[0].role"},
		{map[string]any{"trace": 7}, 422, "body.trace"},
	} {
		code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, c.body)
		if code != c.code || c.field != "" && !strings.Contains(string(mustJSON(t, out)), c.field) {
			t.Errorf("open %v: %d %v, want %d naming %s", c.body, code, out, c.code, c.field)
		}
	}
	if after := countSessions(t, p.db); after != before {
		t.Errorf("refused opens left %d sessions, want %d", after, before)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
