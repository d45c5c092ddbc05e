package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// holdBody opens a connection to srv, sends a POST to path declaring length bytes of body and sends one, then
// leaves the connection open (closed at the test's end). It answers the connection so the caller can read any
// early answer.
func holdBody(t *testing.T, addr, path string, length int64, header string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n{", path, addr, length, header)
	return c
}

// Issue 33, defect 1: a connection without a credential that declares a huge body and sends one byte must not
// take the budget another workspace's writes need. Before the fix the declared 256 MiB was reserved before
// routing and authentication, and every other body answered 503.
func TestSlowAnonymousBodyDoesNotBlockOthers(t *testing.T) {
	fx := newFixture(t, schema.DriverSQLite, nil)
	srv := httptest.NewServer(fx.h)
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	// Declared lengths at the whole default budget, on a 4 KiB route, a 64 KiB-capped unrouted OAuth path and
	// tRPC (32 MiB cap); and bodies within each route's cap but over the address's share.
	attacks := []net.Conn{
		holdBody(t, addr, "/console/signin", 256<<20, ""),
		holdBody(t, addr, "/oauth/register", 256<<20, ""),
		holdBody(t, addr, "/trpc/sessions.open", 256<<20, ""),
		holdBody(t, addr, "/trpc/sessions.open", 32<<20, ""),
		holdBody(t, addr, "/trpc/sessions.open", 512<<10, ""), // within the address's share: held
		holdBody(t, addr, "/trpc/sessions.open", 512<<10, "Authorization: Bearer mk_live_not_a_key\r\n"),
	}
	for i, c := range attacks[:4] {
		// Over a cap: refused before a byte more is read.
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("attack %d: no early answer: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(body, []byte("tooLarge")) {
			t.Errorf("attack %d: %d %s, want 413 with the envelope", i, resp.StatusCode, body)
		}
	}
	// The held ones are admitted: give the server a moment to take them (their handlers wait on the body).
	time.Sleep(300 * time.Millisecond)

	// Another workspace writes: a typed body on a REST route, and a tRPC mutation's body.
	for i := range 5 {
		req := httptest.NewRequest(http.MethodPost, srv.URL+"/test/seed", strings.NewReader(`{"seed":1}`))
		req.RequestURI = ""
		req.Header.Set("Authorization", "Bearer "+fx.otherKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode >= 300 {
			t.Fatalf("write %d of another workspace under the attack: %d %s, want 2xx", i, resp.StatusCode, body)
		}
	}
	// The same address without a credential holds at most its share: another anonymous body over what is left
	// of it waits its turn (429), it does not take the server's budget.
	c := holdBody(t, addr, "/trpc/sessions.open", 768<<10, "")
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!bytes.Contains(body, []byte("api.body_budget_per_address_bytes")) {
		t.Errorf("anonymous body past the address's share: %d %s, want 429 with Retry-After naming the key", resp.StatusCode, body)
	}
}

// slowServer is the API behind NewHTTPServer with short limits: headers in 2 s, idle keep-alive 1 s, bodies at
// 1 KiB/s after a 1 s grace.
func slowServer(t *testing.T) *httptest.Server {
	t.Helper()
	opts := api.Options{ReturnMemoryEvery: -1, BodyLimits: api.BodyLimits{ReadGrace: time.Second, MinRate: 1 << 10},
		Routes: []func(huma.API, *api.Deps){func(_ huma.API, d *api.Deps) {
			d.Mux.HandleFunc("POST /test/read", func(w http.ResponseWriter, r *http.Request) {
				n, err := io.Copy(io.Discard, r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				_ = json.NewEncoder(w).Encode(map[string]int64{"read": n})
			})
		}}}
	h, _ := api.New(opts)
	srv := httptest.NewUnstartedServer(h)
	srv.Config = api.NewHTTPServer(h, api.ConnLimits{ReadHeader: 2 * time.Second, Idle: time.Second}, nil)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// closedWithin reads c until the server closes it, at most limit; it answers what was read and when it closed
// (-1 when it did not).
func closedWithin(c net.Conn, limit time.Duration) ([]byte, time.Duration) {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(limit))
	data, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return data, -1
	}
	return data, time.Since(start)
}

// Issue 33, defect 1: idle keep-alive connections, connections that send no headers, and bodies at one byte a
// second are closed (before the fix only ReadHeaderTimeout was set: idle and slow-body connections stayed open).
func TestIdleAndSlowConnectionsClosed(t *testing.T) {
	srv := slowServer(t)
	addr := srv.Listener.Addr().String()
	const limit = 20 * time.Second

	// Idle: one request, then nothing.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	start := time.Now()
	_ = idle.SetReadDeadline(start.Add(limit))
	_, err = br.ReadByte()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("idle keep-alive connection still open after %s", limit)
	} else {
		t.Logf("idle keep-alive connection closed after %s (api.idle_timeout 1s)", time.Since(start).Round(10*time.Millisecond))
	}

	// Silent: connected, no headers.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, d := closedWithin(silent, limit); d < 0 {
		t.Errorf("connection without headers still open after %s", limit)
	} else {
		t.Logf("connection without headers closed after %s (api.read_header_timeout 2s)", d.Round(10*time.Millisecond))
	}

	// Slow body: 1 byte a second of a declared 100.
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /test/read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
				if _, err := slow.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	data, d := closedWithin(slow, limit)
	if d < 0 {
		t.Fatalf("1-byte-a-second body still open after %s (read %q)", limit, data)
	}
	t.Logf("1-byte-a-second body closed after %s (api.body_read_grace 1s, api.body_min_rate_bytes 1024)", d.Round(10*time.Millisecond))
	resp, err = http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), nil)
	if err != nil {
		t.Fatalf("slow body: no answer before the close: %v (%q)", err, data)
	}
	body, _ := io.ReadAll(resp.Body)
	var env map[string]any
	_ = json.Unmarshal(body, &env)
	if resp.StatusCode != http.StatusRequestTimeout || env["code"] != "timeout" || !strings.Contains(fmt.Sprint(env["detail"]), "api.body_min_rate_bytes") {
		t.Errorf("slow body: %d %s, want 408 with the envelope naming api.body_min_rate_bytes", resp.StatusCode, body)
	}

	// A body at a good rate, longer than the grace, is not cut off.
	pr, pw := io.Pipe()
	go func() {
		for range 8 {
			_, _ = pw.Write(make([]byte, 1<<10))
			time.Sleep(250 * time.Millisecond)
		}
		pw.Close()
	}()
	a := budgetPost(t, srv.URL+"/test/read", pr, 8<<10)
	if a.status != http.StatusOK || a.body["read"] != float64(8<<10) {
		t.Errorf("body at 4 KiB/s over 2 s: %d %v, want 200 having read all of it", a.status, a.body)
	}
}
