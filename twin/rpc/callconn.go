package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// The tool-call path does not go through net/http's Transport: that client hands each request to a writer
// goroutine and each answer back from a reader goroutine, two goroutine wake-ups per call on top of the
// network's. A call instead takes a keep-alive connection of its own from a small pool, writes the HTTP/1.1
// request and reads the answer on it from the calling goroutine. The wire is the same HTTP/1.1 the twin's
// net/http server speaks, so every other route, and any HTTP tool, still reaches the twin as before.

const (
	callIdle        = 60 * time.Second // a pooled connection unused this long is closed (the twin keeps them 5 min)
	callMaxIdle     = 128              // connections kept idle per twin
	callDialTimeout = DialTimeout
	callTimeout     = 2 * time.Minute // bound of one call when ctx has no deadline
)

// callPool holds idle keep-alive connections to one twin.
type callPool struct {
	host   string // host:port
	mu     sync.Mutex
	idle   []*callConn // most recently used last
	closed bool        // connections coming back are closed, not kept
}

type callConn struct {
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
}

// newCallPool returns the pool of baseURL's twin, or nil when baseURL is not plain http://host:port (the
// Transport path is used then).
func newCallPool(baseURL string) *callPool {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil
	}
	return &callPool{host: u.Host}
}

// get takes an idle connection (reused true) or dials a new one.
func (p *callPool) get(ctx context.Context) (*callConn, bool, error) {
	now := time.Now()
	p.mu.Lock()
	for len(p.idle) > 0 {
		cc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(cc.used) < callIdle {
			p.mu.Unlock()
			return cc, true, nil
		}
		_ = cc.nc.Close()
	}
	p.mu.Unlock()
	d := net.Dialer{Timeout: callDialTimeout, KeepAlive: 30 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", p.host)
	if err != nil {
		return nil, false, err
	}
	return &callConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10), bw: bufio.NewWriterSize(nc, 8<<10)}, false, nil
}

// put returns a connection whose last exchange completed.
func (p *callPool) put(cc *callConn) {
	cc.used = time.Now()
	p.mu.Lock()
	if !p.closed && len(p.idle) < callMaxIdle {
		p.idle = append(p.idle, cc)
		cc = nil
	}
	p.mu.Unlock()
	if cc != nil {
		_ = cc.nc.Close()
	}
}

// close drops every idle connection, and those in use as they come back. The pool still dials for later calls.
func (p *callPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = true
	p.mu.Unlock()
	for _, cc := range idle {
		_ = cc.nc.Close()
	}
}

var errCallConnBroken = errors.New("connection broken before an answer began")

// broken marks an error that ended an exchange before any answer arrived as errCallConnBroken, unless it is a
// deadline passing: a twin that is slow to answer may be running the call.
func broken(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return fmt.Errorf("%w: %w", errCallConnBroken, err)
}

// roundTrip sends one POST with a JSON body and reads the answer; keep reports whether the connection can carry
// another. An error wrapping errCallConnBroken means no byte of an answer arrived.
func (cc *callConn) roundTrip(ctx context.Context, host, path string, body []byte) (status int, data []byte, keep bool, err error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(callTimeout)
	}
	_ = cc.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = cc.nc.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		// When ctx ended during the call, its deadline change may still be on its way: never reuse the
		// connection then, or the change could land on the next call's.
		if !stop() {
			keep = false
		}
	}()

	bw := cc.bw
	bw.WriteString("POST ")
	bw.WriteString(path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	bw.WriteString(strconv.Itoa(len(body)))
	bw.WriteString("\r\n\r\n")
	bw.Write(body)
	if err := bw.Flush(); err != nil {
		return 0, nil, false, broken(err)
	}
	if _, err := cc.br.Peek(1); err != nil {
		return 0, nil, false, broken(err)
	}
	resp, err := http.ReadResponse(cc.br, nil)
	if err != nil {
		return 0, nil, false, err
	}
	data, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	_ = resp.Body.Close()
	if err != nil {
		return 0, nil, false, err
	}
	return resp.StatusCode, data, !resp.Close && len(data) < maxAnswer, nil
}
