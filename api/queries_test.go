package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/internal/replaytest"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/query/flow"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/usage"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// queryOptions make a test plane serve queries.
type queryOptions struct {
	runner   query.Runner
	model    string // the configured model's name ("": replay only)
	wait     time.Duration
	maxSteps int
	rate     float64
	burst    int
	plans    *usage.Plans // meter the workspaces against these plans (nil: no metering)
}

// lateRunner forwards to a query runner made after the plane (its activities need the plane).
type lateRunner struct{ query.Runner }

// suiteQueries runs each query's workflow in the Temporal SDK's test environment, with the real query
// activities: the seam for tests without a Temporal server (one test runs them on a real one).
type suiteQueries struct {
	deps worker.Deps
	mu   sync.Mutex
	runs map[string]chan error
}

func (s *suiteQueries) Start(_ context.Context, in query.Input) error {
	ch := make(chan error, 1)
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[string]chan error{}
	}
	s.runs[in.QueryID] = ch
	s.mu.Unlock()
	go func() {
		var ts testsuite.WorkflowTestSuite
		ts.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
		env := ts.NewTestWorkflowEnvironment()
		worker.Register(env, s.deps)
		env.ExecuteWorkflow(flow.QueryWorkflowName, in)
		ch <- wfclient.QueryFailure(env.GetWorkflowError())
	}()
	return nil
}

func (s *suiteQueries) Await(ctx context.Context, id string) error {
	s.mu.Lock()
	ch := s.runs[id]
	s.mu.Unlock()
	select {
	case err := <-ch:
		ch <- err // later waiters see it too
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

var orderIDRE = regexp.MustCompile(`#W\d{7}`)

// scriptedModel is a local server speaking the OpenAI chat-completions protocol with tool calling: the stand-in
// for the paid model API. It plays a retail agent asked to cancel an order: it looks the order named in the
// user's message up, cancels it when the twin says it is pending, and answers with the status the twin gave.
// Every decision reads the conversation (the twin's answers), none is fixed in advance.
type scriptedModel struct {
	*httptest.Server
	requests  atomic.Int64
	sawTools  atomic.Int64 // requests that offered the build's tools
	sawSystem atomic.Int64 // requests that opened with the learned system prompt
}

func newScriptedModel(t testing.TB) *scriptedModel {
	m := &scriptedModel{}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

func (m *scriptedModel) serve(w http.ResponseWriter, r *http.Request) {
	m.requests.Add(1)
	var req struct {
		Model    string            `json:"model"`
		Messages []llm.ChatMessage `json:"messages"`
		Tools    []llm.Tool        `json:"tools"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	for _, t := range req.Tools {
		if t.Function.Name == "cancel_pending_order" {
			m.sawTools.Add(1)
		}
	}
	if len(req.Messages) > 0 && req.Messages[0].Role == "system" && strings.Contains(req.Messages[0].Content, "Retail agent policy") {
		m.sawSystem.Add(1)
	}
	if len(req.Tools) == 0 && len(req.Messages) > 0 && strings.HasPrefix(req.Messages[0].Content, "You write seed instructions") {
		// Asked for seed instructions (auto_seed): the first order the entity list shows, made pending.
		order := orderIDRE.FindString(req.Messages[0].Content)
		fmt.Fprintf(w, `{"model":%q,"choices":[{"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":8}}`,
			req.Model, "order "+order+" with status pending")
		return
	}
	user, calls := "", map[string]string{} // tool call id → tool
	for _, msg := range req.Messages {
		if msg.Role == "user" && user == "" {
			user = msg.Content
		}
		for _, c := range msg.ToolCalls {
			calls[c.ID] = c.Name
		}
	}
	order := orderIDRE.FindString(user)
	last := req.Messages[len(req.Messages)-1]
	var status struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal([]byte(last.Content), &status)
	n := len(req.Messages)
	toolCall := func(name, args string) string {
		return fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":%q,"arguments":%q}}]}`, n, name, args)
	}
	text := func(s string) string { return fmt.Sprintf(`{"role":"assistant","content":%q}`, s) }
	var msg string
	switch {
	case order == "":
		msg = text("Which order would you like to cancel?")
	case last.Role != "tool":
		msg = toolCall("get_order_details", fmt.Sprintf(`{"order_id": %q}`, order))
	case calls[last.ToolCallID] == "get_order_details" && status.Status == "pending":
		msg = toolCall("cancel_pending_order", fmt.Sprintf(`{"order_id": %q, "reason": "no longer needed"}`, order))
	case calls[last.ToolCallID] == "get_order_details":
		msg = text(fmt.Sprintf("Order %s is %s, so it cannot be cancelled.", order, status.Status))
	default:
		msg = text(fmt.Sprintf("Done: order %s is now %s.", order, status.Status))
	}
	prompt := 0
	for _, msg := range req.Messages {
		prompt += len(msg.Content) / 4
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"model":%q,"choices":[{"message":%s,"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":12,"total_tokens":%d}}`,
		req.Model, msg, prompt, prompt+12)
}

// newQueryPlane is the tau-retail plane serving queries; modelURL "" configures no model (replay only). With a
// Temporal address the queries run on that server, else in the SDK's test environment.
func newQueryPlane(t testing.TB, driver, modelURL string, qo queryOptions, temporalAddr string) *plane {
	t.Helper()
	bundle, _ := retailBundle(t)
	late := &lateRunner{}
	qo.runner = late
	if modelURL != "" && qo.model == "" {
		qo.model = "scripted-agent"
	}
	p := newPlane(t, driver, bundle, planeOptions{query: &qo, plans: qo.plans})
	acts := &flow.Activities{DB: p.db, Plane: p.tp, Bundles: p.tp.Bundles(), Blobs: p.blobs}
	// The query's child session open runs the session activities over the plane's twins.
	sessions := &activities.Sessions{DB: p.db, Twins: p.twins}
	if p.locals != nil {
		sessions.Locals = p.locals
	}
	deps := worker.Deps{Queries: acts, Sessions: sessions}
	if modelURL != "" {
		c, err := llm.New(llm.Options{BaseURL: modelURL, Model: qo.model, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		acts.Model = c
	}
	if temporalAddr == "" {
		late.Runner = &suiteQueries{deps: deps}
		return p
	}
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	queue := "test-queries-" + schema.NewID("")
	w := sdkworker.New(c, queue, sdkworker.Options{})
	worker.Register(w, deps)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	late.Runner = &wfclient.Queries{Conn: wfclient.Conn{Client: c, TaskQueue: queue}}
	p.temporal = c
	return p
}

// pendingOrder is an order of the retail world to cancel.
func pendingOrder(t testing.TB, p *plane) string {
	for _, tb := range p.bundle.Tables {
		if tb.Name == "orders" && len(tb.Rows) > 0 {
			return tb.Rows[len(tb.Rows)/2].Key
		}
	}
	t.Fatal("no orders in the retail world")
	return ""
}

// spanKey is a span without its duration (measured time): what must repeat exactly.
func spanKeys(t testing.TB, out map[string]any) []string {
	t.Helper()
	spans, _ := out["trace"].([]any)
	keys := make([]string, 0, len(spans))
	for _, s := range spans {
		m := s.(map[string]any)
		delete(m, "dur")
		b, _ := json.Marshal(m)
		keys = append(keys, string(b))
	}
	return keys
}

// TestQueryEndToEndOnTemporal runs the query workflow on a real Temporal server (DOPPEL_TEST_TEMPORAL) with the
// real activities, the tool plane, the tau-retail twin and the scripted model: a cancel request calls the tools,
// gets the twin's answers, and answers; the world is the one a session with the same seed and instructions
// gets; the same query twice gives the same spans; tokens are recorded.
func TestQueryEndToEndOnTemporal(t *testing.T) {
	addr := testenv.Temporal(t)
	model := newScriptedModel(t)
	p := newQueryPlane(t, schema.DriverSQLite, model.URL+"/v1", queryOptions{}, addr)
	order := pendingOrder(t, p)
	body := map[string]any{"input": "Hi, please cancel my order " + order + ", I no longer need it.", "seed": 7,
		"seed_instructions": "order " + order + " with status pending"}
	path := "/v1/envs/" + p.env.Slug + "/query"

	code, out := p.do(http.MethodPost, path, p.key, body)
	if code != http.StatusOK {
		t.Fatalf("query: %d %v", code, out)
	}
	keys := spanKeys(t, out)
	t.Logf("spans: %s", strings.Join(keys, "\n"))
	trace := out["trace"].([]any)
	if len(trace) != 3 || out["n_spans"].(float64) != 3 {
		t.Fatalf("trace = %v", trace)
	}
	get, cancel, final := trace[0].(map[string]any), trace[1].(map[string]any), trace[2].(map[string]any)
	if get["kind"] != "tool" || get["label"] != "get_order_details" || !strings.Contains(get["detail"].(string), order) ||
		!strings.Contains(get["result"].(string), `"pending"`) {
		t.Errorf("first span = %v", get)
	}
	if cancel["label"] != "cancel_pending_order" || !strings.Contains(cancel["result"].(string), `"cancelled"`) || cancel["fidelity"] == "" {
		t.Errorf("second span = %v", cancel)
	}
	if final["kind"] != "ok" || final["label"] != "final answer" {
		t.Errorf("last span = %v", final)
	}
	if out["response"] != "Done: order "+order+" is now cancelled." || out["stopped"] != "answered" || out["mode"] != "model" {
		t.Errorf("response %q stopped %v mode %v", out["response"], out["stopped"], out["mode"])
	}
	fid := out["fidelity"].(map[string]any)
	if fid["high"].(float64)+fid["low"].(float64) != 2 {
		t.Errorf("fidelity = %v", fid)
	}
	if out["seeded"] != true || out["seed"].(float64) != 7 || out["seed_instructions"] != body["seed_instructions"] {
		t.Errorf("receipts: seeded %v seed %v instructions %v", out["seeded"], out["seed"], out["seed_instructions"])
	}
	if model.sawSystem.Load() != 3 || model.sawTools.Load() != 3 {
		t.Errorf("of 3 model requests, %d had the learned system prompt and %d the tools", model.sawSystem.Load(), model.sawTools.Load())
	}

	// The world is the one sessions.open gives for the same seed and instructions.
	s := p.open(map[string]any{"seed": 7, "seed_instructions": body["seed_instructions"]})
	if out["world_hash"] != s.Open["world_hash"] {
		t.Errorf("query world %v, session world %v", out["world_hash"], s.Open["world_hash"])
	}

	// The same query again: the same spans.
	code, again := p.do(http.MethodPost, path, p.key, body)
	if code != http.StatusOK {
		t.Fatalf("again: %d %v", code, again)
	}
	if a, b := strings.Join(keys, "\n"), strings.Join(spanKeys(t, again), "\n"); a != b {
		t.Errorf("the same query twice gave different spans:\n%s\n---\n%s", a, b)
	}
	if again["world_hash"] != out["world_hash"] || again["response"] != out["response"] {
		t.Errorf("again: %v %v", again["world_hash"], again["response"])
	}

	// The result stays readable, its session was closed, and the tokens are on the row.
	id := out["id"].(string)
	code, read := p.do(http.MethodGet, "/v1/queries/"+id, p.key, nil)
	if code != http.StatusOK || read["status"] != "succeeded" || read["response"] != out["response"] || read["world_hash"] != out["world_hash"] {
		t.Fatalf("queries.get: %d %v", code, read)
	}
	q, err := store.GetQuery(context.Background(), p.db, p.ws.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	if q.ModelCalls != 3 || q.PromptTokens == 0 || q.CompletionTokens != 36 || q.Model != "scripted-agent" {
		t.Errorf("row usage: calls %d prompt %d completion %d model %q", q.ModelCalls, q.PromptTokens, q.CompletionTokens, q.Model)
	}
	sess, err := store.GetSessionByID(context.Background(), p.db, q.SessionID)
	if err != nil || sess.Status != schema.SessionClosed || p.journaled(q.SessionID) != 2 {
		t.Errorf("query session: %+v %v (journaled %d)", sess, err, p.journaled(q.SessionID))
	}
	if f := os.Getenv("DOPPEL_RECORD_QUERY_HISTORY"); f != "" {
		replaytest.Record(t, p.temporal, wfclient.QueryWorkflowID(id), "", f)
	}
}

// firstUser is a trace's first user message.
func firstUser(tr trace.Trace) string {
	for _, m := range tr.Messages {
		if m.Role == trace.RoleUser && m.Content != nil {
			return *m.Content
		}
	}
	return ""
}

func taskOf(id string) string {
	parts := strings.Split(id, "/")
	if len(parts) < 3 {
		return id
	}
	return parts[2]
}

// TestQueryReplayMode: with no model configured a query replays the recorded run closest to the input against
// the seeded world and answers its recorded final answer, every span marked replayed; auto_seed derives
// instructions from what the input names.
func TestQueryReplayMode(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		p := newQueryPlane(t, driver, "", queryOptions{rate: -1}, "") // no rate limit: a loop of queries
		_, traces := retailBundle(t)
		n := 5
		if driver == schema.DriverSQLite {
			n = 12
		}
		sameTask := 0
		for _, tr := range traces[:n] {
			code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key, map[string]any{"input": firstUser(tr), "seed": 3})
			if code != http.StatusOK {
				t.Fatalf("%s: %d %v", tr.ID, code, out)
			}
			if out["mode"] != "replay" || out["model"] != "replay" || out["usage"].(map[string]any)["model_calls"].(float64) != 0 {
				t.Fatalf("not replay: %v", out)
			}
			got := out["replayed_trace"].(string)
			if taskOf(got) == taskOf(tr.ID) {
				sameTask++
			}
			spans := out["trace"].([]any)
			fid := out["fidelity"].(map[string]any)
			if int(fid["high"].(float64)+fid["low"].(float64)) != len(spans)-1 {
				t.Errorf("%s: fidelity %v for %d spans", tr.ID, fid, len(spans))
			}
			for _, s := range spans {
				if s.(map[string]any)["replayed"] != true {
					t.Errorf("%s: span not marked replayed: %v", tr.ID, s)
				}
			}
			last := spans[len(spans)-1].(map[string]any)
			if last["kind"] != "ok" || out["response"] == "" {
				t.Errorf("%s: no final answer: %v %q", tr.ID, last, out["response"])
			}
			// The stored result reads back the same (JSON in the queries row, JSONB on PostgreSQL).
			code, read := p.do(http.MethodGet, "/v1/queries/"+out["id"].(string), p.key, nil)
			if code != http.StatusOK || read["response"] != out["response"] || len(spanKeys(t, read)) != len(spans) || read["world_hash"] != out["world_hash"] {
				t.Errorf("%s: read back %d %v", tr.ID, code, read)
			}
		}
		t.Logf("%s: replay chose a run of the same task for %d of %d first user messages", driver, sameTask, n)
		if sameTask != n {
			t.Errorf("same task for %d of %d", sameTask, n)
		}

		// auto_seed: the order the input names is pinned, and the derived instructions come back.
		order := pendingOrder(t, p)
		code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key,
			map[string]any{"input": "I want to cancel order " + order + " please", "autoSeed": true})
		if code != http.StatusOK {
			t.Fatalf("auto_seed: %d %v", code, out)
		}
		pinned, _ := out["pinned"].(map[string]any)
		if out["seed_instructions"] != "order "+order || out["seeded"] != true || pinned["orders"] == nil || out["seed_note"] == nil {
			t.Errorf("auto_seed: instructions %q seeded %v pinned %v note %v", out["seed_instructions"], out["seeded"], out["pinned"], out["seed_note"])
		}
		if out["seed"].(float64) <= 0 {
			t.Errorf("no seed drawn: %v", out["seed"])
		}
	})
}

// TestQueryRefusals: a bad body is a 422 naming the field, another workspace's environment or query a 404, a
// burst a 429 with Retry-After, a model endpoint that is down a prompt 502 — each with the envelope.
func TestQueryRefusals(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() + "/v1"
	l.Close() // nothing answers there
	p := newQueryPlane(t, schema.DriverSQLite, down, queryOptions{rate: 0.5, burst: 8}, "")
	path := "/v1/envs/" + p.env.Slug + "/query"
	bad := []struct {
		body  any
		field string
	}{
		{map[string]any{}, "body.input"},
		{map[string]any{"input": ""}, "body.input"},
		{map[string]any{"input": "hi", "seed": -1}, "body.seed"},
		{map[string]any{"input": "hi", "seed_instructions": "a", "seedInstructions": "b"}, "body.seedInstructions"},
		{map[string]any{"input": "hi", "auto_seed": "yes"}, "body.auto_seed"},
	}
	for _, b := range bad {
		code, out := p.do(http.MethodPost, path, p.key, b.body)
		if code != http.StatusUnprocessableEntity || out["code"] != "invalid" || !strings.Contains(out["detail"].(string), b.field) {
			t.Errorf("%v: %d %v, want 422 naming %s", b.body, code, out, b.field)
		}
	}
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.otherEnv.Slug+"/query", p.key, map[string]any{"input": "hi"})
	if code != http.StatusNotFound || out["code"] != "notFound" {
		t.Errorf("another workspace's env: %d %v", code, out)
	}

	// The model endpoint is down: a clear 502 after the client's retries, not a hang.
	started := time.Now()
	code, out = p.do(http.MethodPost, path, p.key, map[string]any{"input": "cancel order #W0000001"})
	took := time.Since(started)
	if code != http.StatusBadGateway || out["code"] != "unavailable" || !strings.Contains(out["detail"].(string), "model endpoint") {
		t.Errorf("model down: %d %v", code, out)
	}
	t.Logf("model endpoint down: %d in %s: %v", code, took.Round(time.Millisecond), out["detail"])
	// The failed query is recorded as such; another workspace cannot read it.
	var q schema.Query
	if err := p.db.NewSelect().Model(&q).Where("workspace_id = ?", p.ws.ID).Order("created_at DESC").Limit(1).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if q.Status != schema.QueryFailed || q.ErrorKind != query.KindModelUnavailable {
		t.Errorf("failed query row: %+v", q)
	}
	code, read := p.do(http.MethodGet, "/v1/queries/"+q.ID, p.key, nil)
	if code != http.StatusOK || read["status"] != "failed" || read["error"].(map[string]any)["status"].(float64) != 502 {
		t.Errorf("failed query read: %d %v", code, read)
	}
	if code, out := p.do(http.MethodGet, "/v1/queries/"+q.ID, p.otherKey, nil); code != http.StatusNotFound || out["code"] != "notFound" {
		t.Errorf("another workspace's query: %d %v", code, out)
	}

	// Burst: the bucket (burst 8, 0.5/s) has been drawn by the requests above; the next ones are refused.
	var limited map[string]any
	var retryAfter string
	for i := 0; i < 10 && limited == nil; i++ {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"input":"hi","model":"replay"}`))
		r.Header.Set("Authorization", "Bearer "+p.key)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		p.h.ServeHTTP(w, r)
		if w.Code == http.StatusTooManyRequests {
			limited = envelope(t, w, http.StatusTooManyRequests, "rateLimited")
			retryAfter = w.Header().Get("Retry-After")
		}
	}
	if limited == nil || retryAfter == "" || retryAfter == "0" {
		t.Fatalf("no 429 with Retry-After under a burst (Retry-After %q)", retryAfter)
	}
	// Through tRPC too: 429, the envelope at error.data.envelope, Retry-After on the response.
	r := httptest.NewRequest(http.MethodPost, "/trpc/envs.query", strings.NewReader(`{"slug":"`+p.env.Slug+`","input":"hi","model":"replay"}`))
	r.Header.Set("Authorization", "Bearer "+p.key)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), `"rateLimited"`) {
		t.Errorf("tRPC under the limit: %d Retry-After %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	// Another workspace has its own bucket.
	if code, out := p.do(http.MethodPost, "/v1/envs/"+p.otherEnv.Slug+"/query", p.otherKey, map[string]any{"input": "hi", "model": "replay"}); code == http.StatusTooManyRequests {
		t.Errorf("the other workspace was limited too: %v", out)
	}
}

// TestQueryAutoSeedByModel: with a model configured, auto_seed asks it for instructions when the input names
// nothing the parser knows; the instructions come back, seed the world, and the model's tokens are counted.
func TestQueryAutoSeedByModel(t *testing.T) {
	model := newScriptedModel(t)
	p := newQueryPlane(t, schema.DriverSQLite, model.URL+"/v1", queryOptions{}, "")
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key,
		map[string]any{"input": "I placed an order by mistake, please cancel it.", "auto_seed": true, "seed": 9})
	if code != http.StatusOK {
		t.Fatalf("query: %d %v", code, out)
	}
	instr, _ := out["seed_instructions"].(string)
	note, _ := out["seed_note"].(string)
	if !orderIDRE.MatchString(instr) || !strings.HasSuffix(instr, " with status pending") || out["seeded"] != true || !strings.Contains(note, "model") {
		t.Fatalf("instructions %q seeded %v note %q", instr, out["seeded"], note)
	}
	if u := out["usage"].(map[string]any); u["model_calls"].(float64) != 2 || u["prompt_tokens"].(float64) < 50 {
		t.Errorf("usage = %v", u)
	}
	// Fed back, the instructions give the same world.
	s := p.open(map[string]any{"seed": 9, "seed_instructions": instr})
	if s.Open["world_hash"] != out["world_hash"] {
		t.Errorf("query world %v, session world %v", out["world_hash"], s.Open["world_hash"])
	}
}

func TestQueryModelNeedsAnEndpoint(t *testing.T) {
	p := newQueryPlane(t, schema.DriverSQLite, "", queryOptions{}, "")
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key, map[string]any{"input": "hi", "model": "gpt-4.1"})
	if code != http.StatusUnprocessableEntity || !strings.Contains(out["detail"].(string), "body.model") {
		t.Errorf("model without endpoint: %d %v", code, out)
	}
	// A request that shares no word with any recorded run cannot be replayed.
	code, out = p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key, map[string]any{"input": "zzxq qqzx"})
	if code != http.StatusUnprocessableEntity || !strings.Contains(out["detail"].(string), "body.input") {
		t.Errorf("unmatched replay: %d %v", code, out)
	}
}

// TestQueryAnswers202ThenPolls: a query still running when the wait ends answers 202 with its id; polling it
// gives the result.
func TestQueryAnswers202ThenPolls(t *testing.T) {
	p := newQueryPlane(t, schema.DriverSQLite, "", queryOptions{wait: time.Nanosecond}, "")
	_, traces := retailBundle(t)
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key, map[string]any{"input": firstUser(traces[0])})
	if code != http.StatusAccepted || out["status"] != "running" || !strings.HasPrefix(out["id"].(string), "qry_") || out["poll"] != "/v1/queries/"+out["id"].(string) {
		t.Fatalf("202: %d %v", code, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, read := p.do(http.MethodGet, out["poll"].(string), p.key, nil)
		if code != http.StatusOK {
			t.Fatalf("poll: %d %v", code, read)
		}
		if read["status"] == "succeeded" {
			if read["response"] == "" || read["n_spans"].(float64) == 0 || read["seed"] != out["seed"] {
				t.Fatalf("polled result: %v", read)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after 30s", read["status"])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// endedRunner stands for a query workflow that ended without recording its outcome (timed out, terminated):
// it starts nothing and its result is that error.
type endedRunner struct{}

func (endedRunner) Start(context.Context, query.Input) error { return nil }

func (endedRunner) Await(ctx context.Context, _ string) error {
	return wfclient.QueryFailure(errors.New("workflow execution timed out"))
}

// TestQueryThatEndedUnrecordedReadsFailed: a poll of a query whose workflow ended without recording its outcome
// answers failed (and records it), not running forever.
func TestQueryThatEndedUnrecordedReadsFailed(t *testing.T) {
	bundle, _ := retailBundle(t)
	p := newPlane(t, schema.DriverSQLite, bundle, planeOptions{query: &queryOptions{runner: endedRunner{}, wait: time.Nanosecond}})
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/query", p.key, map[string]any{"input": "cancel my order"})
	if code != http.StatusAccepted || out["status"] != "running" {
		t.Fatalf("query: %d %v", code, out)
	}
	code, read := p.do(http.MethodGet, "/v1/queries/"+out["id"].(string), p.key, nil)
	qe, _ := read["error"].(map[string]any)
	if code != http.StatusOK || read["status"] != "failed" || qe == nil || !strings.Contains(qe["detail"].(string), "timed out") {
		t.Fatalf("poll: %d %v", code, read)
	}
	q, err := store.GetQuery(context.Background(), p.db, p.ws.ID, out["id"].(string))
	if err != nil || q.Status != schema.QueryFailed || q.FinishedAt == nil {
		t.Fatalf("row: %+v %v", q, err)
	}
}
