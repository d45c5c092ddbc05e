package twinrpc

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

// NewHTTPClient returns an http.Client suited to twin RPC on loopback or a private network: pooled keep-alive
// connections, no proxy, and a short dial timeout so a dead twin is reported at once. Share one among the Clients
// of many twins.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
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
	base string
	hc   *http.Client
}

// NewClient returns a Client of the twin at baseURL ("http://127.0.0.1:PORT"). A nil hc gets NewHTTPClient().
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = NewHTTPClient()
	}
	return &Client{base: strings.TrimSuffix(baseURL, "/"), hc: hc}
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
	var out OpenResponse
	err := c.do(ctx, http.MethodPost, PathSessions, req, &out)
	return out, err
}

// Call runs one tool call in session id.
func (c *Client) Call(ctx context.Context, id string, req CallRequest) (CallResult, error) {
	var out CallResult
	err := c.do(ctx, http.MethodPost, sessionPath(id)+"/call", req, &out)
	return out, err
}

// Session returns session id's state.
func (c *Client) Session(ctx context.Context, id string) (SessionState, error) {
	var out SessionState
	err := c.do(ctx, http.MethodGet, sessionPath(id), nil, &out)
	return out, err
}

// Close drops session id's world; existed reports whether the twin held it.
func (c *Client) Close(ctx context.Context, id string) (existed bool, err error) {
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
			return fmt.Errorf("twinrpc: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("twinrpc: %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("twinrpc: %s %s%s: %w", method, c.base, path, ctx.Err())
		}
		return fmt.Errorf("%w: %s %s%s: %w", ErrUnreachable, method, c.base, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("twinrpc: %s %s%s: read answer: %w", method, c.base, path, ctx.Err())
		}
		return fmt.Errorf("%w: %s %s%s: read answer: %w", ErrUnreachable, method, c.base, path, err)
	}
	if resp.StatusCode >= 300 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Code == "" {
			eb = ErrorBody{Code: CodeInternal, Detail: strings.TrimSpace(string(data))}
			if resp.StatusCode == http.StatusNotFound {
				// Something that is not a twin answers at this address.
				return fmt.Errorf("%w: %s %s%s answered %d: %s", ErrUnreachable, method, c.base, path, resp.StatusCode, eb.Detail)
			}
		}
		return &Error{Status: resp.StatusCode, Code: eb.Code, Detail: eb.Detail}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("twinrpc: decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// IsRetryable reports whether err means the twin is down or not ready yet, so waking it and retrying may succeed.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotReady)
}
