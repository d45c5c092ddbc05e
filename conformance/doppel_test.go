package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
)

// doppel is a `doppel dev` process started from this repository's cmd/doppel: SQLite, local blobs and an
// in-process Temporal in a temporary directory, so the run needs no shared service.
type doppel struct {
	url, key string
	log      *bytes.Buffer
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// workspaceKey mints a workspace key in doppel's format (mk_live_ and 256 random bits in lower-case base32).
func workspaceKey(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "mk_live_" + base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding).EncodeToString(b[:])
}

// startDoppel builds cmd/doppel and runs `doppel dev` until the test ends.
func startDoppel(t *testing.T) *doppel {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "doppel")
	build := exec.Command("go", "build", "-o", bin, "./cmd/doppel")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/doppel: %v\n%s", err, out)
	}
	d := &doppel{key: workspaceKey(t), log: &bytes.Buffer{}}
	api := freeAddr(t)
	d.url = "http://" + api
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "dev", "--data-dir", filepath.Join(dir, "data"), "--api-addr", api,
		"--temporal-dev-addr", freeAddr(t), "--temporal-ui-addr", "", "--collect-rebuild-debounce", "1s", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "DOPPEL_BOOTSTRAP_KEY="+d.key)
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: d.log}, &lockedWriter{w: d.log}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		if err := <-exited; err != nil && ctx.Err() == nil {
			t.Errorf("doppel dev: %v", err)
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case err := <-exited:
			t.Fatalf("doppel dev exited before it was ready: %v\n%s", err, d.log)
		default:
		}
		if resp, err := http.Get(d.url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("doppel dev not ready in 3 minutes:\n%s", d.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// checked is an http.RoundTripper that validates every response against one document with libopenapi-validator
// (status, content type, headers and body against the operation's responses) and records what it saw.
type checked struct {
	name string
	rt   http.RoundTripper
	mu   sync.Mutex
	v    validator.Validator
	seen []string // "METHOD path status" of every validated response
	errs []string
}

func newChecked(t *testing.T, name string, doc []byte) *checked {
	t.Helper()
	ldoc, err := libopenapi.NewDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(ldoc)
	if len(errs) > 0 {
		t.Fatalf("%s: %v", name, errs)
	}
	return &checked{name: name, rt: http.DefaultTransport, v: v}
}

func (c *checked) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	check := *resp
	check.Body = io.NopCloser(bytes.NewReader(body))
	req := r.Clone(r.Context())
	req.Body = http.NoBody
	c.mu.Lock()
	defer c.mu.Unlock()
	ok, verrs := c.v.ValidateHttpResponse(req, &check)
	c.seen = append(c.seen, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, resp.StatusCode))
	if !ok {
		for _, e := range verrs {
			msg := fmt.Sprintf("%s %s → %d: %s: %s", r.Method, r.URL.Path, resp.StatusCode, e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				msg += fmt.Sprintf("\n    at %s: %s", se.FieldPath+" "+se.KeywordLocation, se.Reason)
			}
			c.errs = append(c.errs, msg)
		}
	}
	return resp, nil
}

// report fails t for every response that broke the document and says how many were checked.
func (c *checked) report(t *testing.T) int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errs {
		t.Errorf("%s: response outside the document: %s", c.name, e)
	}
	t.Logf("%s: %d responses validated against the document: %s", c.name, len(c.seen), strings.Join(c.seen, "; "))
	return len(c.seen)
}

// shopTraces is a small agent's recorded conversations in the OpenAI Chat Completions format: a shop's
// get_order_details and cancel_pending_order, with the tools' definitions.
func shopTraces() []byte {
	tools := []any{
		map[string]any{"type": "function", "function": map[string]any{"name": "get_order_details", "description": "Get an order's status and items.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"order_id": map[string]any{"type": "string"}}, "required": []string{"order_id"}}}},
		map[string]any{"type": "function", "function": map[string]any{"name": "cancel_pending_order", "description": "Cancel an order that is still pending.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"order_id": map[string]any{"type": "string"}, "reason": map[string]any{"type": "string"}}, "required": []string{"order_id", "reason"}}}},
	}
	var traces []any
	for i := 1; i <= 8; i++ {
		id := fmt.Sprintf("#W%07d", i)
		status := "pending"
		if i%3 == 0 {
			status = "delivered"
		}
		order := map[string]any{"order_id": id, "status": status, "user_id": fmt.Sprintf("user_%d", 100+i%4), "items": []any{map[string]any{"item_id": fmt.Sprintf("it_%d", i), "price": 10 + i}}}
		msgs := []any{
			map[string]any{"role": "system", "content": "You are a shop's support agent."},
			map[string]any{"role": "user", "content": "Where is my order " + id + "?"},
			call("c1", "get_order_details", map[string]any{"order_id": id}),
			map[string]any{"role": "tool", "tool_call_id": "c1", "content": mustJSON(order)},
		}
		if status == "pending" {
			cancelled := map[string]any{}
			for k, v := range order {
				cancelled[k] = v
			}
			cancelled["status"] = "cancelled"
			msgs = append(msgs,
				map[string]any{"role": "user", "content": "Cancel it please."},
				call("c2", "cancel_pending_order", map[string]any{"order_id": id, "reason": "no longer needed"}),
				map[string]any{"role": "tool", "tool_call_id": "c2", "content": mustJSON(cancelled)})
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "Done."})
		traces = append(traces, map[string]any{"id": fmt.Sprintf("t%d", i), "messages": msgs, "tools": tools})
	}
	return []byte(mustJSON(map[string]any{"project": "conformance-shop", "traces": traces}))
}

func call(id, name string, args map[string]any) map[string]any {
	return map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
		map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": mustJSON(args)}}}}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// buildShop collects shopTraces and waits until their environment's rebuild is ready; it answers the slug. Its
// requests go through hc, so their responses are validated too.
func (d *doppel) buildShop(t *testing.T, hc *http.Client) string {
	t.Helper()
	do := func(method, path string, body []byte, out any) int {
		t.Helper()
		return d.rest(t, hc, method, path, d.key, body, out)
	}
	var acc struct {
		Accepted int
		Env      string
	}
	if st := do(http.MethodPost, "/api/collect", shopTraces(), &acc); st != http.StatusAccepted && st != http.StatusOK || acc.Accepted != 8 {
		t.Fatalf("collect: %d %+v", st, acc)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var env struct{ Status, Headline string }
		do(http.MethodGet, "/v1/envs/"+acc.Env, nil, &env)
		switch env.Status {
		case "ready":
			return acc.Env
		case "failed":
			t.Fatalf("environment %s failed to build: %s\n%s", acc.Env, env.Headline, d.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("environment %s not ready in 3 minutes (status %s)\n%s", acc.Env, env.Status, d.log)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// rest sends one REST request with bearer as the credential (a JSON body when body is not nil) and decodes the
// answer into out when out is not nil; it answers the status.
func (d *doppel) rest(t *testing.T, hc *http.Client, method, path, bearer string, body []byte, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, d.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && json.Unmarshal(b, out) != nil {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}
