package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
)

// doppel bench sends its calls on keep-alive HTTP/1.1 connections of its own, one per session, each written and
// read by the goroutine making the call. net/http's Transport hands every request to a writer goroutine and every
// answer back from a reader goroutine: on a 2-core machine those wake-ups cost the generator about 300 µs of CPU
// per call at 1,000 calls/s, CPU the server under test then lacks, and they land in every measured latency. The
// raw /healthz limit is measured over the same kind of connection, so the two stay comparable.

// benchTarget is the API the bench drives.
type benchTarget struct {
	host string // host:port to dial
	name string // Host header
	tls  *tls.Config
	path string // the URL's path prefix, without a trailing slash
}

func newBenchTarget(rawURL string) (*benchTarget, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, usageError{fmt.Sprintf("bench: --url %q: %v", rawURL, err)}
	}
	t := &benchTarget{host: u.Host, name: u.Host, path: strings.TrimRight(u.Path, "/")}
	switch u.Scheme {
	case "http":
		if u.Port() == "" {
			t.host = net.JoinHostPort(u.Hostname(), "80")
		}
	case "https":
		t.tls = &tls.Config{ServerName: u.Hostname()}
		if u.Port() == "" {
			t.host = net.JoinHostPort(u.Hostname(), "443")
		}
	default:
		return nil, usageError{fmt.Sprintf("bench: --url %q: want http:// or https://", rawURL)}
	}
	if u.Host == "" {
		return nil, usageError{fmt.Sprintf("bench: --url %q has no host", rawURL)}
	}
	return t, nil
}

// conn returns a connection to the target, dialed on first use.
func (t *benchTarget) conn() *benchConn { return &benchConn{t: t} }

// benchConn is one keep-alive connection; its caller serializes requests on it. A broken connection is dialed again
// on the next request.
type benchConn struct {
	t  *benchTarget
	nc net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func (c *benchConn) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: 5 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", c.t.host)
	if err != nil {
		return err
	}
	if c.t.tls != nil {
		tc := tls.Client(nc, c.t.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return err
		}
		nc = tc
	}
	c.nc, c.br, c.bw = nc, bufio.NewReaderSize(nc, 32<<10), bufio.NewWriterSize(nc, 8<<10)
	return nil
}

// ready dials the connection unless it is open, so the first timed request does not pay for the dial.
func (c *benchConn) ready(ctx context.Context) error {
	if c.nc != nil {
		return nil
	}
	return c.dial(ctx)
}

func (c *benchConn) close() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc = nil
	}
}

// post sends a JSON body with an Authorization header and reads the whole answer: its status, its Server-Timing
// header and its body.
func (c *benchConn) post(ctx context.Context, path, auth string, body []byte) (status int, timing string, answer []byte, err error) {
	return c.roundTrip(ctx, http.MethodPost, path, auth, body)
}

// get sends a GET and reads the whole answer.
func (c *benchConn) get(ctx context.Context, path string) (status int, answer []byte, err error) {
	status, _, answer, err = c.roundTrip(ctx, http.MethodGet, path, "", nil)
	return status, answer, err
}

func (c *benchConn) roundTrip(ctx context.Context, method, path, auth string, body []byte) (int, string, []byte, error) {
	if err := c.ready(ctx); err != nil {
		return 0, "", nil, err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	_ = c.nc.SetDeadline(dl)
	bw := c.bw
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(c.t.name)
	if auth != "" {
		bw.WriteString("\r\nAuthorization: ")
		bw.WriteString(auth)
	}
	if body != nil {
		bw.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
		bw.WriteString(strconv.Itoa(len(body)))
	}
	bw.WriteString("\r\n\r\n")
	bw.Write(body)
	if err := bw.Flush(); err != nil {
		c.close()
		return 0, "", nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.close()
		return 0, "", nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.close()
		return 0, "", nil, err
	}
	if resp.Close {
		c.close()
	}
	return resp.StatusCode, resp.Header.Get("Server-Timing"), data, nil
}

// benchRaw times GET /healthz round trips for d over conc connections at once, each a closed loop: the floor any
// call sits on at peak, and the most requests a second the server answers at all. It returns the round trips and
// the time they took.
func benchRaw(ctx context.Context, t *benchTarget, conc int, d time.Duration) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	var out []time.Duration
	conns := make([]*benchConn, conc)
	for i := range conns {
		conns[i] = t.conn()
		_ = conns[i].ready(ctx)
	}
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			defer c.close()
			mine := make([]time.Duration, 0, 1024)
			for rctx.Err() == nil {
				if d, ok := healthz(ctx, t, c); ok {
					mine = append(mine, d)
				}
			}
			mu.Lock()
			out = append(out, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, time.Since(start)
}

// benchRawRate times GET /healthz round trips offered at rate a second for d, spread over conns connections as the
// calls are spread over sessions: the floor any call sits on at that rate.
func benchRawRate(ctx context.Context, t *benchTarget, rate, conns int, d time.Duration) []time.Duration {
	type slot struct {
		mu sync.Mutex
		c  *benchConn
	}
	slots := make([]slot, conns)
	for i := range slots {
		slots[i].c = t.conn()
		_ = slots[i].c.ready(ctx)
	}
	var mu sync.Mutex
	var out []time.Duration
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	latency.Offer(rctx, rate, 0, func(i int, _ time.Time) {
		s := &slots[i%conns]
		s.mu.Lock()
		dur, ok := healthz(ctx, t, s.c)
		s.mu.Unlock()
		if ok {
			mu.Lock()
			out = append(out, dur)
			mu.Unlock()
		}
	})
	for i := range slots {
		slots[i].c.close()
	}
	return out
}

// healthz times one GET /healthz.
func healthz(ctx context.Context, t *benchTarget, c *benchConn) (time.Duration, bool) {
	t0 := time.Now()
	status, _, err := c.get(ctx, t.path+"/healthz")
	d := time.Since(t0)
	return d, err == nil && status == http.StatusOK
}
