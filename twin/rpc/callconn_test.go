package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func newCountingTwin(t *testing.T) (*httptest.Server, *countingListener, *Client) {
	t.Helper()
	srv := NewServer(ServerOptions{})
	srv.SetRuntime(counterRuntime{hash: "sha256:bundle"})
	hs := httptest.NewUnstartedServer(srv)
	cl := &countingListener{Listener: hs.Listener}
	hs.Listener = cl
	hs.Start()
	t.Cleanup(hs.Close)
	c := NewClient(hs.URL, nil)
	if _, err := c.Open(context.Background(), OpenRequest{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	return hs, cl, c
}

// TestCallConnReuse: calls one after another share one kept-alive connection, answers included.
func TestCallConnReuse(t *testing.T) {
	_, cl, c := newCountingTwin(t)
	ctx := context.Background()
	before := cl.n.Load() // the Open went through the Transport
	for i := range 50 {
		res, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 1}`), ExpectCalls: ptr(int64(i))})
		if err != nil || res.Calls != int64(i+1) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := cl.n.Load() - before; got != 1 {
		t.Fatalf("50 calls dialed %d connections, want 1", got)
	}
	// A twin's error answer keeps the connection too, and still decodes into the package's errors.
	if _, err := c.Call(ctx, "nope", CallRequest{Tool: "add", Arguments: json.RawMessage(`{}`)}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("call in an unknown session: %v, want ErrUnknownSession", err)
	}
	if _, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{}`), ExpectCalls: ptr(int64(7))}); !errors.Is(err, ErrCallsMismatch) {
		t.Fatalf("call expecting 7: %v, want ErrCallsMismatch", err)
	}
	if got := cl.n.Load() - before; got != 1 {
		t.Fatalf("error answers dialed %d connections, want 1", got)
	}
}

// TestCallConnTwinClosed: the twin closes its kept-alive connections (as on restart or idle timeout). A call that
// carries ExpectCalls is sent again on a fresh connection and applied once; one without it reports the twin
// unreachable rather than risk running twice.
func TestCallConnTwinClosed(t *testing.T) {
	hs, cl, c := newCountingTwin(t)
	ctx := context.Background()
	if _, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 1}`), ExpectCalls: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	hs.CloseClientConnections()
	time.Sleep(20 * time.Millisecond) // let the close reach the client's socket
	res, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 1}`), ExpectCalls: ptr(int64(1))})
	if err != nil || res.Calls != 2 {
		t.Fatalf("call after the twin closed the connection: %+v, %v; want calls 2", res, err)
	}
	hs.CloseClientConnections()
	time.Sleep(20 * time.Millisecond)
	if _, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 1}`)}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("call without expect_calls on a closed connection: %v, want ErrUnreachable", err)
	}
	if res, err := c.Call(ctx, "s", CallRequest{Tool: "add", Arguments: json.RawMessage(`{"by": 1}`), ExpectCalls: ptr(int64(2))}); err != nil || res.Calls != 3 {
		t.Fatalf("next call: %+v, %v; want calls 3 (the refused call was not applied)", res, err)
	}
	if cl.n.Load() < 3 {
		t.Fatalf("%d connections accepted, want fresh ones after each close", cl.n.Load())
	}
}

// TestCallConnContext: a call whose context ends while the twin is slow returns the context's error (the twin
// here never answers before the test ends, so a call that ignored its context would hang the test), and the
// connection is not reused.
func TestCallConnContext(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"content":"late","calls":1}`))
	}))
	defer hs.Close()
	defer close(release)
	c := NewClient(hs.URL, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := c.Call(ctx, "s", CallRequest{Tool: "slow", Arguments: json.RawMessage(`{}`)})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("canceled call: %v, want context.Canceled", err)
	}
	c.pool.mu.Lock()
	idle := len(c.pool.idle)
	c.pool.mu.Unlock()
	if idle != 0 {
		t.Fatalf("%d idle connections after a canceled call, want 0", idle)
	}
}
