package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newTestTwin(t *testing.T, opts ServerOptions) (*Server, *Client) {
	t.Helper()
	srv := NewServer(opts)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, NewClient(hs.URL, hs.Client())
}

// eachTransport runs f against a fresh server (opts) twice: with a Client over its HTTP RPC, and with a local
// Client (NewLocalClient) that calls it directly. Both must answer and fail alike.
func eachTransport(t *testing.T, opts ServerOptions, f func(t *testing.T, srv *Server, c *Client, local bool)) {
	for _, local := range []bool{false, true} {
		name := "http"
		if local {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) {
			srv := NewServer(opts)
			hs := httptest.NewServer(srv)
			t.Cleanup(hs.Close)
			c := NewClient(hs.URL, hs.Client())
			if local {
				c = NewLocalClient(hs.URL, srv, hs.Client())
			}
			f(t, srv, c, local)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestNotReadyUntilRuntime(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		if err := c.Health(ctx); err != nil {
			t.Fatalf("Health before load: %v, want nil", err)
		}
		if err := c.Ready(ctx); !errors.Is(err, ErrNotReady) {
			t.Fatalf("Ready before load: %v, want ErrNotReady", err)
		}
		if _, err := c.Open(ctx, OpenRequest{ID: "s1"}); !errors.Is(err, ErrNotReady) {
			t.Fatalf("Open before load: %v, want ErrNotReady", err)
		}
		if _, err := c.Call(ctx, "s1", CallRequest{Tool: "get", Arguments: json.RawMessage(`{}`)}); !errors.Is(err, ErrNotReady) {
			t.Fatalf("Call before load: %v, want ErrNotReady", err)
		}
		in, err := c.Info(ctx, false)
		if err != nil || in.Ready {
			t.Fatalf("Info before load = %+v, %v; want not ready", in, err)
		}
		srv.SetRuntime(counterRuntime{hash: "sha256:bundle"})
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("Ready after load: %v", err)
		}
		in, err = c.Info(ctx, true)
		if err != nil || !in.Ready || in.BundleHash != "sha256:bundle" || in.Memory.HeapInuse == 0 {
			t.Fatalf("Info after load = %+v, %v", in, err)
		}
	})
}

func TestSessionLifecycle(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{hash: "sha256:bundle"})

		open, err := c.Open(ctx, OpenRequest{ID: "ses_1", Spec: SessionSpec{Seed: 40, SeedInstructions: "forty"}})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if open.StateHash != open.Receipts.WorldHash || open.Receipts.Seed != 40 || open.Calls != 0 {
			t.Fatalf("Open = %+v", open)
		}
		if _, err := c.Open(ctx, OpenRequest{ID: "ses_1"}); !errors.Is(err, ErrSessionExists) {
			t.Fatalf("second Open of ses_1: %v, want ErrSessionExists", err)
		}

		res, err := c.Call(ctx, "ses_1", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 2}`), Requestor: RequestorAssistant})
		if err != nil {
			t.Fatalf("Call add: %v", err)
		}
		if res.Content != "42" || res.Calls != 1 || res.StateHash == open.StateHash || res.Fidelity != "B_twin" {
			t.Fatalf("Call add = %+v", res)
		}
		res, err = c.Call(ctx, "ses_1", CallRequest{Tool: "fail", Arguments: json.RawMessage(`{}`)})
		if err != nil || !res.Error || res.Calls != 2 {
			t.Fatalf("Call fail = %+v, %v; want a tool error result", res, err)
		}

		time.Sleep(20 * time.Millisecond)
		in, err := c.Info(ctx, false)
		if err != nil || in.IdleMS < 20 || in.Sessions != 1 {
			t.Fatalf("Info 20ms after a call = %+v, %v; want idle >= 20ms, 1 session", in, err)
		}
		st, err := c.Session(ctx, "ses_1")
		if err != nil {
			t.Fatalf("Session: %v", err)
		}
		if in, _ := c.Info(ctx, false); in.IdleMS >= 20 {
			t.Fatalf("idle %dms right after a session request", in.IdleMS)
		}
		want := SessionState{ID: "ses_1", Spec: SessionSpec{Seed: 40, SeedInstructions: "forty"}, Receipts: open.Receipts,
			StateHash: res.StateHash, Calls: 2, Errors: 1, Fidelity: map[string]int64{"B_twin": 2}}
		if got, _ := json.Marshal(st); string(got) != string(must(json.Marshal(want))) {
			t.Fatalf("Session = %s\nwant      %s", got, must(json.Marshal(want)))
		}

		existed, err := c.Close(ctx, "ses_1")
		if err != nil || !existed {
			t.Fatalf("Close = %v, %v; want true", existed, err)
		}
		existed, err = c.Close(ctx, "ses_1")
		if err != nil || existed {
			t.Fatalf("second Close = %v, %v; want false", existed, err)
		}
		if _, err := c.Call(ctx, "ses_1", CallRequest{Tool: "get", Arguments: json.RawMessage(`{}`)}); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("Call after Close: %v, want ErrUnknownSession", err)
		}
		if _, err := c.Session(ctx, "ses_1"); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("Session after Close: %v, want ErrUnknownSession", err)
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// Every rejected call names its problem, maps to its sentinel, and leaves the session as it was.
func TestRejectedCallsChangeNothing(t *testing.T) {
	eachTransport(t, ServerOptions{MaxBodyBytes: 1 << 10}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{})
		open, err := c.Open(ctx, OpenRequest{ID: "s", Spec: SessionSpec{Seed: 1}})
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name     string
			req      CallRequest
			want     error
			detail   string
			httpOnly bool // a body limit: a direct caller sends no body
		}{
			{"no tool", CallRequest{Arguments: json.RawMessage(`{}`)}, ErrBadRequest, "tool: required", false},
			{"arguments missing", CallRequest{Tool: "get"}, ErrBadRequest, "arguments: must be a JSON object", false},
			{"arguments an array", CallRequest{Tool: "get", Arguments: json.RawMessage(`[1]`)}, ErrBadRequest, "arguments: must be a JSON object", false},
			{"bad requestor", CallRequest{Tool: "get", Arguments: json.RawMessage(`{}`), Requestor: "robot"}, ErrBadRequest, "requestor", false},
			{"unknown tool", CallRequest{Tool: "nope", Arguments: json.RawMessage(`{}`)}, ErrUnknownTool, `"nope"`, false},
			{"bad arguments", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by":"x"}`)}, ErrBadArguments, "by", false},
			{"calls mismatch", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by":1}`), ExpectCalls: ptr[int64](3)}, ErrCallsMismatch, "holds 0 calls", false},
			{"too large", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"pad":"` + strings.Repeat("x", 2<<10) + `"}`)}, ErrBadRequest, "over 1024 bytes", true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if tt.httpOnly && local {
					t.Skip("HTTP only")
				}
				_, err := c.Call(ctx, "s", tt.req)
				if !errors.Is(err, tt.want) {
					t.Fatalf("Call: %v, want %v", err, tt.want)
				}
				var e *Error
				if !errors.As(err, &e) || !strings.Contains(e.Detail, tt.detail) {
					t.Fatalf("Call error %v does not name %q", err, tt.detail)
				}
				st, err := c.Session(ctx, "s")
				if err != nil || st.Calls != 0 || st.StateHash != open.StateHash {
					t.Fatalf("after a rejected call: %+v, %v; want the session unchanged", st, err)
				}
			})
		}
		// The matching expectation runs.
		if res, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by":1}`), ExpectCalls: ptr[int64](0)}); err != nil || res.Calls != 1 {
			t.Fatalf("Call with expect_calls 0 = %+v, %v", res, err)
		}
	})
}

func TestOpenRejectsBadInput(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{})
		tests := []struct {
			name   string
			req    OpenRequest
			want   error
			detail string
		}{
			{"no id", OpenRequest{}, ErrBadRequest, "id: required"},
			{"bad id", OpenRequest{ID: "a/b"}, ErrBadRequest, "id:"},
			{"long id", OpenRequest{ID: strings.Repeat("a", MaxSessionIDLen+1)}, ErrBadRequest, "longer than"},
			{"journal without tool", OpenRequest{ID: "x", Journal: []JournalEntry{{Arguments: json.RawMessage(`{}`)}}}, ErrBadRequest, "journal[0].tool"},
			{"journal bad arguments", OpenRequest{ID: "x", Journal: []JournalEntry{{Tool: "get", Arguments: json.RawMessage(`"s"`)}}}, ErrBadRequest, "journal[0].arguments"},
			{"bad spec", OpenRequest{ID: "x", Spec: SessionSpec{Seed: -1}}, ErrBadSpec, "seed"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := c.Open(ctx, tt.req)
				var e *Error
				if !errors.Is(err, tt.want) || !errors.As(err, &e) || !strings.Contains(e.Detail, tt.detail) {
					t.Fatalf("Open: %v, want %v naming %q", err, tt.want, tt.detail)
				}
				if in, _ := c.Info(ctx, false); in.Sessions != 0 {
					t.Fatalf("a rejected open left %d sessions", in.Sessions)
				}
			})
		}
	})
}

func TestMalformedBodies(t *testing.T) {
	srv, c := newTestTwin(t, ServerOptions{})
	srv.SetRuntime(counterRuntime{})
	for _, body := range []string{`{`, `{"id":"a"} {"id":"b"}`, `{"id": 5}`} {
		resp, err := http.Post(c.BaseURL()+PathSessions, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var eb ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || eb.Code != CodeBadRequest || !strings.HasPrefix(eb.Detail, "body:") {
			t.Errorf("POST /sessions %s = %d %+v, want 400 bad_request", body, resp.StatusCode, eb)
		}
	}
}

func TestRebuildFromJournal(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{})
		spec := SessionSpec{Seed: 7}
		if _, err := c.Open(ctx, OpenRequest{ID: "orig", Spec: spec}); err != nil {
			t.Fatal(err)
		}
		var journal []JournalEntry
		for _, args := range []string{`{"by":3}`, `{}`, `{"by":-1}`} {
			tool := "add"
			if args == `{}` {
				tool = "fail"
			}
			res, err := c.Call(ctx, "orig", CallRequest{Tool: tool, Arguments: json.RawMessage(args)})
			if err != nil {
				t.Fatal(err)
			}
			journal = append(journal, JournalEntry{Tool: tool, Arguments: json.RawMessage(args), Content: res.Content,
				Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung, StateHash: res.StateHash})
		}
		orig, _ := c.Session(ctx, "orig")

		rebuilt, err := c.Open(ctx, OpenRequest{ID: "again", Spec: spec, Journal: journal})
		if err != nil {
			t.Fatalf("rebuild: %v", err)
		}
		if rebuilt.StateHash != orig.StateHash || rebuilt.Calls != 3 {
			t.Fatalf("rebuilt = %+v, want state %s after 3 calls", rebuilt, orig.StateHash)
		}
		st, _ := c.Session(ctx, "again")
		if st.Calls != orig.Calls || st.Errors != orig.Errors || st.Fidelity["B_twin"] != 3 {
			t.Fatalf("rebuilt counts = %+v, original %+v", st, orig)
		}

		tampered := append([]JournalEntry(nil), journal...)
		tampered[2].StateHash = "sha256:other"
		if _, err := c.Open(ctx, OpenRequest{ID: "bad", Spec: spec, Journal: tampered}); !errors.Is(err, ErrDiverged) {
			t.Fatalf("rebuild of a tampered journal: %v, want ErrDiverged", err)
		}
		if _, err := c.Session(ctx, "bad"); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("a diverged rebuild left a session: %v", err)
		}
	})
}

func TestConcurrentCallsSerializePerSession(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{})
		const sessions, calls = 4, 50
		for i := range sessions {
			if _, err := c.Open(ctx, OpenRequest{ID: string(rune('a' + i))}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, sessions*calls)
		for i := range sessions * calls {
			wg.Go(func() {
				_, err := c.Call(ctx, string(rune('a'+i%sessions)), CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by":1}`)})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := range sessions {
			res, err := c.Call(ctx, string(rune('a'+i)), CallRequest{Tool: "get", Arguments: json.RawMessage(`{}`)})
			if err != nil || res.Content != "50" || res.Calls != calls+1 {
				t.Fatalf("session %c after %d concurrent adds: %+v, %v", 'a'+i, calls, res, err)
			}
		}
	})
}

func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := NewClient("http://"+addr, nil)
	start := time.Now()
	err = c.Ready(context.Background())
	if !errors.Is(err, ErrUnreachable) || !IsRetryable(err) {
		t.Fatalf("Ready of a closed port: %v, want ErrUnreachable", err)
	}
	t.Logf("unreachable reported in %v", time.Since(start))

	// Something that is not a twin (a plain 404) is unreachable too, not an unknown session.
	hs := httptest.NewServer(http.NotFoundHandler())
	defer hs.Close()
	if _, err := NewClient(hs.URL, nil).Session(context.Background(), "x"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Session against a non-twin: %v, want ErrUnreachable", err)
	}
}

func TestServe(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	var announced bytes.Buffer
	var mu sync.Mutex
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	onListen := make(chan string, 1)
	go func() {
		done <- Serve(ctx, ServeOptions{
			AddrFile: addrFile,
			Announce: writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return announced.Write(p) }),
			OnListen: func(a string) { onListen <- a },
			Load: func(ctx context.Context) (Runtime, error) {
				<-release
				return counterRuntime{hash: "sha256:b"}, nil
			},
		})
	}()
	addr := <-onListen
	c := NewClient("http://"+addr, nil)
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health while loading: %v", err)
	}
	if err := c.Ready(ctx); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready while loading: %v, want ErrNotReady", err)
	}
	if got, _ := os.ReadFile(addrFile); strings.TrimSpace(string(got)) != addr {
		t.Fatalf("addr file = %q, want %q", got, addr)
	}
	mu.Lock()
	line, _ := bufio.NewReader(bytes.NewReader(announced.Bytes())).ReadString('\n')
	mu.Unlock()
	if line != ListenPrefix+addr+"\n" {
		t.Fatalf("announced %q", line)
	}
	close(release)
	waitReady(t, c)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v, want nil", err)
	}
	if err := c.Health(context.Background()); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Health after shutdown: %v, want ErrUnreachable", err)
	}
}

// A runtime that panics fails the call with an internal error, not the process hosting the twin (which, for a
// direct caller, is the caller's own), and drops the session, whose world it may have left half changed: the
// caller rebuilds it from its journal.
func TestPanickingCallDropsSession(t *testing.T) {
	eachTransport(t, ServerOptions{}, func(t *testing.T, srv *Server, c *Client, local bool) {
		ctx := context.Background()
		srv.SetRuntime(counterRuntime{})
		if _, err := c.Open(ctx, OpenRequest{ID: "s"}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Call(ctx, "s", CallRequest{Tool: "panic", Arguments: json.RawMessage(`{}`)})
		var e *Error
		if !errors.Is(err, ErrInternal) || !errors.As(err, &e) || !strings.Contains(e.Detail, "boom") {
			t.Fatalf("Call panic: %v, want an internal error naming the panic", err)
		}
		if _, err := c.Session(ctx, "s"); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("Session after a panic: %v, want ErrUnknownSession", err)
		}
		if _, err := c.Open(ctx, OpenRequest{ID: "s"}); err != nil {
			t.Fatalf("reopen after a panic: %v", err)
		}
	})
}

// A local Client of a twin whose Serve has ended fails as one over HTTP would: unreachable, so its caller asks for
// the twin again.
func TestLocalClientOfStoppedTwin(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := NewServer(ServerOptions{})
	onListen := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServeOptions{Server: srv, OnListen: func(a string) { onListen <- a },
			Load: func(context.Context) (Runtime, error) { return counterRuntime{}, nil }})
	}()
	addr := "http://" + <-onListen
	c := Dial(addr, nil, localsFunc(func(u string) (*Server, bool) { return srv, u == addr }))
	if !c.Local() || Dial("http://127.0.0.1:1", nil, localsFunc(func(u string) (*Server, bool) { return srv, u == addr })).Local() {
		t.Fatal("Dial: want a local client for the served address only")
	}
	waitReady(t, c)
	if _, err := c.Open(ctx, OpenRequest{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by":2}`)}); err != nil || res.Content != "2" {
		t.Fatalf("direct call = %+v, %v", res, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if in := srv.runtime(); in != nil || len(srv.sessions) != 0 {
		t.Fatalf("a stopped server keeps its runtime (%v) or %d sessions", in, len(srv.sessions))
	}
	for name, err := range map[string]error{
		"Call":    second(c.Call(context.Background(), "s", CallRequest{Tool: "get", Arguments: json.RawMessage(`{}`)})),
		"Open":    second(c.Open(context.Background(), OpenRequest{ID: "t"})),
		"Session": second(c.Session(context.Background(), "s")),
		"Close":   second(c.Close(context.Background(), "s")),
	} {
		if !errors.Is(err, ErrUnreachable) || !IsRetryable(err) {
			t.Errorf("%s on a stopped in-process twin: %v, want ErrUnreachable", name, err)
		}
	}
}

type localsFunc func(string) (*Server, bool)

func (f localsFunc) Local(u string) (*Server, bool) { return f(u) }

func second[T any](_ T, err error) error { return err }

func TestServeLoadFailure(t *testing.T) {
	err := Serve(context.Background(), ServeOptions{Load: func(context.Context) (Runtime, error) {
		return nil, errors.New("bundle.json: bad magic")
	}})
	if err == nil || !strings.Contains(err.Error(), "bad magic") {
		t.Fatalf("Serve with a failing load: %v", err)
	}
	if err := Serve(context.Background(), ServeOptions{}); err == nil {
		t.Fatal("Serve without Load: nil error")
	}
	if err := Serve(context.Background(), ServeOptions{Listen: "256.0.0.1:1", Load: func(context.Context) (Runtime, error) { return counterRuntime{}, nil }}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Serve on a bad address: %v", err)
	}
}

func waitReady(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ready(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("twin not ready: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
