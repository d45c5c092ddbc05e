package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/doppel-dev/doppel/internal/osmem"
)

// Defaults of the request-body budget.
const (
	// DefaultBodyBudget is the most request-body bytes the API holds at once, over all requests.
	DefaultBodyBudget = 256 << 20
	// DefaultBodyBudgetPerCredential is the most body bytes the requests of one workspace (whatever credential they
	// carry) hold at once.
	DefaultBodyBudgetPerCredential = 64 << 20
	// DefaultBodyBudgetPerAddress is the most body bytes the requests of one client address hold at once while they
	// carry no credential that resolves (OAuth, console sign-in, anything before a credential is known).
	DefaultBodyBudgetPerAddress = 1 << 20
	// DefaultBodyReadGrace is how long a body may take before the minimum rate applies to it.
	DefaultBodyReadGrace = 10 * time.Second
	// DefaultBodyMinRate is the least average rate, in bytes a second, a body must arrive at after the grace.
	DefaultBodyMinRate = 16 << 10
	// DefaultReturnMemoryEvery is the shortest time between two returns of memory to the OS after large bodies.
	DefaultReturnMemoryEvery = 10 * time.Second
	// DefaultRouteBodyCap is the admission cap of a route that declares none (huma's own default).
	DefaultRouteBodyCap = 1 << 20
	// largeBody is the body size from which a request counts as large: once no large body is in flight, the
	// memory they took is returned to the OS.
	largeBody = 1 << 20
	// budgetRetryAfter is the Retry-After of a request refused for want of budget, in seconds.
	budgetRetryAfter = 1
)

// errOverBudget ends the read of a body of unknown length that would take the server past its body budget.
var errOverBudget = errors.New("request body over the server's in-flight body budget")

// errSlowBody ends the read of a body that arrives under the minimum rate.
var errSlowBody = errors.New("request body arrived under the minimum rate")

// BodyLimits are the request-body budget's settings (zero values: the defaults; a negative Size: no budget).
type BodyLimits struct {
	// Size is the most body bytes held at once over all requests (api.body_budget_bytes).
	Size int64
	// PerCredential is the most one workspace's requests hold at once (api.body_budget_per_credential_bytes).
	PerCredential int64
	// PerAddress is the most one client address's requests without a resolving credential hold at once
	// (api.body_budget_per_address_bytes).
	PerAddress int64
	// ReadGrace is how long a body may take before MinRate applies (api.body_read_grace).
	ReadGrace time.Duration
	// MinRate is the least average bytes a second a body must arrive at after ReadGrace (api.body_min_rate_bytes);
	// negative: no minimum.
	MinRate int64
}

func (l BodyLimits) withDefaults() BodyLimits {
	if l.Size == 0 {
		l.Size = DefaultBodyBudget
	}
	if l.PerCredential <= 0 {
		l.PerCredential = DefaultBodyBudgetPerCredential
	}
	if l.PerAddress <= 0 {
		l.PerAddress = DefaultBodyBudgetPerAddress
	}
	if l.ReadGrace <= 0 {
		l.ReadGrace = DefaultBodyReadGrace
	}
	if l.MinRate == 0 {
		l.MinRate = DefaultBodyMinRate
	}
	return l
}

// bodyBudget bounds the request-body bytes held at once over every route (collect, the multipart build, REST and
// tRPC JSON bodies), per workspace and per anonymous client address. Admission, before the handler runs, checks a
// declared Content-Length against the route's own cap (413), the client's share (413 when it can never fit, else
// 429 while the client's other bodies hold it) and what is left of the whole (503), never queueing; a body without
// a length takes its bytes as they are read. Every admitted body must arrive at MinRate on average after ReadGrace,
// or its read ends and the request is answered 408. Large bodies that finish give their memory back to the OS
// (rate-limited), so a spike of uploads does not leave the process at its peak size.
type bodyBudget struct {
	sem      *semaphore.Weighted
	lim      BodyLimits
	inflight atomic.Int64
	refused  atomic.Int64
	ret      *osmem.Returner
	obs      BudgetObserver

	mu   sync.Mutex
	held map[string]int64 // bytes held by each client (workspace or anonymous address)
}

// BudgetObserver is told the bytes in flight after each change and each refusal (the metrics do).
type BudgetObserver interface {
	BodyBytesInFlight(n int64)
	BodyRefused()
}

func newBodyBudget(lim BodyLimits, returnEvery time.Duration, obs BudgetObserver) *bodyBudget {
	lim = lim.withDefaults()
	if lim.Size < 0 {
		return nil
	}
	b := &bodyBudget{sem: semaphore.NewWeighted(lim.Size), lim: lim, obs: obs, held: map[string]int64{}}
	if returnEvery >= 0 {
		if returnEvery == 0 {
			returnEvery = DefaultReturnMemoryEvery
		}
		b.ret = osmem.New(returnEvery, nil)
	}
	return b
}

// client is who a body's bytes are counted against: a workspace whose credential resolved, or else the address.
type client struct {
	key       string // "ws:<id>" or "addr:<host>"
	anonymous bool
}

func (b *bodyBudget) share(c client) (int64, string) {
	if c.anonymous {
		return b.lim.PerAddress, "api.body_budget_per_address_bytes"
	}
	return b.lim.PerCredential, "api.body_budget_per_credential_bytes"
}

// admission is an admitted body: release gives its bytes back once the request is done; over and slow are set
// when its read ran out of budget or fell under the minimum rate.
type admission struct {
	release func()
	over    atomic.Bool
	slow    atomic.Bool
	// routeDeadline records a read deadline the route set itself (collect's whole-body timeout): the body's reads
	// keep the earlier of it and the minimum rate's.
	routeDeadline func(time.Time)
}

// admit takes the budget of r's body for c, under the route's cap. It answers the admission, or the envelope to
// refuse r with. The body is wrapped so that its read keeps the minimum rate (with w's connection read deadline)
// and, when its length is unknown, so that its bytes are taken as they are read.
func (b *bodyBudget) admit(w http.ResponseWriter, r *http.Request, routeCap int64, c client) (*admission, *Envelope) {
	if b == nil || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	if routeCap > 0 && r.ContentLength > routeCap {
		return nil, TooLarge("request body of %d bytes is over this route's cap of %d bytes", r.ContentLength, routeCap)
	}
	if r.ContentLength > b.lim.Size {
		return nil, TooLarge("request body of %d bytes is over the server's in-flight body budget of %d bytes (api.body_budget_bytes)",
			r.ContentLength, b.lim.Size)
	}
	share, shareKey := b.share(c)
	if r.ContentLength > share {
		who := "a workspace's requests"
		if c.anonymous {
			who = "requests without a valid credential from one address"
		}
		return nil, TooLarge("request body of %d bytes is over the %d bytes %s may hold at once (%s)",
			r.ContentLength, share, who, shareKey)
	}
	a := &admission{}
	br := &budgetReader{ReadCloser: r.Body, b: b, c: c, a: a, rc: http.NewResponseController(w), start: time.Now()}
	a.routeDeadline = br.setRouteDeadline
	if r.ContentLength > 0 {
		n := r.ContentLength
		if e := b.take(c, n); e != nil {
			return nil, e
		}
		large := n >= largeBody
		if large && b.ret != nil {
			b.ret.Begin()
		}
		a.release = func() {
			br.done()
			b.give(c, n)
			if large && b.ret != nil {
				b.ret.End()
			}
		}
	} else {
		br.counted = true
		a.release = br.release
	}
	r.Body = br
	return a, nil
}

// take holds n bytes for c: nil, or the refusal (429 over c's share, 503 over the whole budget).
func (b *bodyBudget) take(c client, n int64) *Envelope {
	share, shareKey := b.share(c)
	b.mu.Lock()
	if b.held[c.key]+n > share {
		b.mu.Unlock()
		b.refuse()
		e := RateLimited(fmt.Sprintf("this client's request bodies in flight are at its share of the body budget (%d bytes, %s); retry after %d s",
			share, shareKey, budgetRetryAfter))
		e.retryAfter = budgetRetryAfter
		return e
	}
	if !b.sem.TryAcquire(n) {
		b.mu.Unlock()
		b.refuse()
		return b.refusal()
	}
	b.held[c.key] += n
	b.mu.Unlock()
	v := b.inflight.Add(n)
	if b.obs != nil {
		b.obs.BodyBytesInFlight(v)
	}
	return nil
}

func (b *bodyBudget) refuse() {
	b.refused.Add(1)
	if b.obs != nil {
		b.obs.BodyRefused()
	}
}

func (b *bodyBudget) give(c client, n int64) {
	b.mu.Lock()
	if left := b.held[c.key] - n; left > 0 {
		b.held[c.key] = left
	} else {
		delete(b.held, c.key)
	}
	b.sem.Release(n)
	b.mu.Unlock()
	v := b.inflight.Add(-n)
	if b.obs != nil {
		b.obs.BodyBytesInFlight(v)
	}
}

func (b *bodyBudget) refusal() *Envelope {
	e := Unavailable("the server is reading its most request-body bytes at once (%d, api.body_budget_bytes); retry after %d s",
		b.lim.Size, budgetRetryAfter)
	e.retryAfter = budgetRetryAfter
	return e
}

func (b *bodyBudget) slowRefusal() *Envelope {
	return Errorf(http.StatusRequestTimeout, "the request body arrived under %d bytes a second after %s (api.body_min_rate_bytes, api.body_read_grace)",
		b.lim.MinRate, b.lim.ReadGrace)
}

// refuse answers r with e: the REST envelope, tRPC's error shape under /trpc/, or OTLP's google.rpc.Status at
// /v1/traces. A 503 or 429 carries Retry-After.
func refuse(w http.ResponseWriter, r *http.Request, e *Envelope) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	// The body is left unread: closing the connection spares the client sending the rest of it.
	w.Header().Set("Connection", "close")
	if strings.HasPrefix(r.URL.Path, "/trpc/") {
		trpcFail(w, r, e)
		return
	}
	if r.URL.Path == tracesPath { // OTLP/HTTP's error body
		writeTraceRefusal(w, r, e)
		return
	}
	writeEnvelope(w, e.status, e)
}

// budgetReader keeps an admitted body's read at the minimum rate, and takes a body of unknown length's bytes from
// the budget as they are read (counted).
type budgetReader struct {
	io.ReadCloser
	b       *bodyBudget
	c       client
	a       *admission
	rc      *http.ResponseController
	start   time.Time
	counted bool

	mu       sync.Mutex
	route    time.Time // the route's own read deadline (zero: none)
	read     int64     // bytes read so far
	taken    int64     // bytes taken from the budget (counted bodies)
	large    bool
	deadline bool // a read deadline is set on the connection
	finished bool
}

// nextDeadline is when the next byte must have arrived: the body may be ReadGrace late on the schedule of MinRate.
func (br *budgetReader) nextDeadline() time.Time {
	lim := br.b.lim
	return br.start.Add(lim.ReadGrace + time.Duration(float64(br.read+1)/float64(lim.MinRate)*float64(time.Second)))
}

func (br *budgetReader) Read(p []byte) (int, error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.a.slow.Load() {
		return 0, errSlowBody
	}
	ours := false
	if br.b.lim.MinRate > 0 && !br.finished {
		d := br.nextDeadline()
		ours = br.route.IsZero() || d.Before(br.route)
		if !ours {
			d = br.route
		}
		if err := br.rc.SetReadDeadline(d); err == nil {
			br.deadline = true
		}
	}
	n, err := br.ReadCloser.Read(p)
	if err != nil && ours && errors.Is(err, os.ErrDeadlineExceeded) {
		br.a.slow.Store(true)
		return n, errSlowBody
	}
	br.read += int64(n)
	if err == io.EOF {
		br.clearDeadline()
	}
	if n > 0 && br.counted {
		if br.a.over.Load() || br.b.take(br.c, int64(n)) != nil {
			br.a.over.Store(true)
			return 0, errOverBudget
		}
		br.taken += int64(n)
		if !br.large && br.taken >= largeBody && br.b.ret != nil {
			br.large = true
			br.b.ret.Begin()
		}
	}
	return n, err
}

// clearDeadline drops the body's read deadline once it is read (the caller holds mu), so a handler that streams
// its answer afterwards is not cut off by it.
func (br *budgetReader) clearDeadline() {
	br.finished = true
	if br.deadline {
		_ = br.rc.SetReadDeadline(time.Time{})
		br.deadline = false
	}
}

// setRouteDeadline records the route's own read deadline (statusWriter.SetReadDeadline).
func (br *budgetReader) setRouteDeadline(t time.Time) {
	br.mu.Lock()
	br.route = t
	br.mu.Unlock()
}

// done clears the deadline at the request's end (net/http sets its own for the next request).
func (br *budgetReader) done() {
	br.mu.Lock()
	br.finished = true
	br.mu.Unlock()
}

func (br *budgetReader) release() {
	br.mu.Lock()
	defer br.mu.Unlock()
	br.finished = true
	if br.taken > 0 {
		br.b.give(br.c, br.taken)
		br.taken = 0
	}
	if br.large {
		br.large = false
		br.b.ret.End()
	}
}

// clientOf names who r's body counts against: the workspace of a credential that resolves (a bearer credential,
// or the console's web session on /trpc/), else the client address.
func (s *server) clientOf(r *http.Request) client {
	if s.auth != nil {
		if ws := s.auth.workspaceOf(r.Context(), r.Header.Get("Authorization")); ws != "" {
			return client{key: "ws:" + ws}
		}
		if s.web != nil && r.Header.Get("Authorization") == "" && strings.HasPrefix(r.URL.Path, "/trpc/") {
			if ws, err := s.web.fromRequest(r); err == nil && ws != nil {
				return client{key: "ws:" + ws.claims.Workspace}
			}
		}
	}
	return client{key: "addr:" + clientAddress(r.RemoteAddr, r.Header.Get("X-Forwarded-For"), s.trustForwarded), anonymous: true}
}

// routeCap is the admission cap of the route r goes to (pattern: its mux pattern, "" for tRPC and unrouted).
func (s *server) routeCap(r *http.Request, pattern string) int64 {
	if strings.HasPrefix(r.URL.Path, "/trpc/") {
		return trpcMaxBody
	}
	s.capsMu.RLock()
	n, ok := s.caps[pattern]
	s.capsMu.RUnlock()
	if ok {
		return n
	}
	return DefaultRouteBodyCap
}

// setCap records the body cap of a route's mux pattern (negative: none but the budget's).
func (s *server) setCap(pattern string, n int64) {
	s.capsMu.Lock()
	defer s.capsMu.Unlock()
	if n < 0 {
		n = 0
	}
	s.caps[pattern] = n
}

// workspaceOf is the workspace a bearer credential resolves to, "" when it is missing or does not resolve. It
// counts no failed credential: the route's own authentication does.
func (a *Authenticator) workspaceOf(ctx context.Context, authorization string) string {
	if a == nil || a.DB == nil || authorization == "" {
		return ""
	}
	tok, err := credential(authorization)
	if err != nil {
		return ""
	}
	if a.admin != nil && a.admin.matches(tok) {
		return "admin"
	}
	ws, err := a.resolveAny(ctx, tok)
	switch {
	case err == nil:
		return ws
	case notFound(err):
		return ""
	}
	// The database did not answer: the route's authentication will (503); meanwhile the credential counts as its
	// own, never as the address's.
	sum := sha256.Sum256([]byte(tok))
	return "unresolved:" + hex.EncodeToString(sum[:8])
}

// mcpMaxBody is the MCP SDK's own cap on a POST to an MCP address.
const mcpMaxBody = 4 << 20

// plainRouteCaps are the body caps of the plain net/http routes that read a body (huma operations declare theirs;
// routes whose cap depends on configuration set it with Deps.BodyCap).
var plainRouteCaps = map[string]int64{
	"POST " + oauthRegister:  oauthMaxBody,
	"POST " + oauthAuthorize: oauthMaxBody,
	"POST " + oauthToken:     oauthMaxBody,
	"POST " + oauthRevoke:    oauthMaxBody,
	"POST /console/signin":   consoleSignInMaxBody,
	"POST /console/signout":  consoleSignInMaxBody,
	"/mcp":                   mcpMaxBody,
	"/mcp/envs/{slug}":       mcpMaxBody,
}

// BodyCap declares the body cap of a plain route's mux pattern, checked against a declared Content-Length before
// the route runs (413 above it); negative: only the budget's.
func (d *Deps) BodyCap(pattern string, n int64) {
	if d.srv != nil {
		d.srv.setCap(pattern, n)
	}
}
