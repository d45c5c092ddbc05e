package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DialTimeout bounds connecting to a twin. Twins run on this host or on a Docker network beside it, where the kernel
// completes a connection in well under a millisecond (whatever the twin process is doing); the bound is what a
// removed container's bridge address costs, which never answers a SYN, before the twin is reported dead.
const DialTimeout = 500 * time.Millisecond

// NewHTTPClient returns an http.Client suited to twin RPC on loopback or a private network: pooled keep-alive
// connections, no proxy, and a short dial timeout so a dead twin is reported at once. Share one among the Clients
// of many twins.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		DisableCompression:    true,
	}}
}

// Client calls one twin's RPC. Its errors wrap the package's sentinels: ErrUnknownSession (rebuild the session from
// its journal), ErrUnknownTool, ErrBadArguments, ErrNotReady, ErrUnreachable (the twin is down: wake or restart it),
// ErrSessionExists, ErrCallsMismatch, ErrDiverged, ErrBadRequest, ErrInternal.
type Client struct {
	base  string
	hc    *http.Client
	pool  *callPool // the tool-call path (callconn.go); nil: calls go through hc
	local *Server   // a twin served in this process: session operations call it directly (NewLocalClient)
}

// NewClient returns a Client of the twin at baseURL ("http://127.0.0.1:PORT"). A nil hc gets NewHTTPClient().
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = NewHTTPClient()
	}
	base := strings.TrimSuffix(baseURL, "/")
	return &Client{base: base, hc: hc, pool: newCallPool(base)}
}

// Locals finds the twins served in this process by their RPC address (driver.Inproc is one), so a caller in the
// same process can reach them without HTTP.
type Locals interface {
	Local(baseURL string) (*Server, bool)
}

// Dial returns a Client of the twin at baseURL: a direct one when locals serves it in this process, else one over
// HTTP through hc. locals may be nil.
func Dial(baseURL string, hc *http.Client, locals Locals) *Client {
	if locals != nil {
		if s, ok := locals.Local(strings.TrimSuffix(baseURL, "/")); ok {
			return NewLocalClient(baseURL, s, hc)
		}
	}
	return NewClient(baseURL, hc)
}

// NewLocalClient returns a Client whose session operations (Open, Call, Session, Close) call s, a twin served in
// this process at baseURL, directly: no HTTP, no JSON, the same answers and errors as over the wire. Health,
// Ready and Info still go over HTTP. Once s's Serve has ended, session operations fail with ErrUnreachable, as
// they would over HTTP.
func NewLocalClient(baseURL string, s *Server, hc *http.Client) *Client {
	c := NewClient(baseURL, hc)
	c.local = s
	return c
}

// Local reports whether c calls a twin in this process directly.
func (c *Client) Local() bool { return c.local != nil }

// direct returns the local server while it serves, or the error a caller over HTTP would get from a stopped twin.
func (c *Client) direct(ctx context.Context, op string) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("twin/rpc: %s %s: %w", op, c.base, err)
	}
	if c.local.retired.Load() {
		return nil, fmt.Errorf("%w: %s %s: the in-process twin has stopped", ErrUnreachable, op, c.base)
	}
	return c.local, nil
}

// CloseIdle closes the connections the Client keeps for tool calls, and those in use once their call ends: for a
// Client that is being let go.
func (c *Client) CloseIdle() {
	if c.pool != nil {
		c.pool.close()
	}
}

// BaseURL is the twin's address this client calls.
func (c *Client) BaseURL() string { return c.base }

// Health reports whether the twin process answers.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, PathHealth, nil, nil)
}

// Ready reports whether the twin has loaded its bundle: nil when ready, ErrNotReady while loading, ErrUnreachable
// when nothing answers.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, PathReady, nil, nil)
}

// Info returns the twin's bundle hash, session count and memory. With gc the twin collects garbage first.
func (c *Client) Info(ctx context.Context, gc bool) (Info, error) {
	var in Info
	p := PathInfo
	if gc {
		p += "?gc=1"
	}
	err := c.do(ctx, http.MethodGet, p, nil, &in)
	return in, err
}

// Open opens session req.ID (rebuilding it from req.Journal when that is not empty).
func (c *Client) Open(ctx context.Context, req OpenRequest) (OpenResponse, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "open")
		if err != nil {
			return OpenResponse{}, err
		}
		return s.OpenSession(ctx, req)
	}
	var out OpenResponse
	err := c.do(ctx, http.MethodPost, PathSessions, req, &out)
	return out, err
}

// Call runs one tool call in session id, on a pooled connection of its own (callconn.go).
func (c *Client) Call(ctx context.Context, id string, req CallRequest) (CallResult, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "call")
		if err != nil {
			return CallResult{}, err
		}
		return s.CallSession(ctx, id, req)
	}
	var out CallResult
	path := sessionPath(id) + "/call"
	if c.pool == nil {
		err := c.do(ctx, http.MethodPost, path, req, &out)
		return out, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return out, fmt.Errorf("twin/rpc: encode POST %s: %w", path, err)
	}
	for attempt := 0; ; attempt++ {
		cc, reused, err := c.pool.get(ctx)
		if err != nil {
			return out, c.transportError(ctx, http.MethodPost, path, err)
		}
		status, data, keep, err := cc.roundTrip(ctx, c.pool.host, path, body)
		if err != nil {
			_ = cc.nc.Close()
			// A pooled connection the twin closed fails before any answer. Sending the call again is safe
			// when it carries ExpectCalls: a twin that did apply it answers calls_mismatch, not a second run.
			if reused && attempt == 0 && req.ExpectCalls != nil && errors.Is(err, errCallConnBroken) && ctx.Err() == nil {
				continue
			}
			return out, c.transportError(ctx, http.MethodPost, path, err)
		}
		if keep {
			c.pool.put(cc)
		} else {
			_ = cc.nc.Close()
		}
		return out, c.answer(http.MethodPost, path, status, data, &out)
	}
}

// Session returns session id's state.
func (c *Client) Session(ctx context.Context, id string) (SessionState, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "session")
		if err != nil {
			return SessionState{}, err
		}
		return s.SessionState(id)
	}
	var out SessionState
	err := c.do(ctx, http.MethodGet, sessionPath(id), nil, &out)
	return out, err
}

// Close drops session id's world; existed reports whether the twin held it.
func (c *Client) Close(ctx context.Context, id string) (existed bool, err error) {
	if c.local != nil {
		s, err := c.direct(ctx, "close")
		if err != nil {
			return false, err
		}
		return s.CloseSession(id)
	}
	var out CloseResponse
	err = c.do(ctx, http.MethodDelete, sessionPath(id), nil, &out)
	return out.Existed, err
}

func sessionPath(id string) string { return PathSessions + "/" + url.PathEscape(id) }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("twin/rpc: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("twin/rpc: %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportError(ctx, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return c.transportError(ctx, method, path, fmt.Errorf("read answer: %w", err))
	}
	return c.answer(method, path, resp.StatusCode, data, out)
}

// maxAnswer bounds an answer the client reads.
const maxAnswer = 256 << 20

// transportError reports a request that got no answer: the caller's ctx ending, or else the twin unreachable.
func (c *Client) transportError(ctx context.Context, method, path string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("twin/rpc: %s %s%s: %w", method, c.base, path, ctx.Err())
	}
	return fmt.Errorf("%w: %s %s%s: %w", ErrUnreachable, method, c.base, path, err)
}

// answer decodes an answer: an error body into *Error, a success into out.
func (c *Client) answer(method, path string, status int, data []byte, out any) error {
	if status >= 300 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Code == "" {
			eb = ErrorBody{Code: CodeInternal, Detail: strings.TrimSpace(string(data))}
			if status == http.StatusNotFound {
				// Something that is not a twin answers at this address.
				return fmt.Errorf("%w: %s %s%s answered %d: %s", ErrUnreachable, method, c.base, path, status, eb.Detail)
			}
		}
		return &Error{Status: status, Code: eb.Code, Detail: eb.Detail}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("twin/rpc: decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// IsRetryable reports whether err means the twin is down or not ready yet, so waking it and retrying may succeed.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotReady)
}
