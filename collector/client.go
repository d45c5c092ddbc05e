package collector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of Client and Options.
const (
	DefaultRetries     = 2
	DefaultTimeout     = 30 * time.Second
	DefaultUserAgent   = "doppel-collector-go/1"
	maxRetryAfter      = 60 * time.Second
	backoffBase        = 500 * time.Millisecond
	backoffCap         = 8 * time.Second
	maxErrorBodyBytes  = 4 << 10
	collectPath        = "/api/collect"
	contentTypeJSON    = "application/json"
	authorizationPrefx = "Bearer "
)

// DefaultBackoff waits 0.5 s before the first retry and doubles each time, up to 8 s.
func DefaultBackoff(retry int) time.Duration {
	if retry < 1 {
		retry = 1
	}
	d := backoffBase << (retry - 1)
	if d > backoffCap || d <= 0 {
		return backoffCap
	}
	return d
}

// CollectURL turns an endpoint into the collect URL: a base URL with no path (http://host:8080)
// gets /api/collect; a URL with a path is used as it is.
func CollectURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("collector: endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("collector: endpoint %q: want an http or https URL with a host", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = collectPath
	}
	return u.String(), nil
}

// Response is the collect endpoint's answer to an accepted batch.
type Response struct {
	// Accepted counts the batch's traces stored now; Duplicates those the server already had.
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	Env        string `json:"env"`
	Batch      string `json:"batch"`
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Code int
	// Detail is the error envelope's detail, or the start of the body when it is not an envelope.
	Detail     string
	retryAfter time.Duration
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("collect answered %d %s: %s", e.Code, http.StatusText(e.Code), e.Detail)
}

// Permanent reports whether sending the same body again cannot succeed: a 4xx other than
// 408 (timeout), 425 (too early) and 429 (rate limited).
func (e *StatusError) Permanent() bool {
	return e.Code >= 400 && e.Code < 500 && e.Code != http.StatusRequestTimeout &&
		e.Code != http.StatusTooEarly && e.Code != http.StatusTooManyRequests
}

// Client posts collect bodies, retrying network errors and non-2xx answers that may pass on a
// resend. Resending is safe: the server counts a trace id once per environment.
type Client struct {
	// URL is the collect URL (see CollectURL).
	URL string
	// Key is the workspace key, sent as a bearer token.
	Key string
	// Retries is how many times a failed post is tried again (0: none).
	Retries int
	// Backoff gives the wait before retry n (1, 2, …); nil means DefaultBackoff. A longer
	// Retry-After from the server wins (capped at 60 s).
	Backoff func(retry int) time.Duration
	// HTTP is the client used; nil means one with a 30 s timeout.
	HTTP *http.Client
	// UserAgent is sent as User-Agent; "" means DefaultUserAgent.
	UserAgent string
	// Header holds extra request headers, e.g. X-Doppel-Framework.
	Header http.Header

	// sleep waits d or until ctx ends; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// Post sends one collect body. It answers the server's response and how many retries it took;
// on failure the error is the last attempt's (*StatusError for a non-2xx answer).
func (c *Client) Post(ctx context.Context, body []byte) (Response, int, error) {
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			wait := c.backoff(attempt)
			var se *StatusError
			if errors.As(last, &se) && se.retryAfter > wait {
				wait = se.retryAfter
			}
			if err := c.wait(ctx, wait); err != nil {
				return Response{}, attempt - 1, fmt.Errorf("%w (gave up waiting to retry: %w)", last, err)
			}
		}
		resp, err := c.once(ctx, body)
		if err == nil {
			return resp, attempt, nil
		}
		last = err
		var se *StatusError
		if errors.As(err, &se) && se.Permanent() || ctx.Err() != nil || attempt >= c.Retries {
			return Response{}, attempt, err
		}
	}
}

func (c *Client) backoff(retry int) time.Duration {
	if c.Backoff != nil {
		return c.Backoff(retry)
	}
	return DefaultBackoff(retry)
}

func (c *Client) wait(ctx context.Context, d time.Duration) error {
	if c.sleep != nil {
		return c.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) once(ctx context.Context, body []byte) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return Response{}, fmt.Errorf("collector: %w", err)
	}
	for k, v := range c.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", contentTypeJSON)
	req.Header.Set("Authorization", authorizationPrefx+c.Key)
	ua := c.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	req.Header.Set("User-Agent", ua)
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	res, err := hc.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("collector: post: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return Response{}, statusError(res)
	}
	var out Response
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return Response{}, fmt.Errorf("collector: read answer: %w", err)
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			return Response{}, fmt.Errorf("collector: answer %d is not the collect response: %w", res.StatusCode, err)
		}
	}
	return out, nil
}

func statusError(res *http.Response) *StatusError {
	data, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBodyBytes))
	e := &StatusError{Code: res.StatusCode}
	var env struct {
		Detail string `json:"detail"`
		Errors []struct {
			Location string `json:"location"`
			Path     string `json:"path"`
			Message  string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(data, &env) == nil && env.Detail != "" {
		e.Detail = env.Detail
		var parts []string
		for _, fe := range env.Errors {
			where := fe.Path
			if where == "" {
				where = fe.Location
			}
			parts = append(parts, where+": "+fe.Message)
		}
		if len(parts) > 0 {
			e.Detail += " (" + strings.Join(parts, "; ") + ")"
		}
	} else {
		e.Detail = strings.TrimSpace(string(data))
	}
	if s := res.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			e.retryAfter = min(time.Duration(n)*time.Second, maxRetryAfter)
		} else if t, err := http.ParseTime(s); err == nil {
			e.retryAfter = min(max(time.Until(t), 0), maxRetryAfter)
		}
	}
	return e
}
