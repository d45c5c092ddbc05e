package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/internal/osmem"
)

// Runtime is the loaded bundle the server hosts sessions on. Open builds a fresh session world from spec (an
// invalid spec fails wrapping ErrBadSpec); Rebuild builds it and replays journal, failing wrapping ErrDiverged when
// a state_hash differs from the journal's.
type Runtime interface {
	BundleHash() string
	Open(spec SessionSpec) (Session, Receipts, error)
	Rebuild(ctx context.Context, spec SessionSpec, journal []JournalEntry) (Session, Receipts, error)
}

// Session is one session world. The server serializes calls to one session. Call fails with errors wrapping
// ErrUnknownTool, ErrBadArguments or ErrNoAnswer for calls the twin cannot route, accept or answer; a tool's own
// error is a result with Error set, not a Go error. CallResult.Calls is filled by the server. Close drops the world.
type Session interface {
	Call(ctx context.Context, tool string, args json.RawMessage) (CallResult, error)
	StateHash() string
	Close()
}

// DefaultMaxBodyBytes bounds a request body when ServerOptions.MaxBodyBytes is zero. A rebuild carries a whole
// journal, so it is generous.
const DefaultMaxBodyBytes = 32 << 20

// ServerOptions configures a Server.
type ServerOptions struct {
	// MaxBodyBytes bounds every request body; larger bodies answer 413. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Memory, when set, is told each time a session's world is dropped, so a mass close gives the memory of the
	// worlds back to the OS (rate-limited) instead of leaving the process at its peak size. nil: left to the Go
	// runtime.
	Memory *osmem.Returner
}

// Server is the twin RPC's http.Handler. It answers /healthz at once and everything else with 503 not_ready until
// SetRuntime is called.
type Server struct {
	maxBody int64
	log     *slog.Logger
	mux     *http.ServeMux
	mem     *osmem.Returner // nil: none

	mu       sync.RWMutex
	rt       Runtime
	sessions map[string]*hosted

	// lastUse is the monotonic time of the last session request, in nanoseconds since start.
	start   time.Time
	lastUse atomic.Int64
	// retired is set once Serve has stopped serving this server: direct callers get ErrUnreachable.
	retired atomic.Bool
}

type hosted struct {
	mu       sync.Mutex
	closed   bool
	id       string
	spec     SessionSpec
	sess     Session
	receipts Receipts
	calls    int64
	errors   int64
	fidelity map[string]int64
}

// NewServer returns a Server with no runtime: not ready.
func NewServer(opts ServerOptions) *Server {
	s := &Server{maxBody: opts.MaxBodyBytes, log: opts.Logger, mem: opts.Memory, sessions: map[string]*hosted{}, start: time.Now()}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathHealth, s.health)
	mux.HandleFunc("GET "+PathReady, s.ready)
	mux.HandleFunc("GET "+PathInfo, s.info)
	mux.HandleFunc("POST "+PathSessions, s.open)
	mux.HandleFunc("GET "+PathSessions+"/{id}", s.state)
	mux.HandleFunc("DELETE "+PathSessions+"/{id}", s.close)
	mux.HandleFunc("POST "+PathSessions+"/{id}/call", s.call)
	s.routeWorlds(mux)
	s.mux = mux
	return s
}

// release retires the server once Serve has stopped serving it: direct callers get ErrUnreachable from then on, and
// its sessions and runtime are let go, so a local Client someone still holds does not keep a stopped twin's worlds
// in memory.
func (s *Server) release() {
	s.retired.Store(true)
	s.mu.Lock()
	sessions := s.sessions
	s.sessions = map[string]*hosted{}
	s.rt = nil
	s.mu.Unlock()
	for _, h := range sessions {
		h.mu.Lock()
		h.close()
		h.mu.Unlock()
	}
	if len(sessions) > 0 {
		s.freed()
	}
}

// freed tells the memory returner a world was dropped.
func (s *Server) freed() {
	if s.mem != nil {
		s.mem.Freed()
	}
}

// markUsed marks the twin in use, for its idle time.
func (s *Server) markUsed() { s.lastUse.Store(int64(time.Since(s.start))) }

// SetRuntime makes the server ready, hosting sessions on rt. A server Serve has released stays without one.
func (s *Server) SetRuntime(rt Runtime) {
	s.mu.Lock()
	if !s.retired.Load() {
		s.rt = rt
	}
	s.mu.Unlock()
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) runtime() Runtime {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rt
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) ready(w http.ResponseWriter, _ *http.Request) {
	if s.runtime() == nil {
		writeError(w, CodeNotReady, "the bundle is still loading")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("gc") == "1" {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.mu.RLock()
	in := Info{Ready: s.rt != nil, Sessions: len(s.sessions), Goroutines: runtime.NumGoroutine(),
		Memory: Memory{HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse, Sys: ms.Sys},
		IdleMS: (time.Since(s.start) - time.Duration(s.lastUse.Load())).Milliseconds()}
	if s.rt != nil {
		in.BundleHash = s.rt.BundleHash()
	}
	s.mu.RUnlock()
	writeJSON(w, http.StatusOK, in)
}

func (s *Server) open(w http.ResponseWriter, r *http.Request) {
	var req OpenRequest
	if !s.decode(w, r, &req) {
		return
	}
	out, err := s.OpenSession(r.Context(), req)
	reply(w, http.StatusCreated, out, err)
}

func (s *Server) call(w http.ResponseWriter, r *http.Request) {
	if !s.sessionKnown(w, r.PathValue("id")) {
		return
	}
	var req CallRequest
	if !s.decode(w, r, &req) {
		return
	}
	res, err := s.CallSession(r.Context(), r.PathValue("id"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) state(w http.ResponseWriter, r *http.Request) {
	st, err := s.SessionState(r.PathValue("id"))
	reply(w, http.StatusOK, st, err)
}

func (s *Server) close(w http.ResponseWriter, r *http.Request) {
	existed, err := s.CloseSession(r.PathValue("id"))
	reply(w, http.StatusOK, CloseResponse{Existed: existed}, err)
}

// sessionKnown answers a call for a session this twin does not hold before its body is read, as the call itself
// would.
func (s *Server) sessionKnown(w http.ResponseWriter, id string) bool {
	if _, err := s.lookup(id); err != nil {
		writeErr(w, err)
		return false
	}
	return true
}

// The session operations below are what the RPC's routes run, callable directly by a caller in this process (see
// NewLocalClient). Their errors are *Error, with the code and status the RPC answers.

// OpenSession opens session req.ID, rebuilding it from req.Journal when that is not empty (POST /sessions).
func (s *Server) OpenSession(ctx context.Context, req OpenRequest) (out OpenResponse, err error) {
	s.markUsed()
	rt := s.runtime()
	if rt == nil {
		return out, newError(CodeNotReady, "the bundle is still loading")
	}
	if err := validateSessionID(req.ID); err != nil {
		return out, newError(CodeBadRequest, err.Error())
	}
	for i, e := range req.Journal {
		if e.Tool == "" {
			return out, newError(CodeBadRequest, fmt.Sprintf("journal[%d].tool: required", i))
		}
		if !isObject(e.Arguments) {
			return out, newError(CodeBadRequest, fmt.Sprintf("journal[%d].arguments: must be a JSON object", i))
		}
	}
	s.mu.RLock()
	_, exists := s.sessions[req.ID]
	s.mu.RUnlock()
	if exists {
		return out, newError(CodeSessionExists, fmt.Sprintf("session %q is already open in this twin", req.ID))
	}

	what := "open session " + req.ID
	defer s.recoverInto(&err, what, nil)
	var (
		sess     Session
		receipts Receipts
	)
	if len(req.Journal) > 0 {
		sess, receipts, err = rt.Rebuild(ctx, req.Spec, req.Journal)
	} else {
		sess, receipts, err = rt.Open(req.Spec)
	}
	if err != nil {
		return out, s.runtimeError(what, err)
	}
	h := &hosted{id: req.ID, spec: req.Spec, sess: sess, receipts: receipts, calls: int64(len(req.Journal)),
		fidelity: map[string]int64{}}
	for _, e := range req.Journal {
		if e.Error {
			h.errors++
		}
		if e.Fidelity != "" {
			h.fidelity[e.Fidelity]++
		}
	}
	s.mu.Lock()
	if _, exists := s.sessions[req.ID]; exists {
		s.mu.Unlock()
		sess.Close()
		return out, newError(CodeSessionExists, fmt.Sprintf("session %q is already open in this twin", req.ID))
	}
	s.sessions[req.ID] = h
	s.mu.Unlock()
	return OpenResponse{ID: req.ID, Receipts: receipts, StateHash: sess.StateHash(), Calls: h.calls}, nil
}

func (s *Server) lookup(id string) (*hosted, error) {
	if s.runtime() == nil {
		return nil, newError(CodeNotReady, "the bundle is still loading")
	}
	s.mu.RLock()
	h := s.sessions[id]
	s.mu.RUnlock()
	if h == nil {
		return nil, unknownSession(id)
	}
	return h, nil
}

// CallSession runs one tool call in session id (POST /sessions/{id}/call). A call runs to its end even if ctx ends,
// so a session's state is always the result of whole calls; the runtime's own time budget bounds it.
func (s *Server) CallSession(ctx context.Context, id string, req CallRequest) (res CallResult, err error) {
	s.markUsed()
	h, err := s.lookup(id)
	if err != nil {
		return res, err
	}
	switch {
	case req.Tool == "":
		return res, newError(CodeBadRequest, "tool: required")
	case !isObject(req.Arguments):
		return res, newError(CodeBadRequest, "arguments: must be a JSON object")
	case req.Requestor != "" && req.Requestor != RequestorAssistant && req.Requestor != RequestorUser:
		return res, newError(CodeBadRequest, fmt.Sprintf("requestor: must be %q or %q, got %q", RequestorAssistant, RequestorUser, req.Requestor))
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return res, unknownSession(h.id)
	}
	if req.ExpectCalls != nil && *req.ExpectCalls != h.calls {
		return res, newError(CodeCallsMismatch, fmt.Sprintf("expect_calls: the session holds %d calls, not %d", h.calls, *req.ExpectCalls))
	}
	what := "call " + req.Tool + " in session " + h.id
	// A call that panicked may have left its world half changed: the session is dropped, so the next call rebuilds
	// it from the journal.
	defer s.recoverInto(&err, what, func() { s.drop(h) })
	if in := req.Inject; in != nil {
		// An injected fault answers instead of the tool: the call is counted, the world is not touched.
		res = CallResult{Content: in.Content, Error: true, Fidelity: in.Fidelity, Rung: in.Rung, StateHash: h.sess.StateHash()}
	} else if res, err = h.sess.Call(context.WithoutCancel(ctx), req.Tool, req.Arguments); err != nil {
		return CallResult{}, s.runtimeError(what, err)
	}
	h.calls++
	if res.Error {
		h.errors++
	}
	h.fidelity[res.Fidelity]++
	res.Calls = h.calls
	return res, nil
}

// SessionState returns session id's state (GET /sessions/{id}).
func (s *Server) SessionState(id string) (SessionState, error) {
	s.markUsed()
	h, err := s.lookup(id)
	if err != nil {
		return SessionState{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return SessionState{}, unknownSession(id)
	}
	st := SessionState{ID: h.id, Spec: h.spec, Receipts: h.receipts, StateHash: h.sess.StateHash(), Calls: h.calls,
		Errors: h.errors, Fidelity: make(map[string]int64, len(h.fidelity))}
	for k, v := range h.fidelity {
		st.Fidelity[k] = v
	}
	return st, nil
}

// CloseSession drops session id's world (DELETE /sessions/{id}); existed reports whether the twin held it.
func (s *Server) CloseSession(id string) (existed bool, err error) {
	s.markUsed()
	if s.runtime() == nil {
		return false, newError(CodeNotReady, "the bundle is still loading")
	}
	s.mu.Lock()
	h := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	if h != nil {
		h.mu.Lock()
		h.close()
		h.mu.Unlock()
		s.freed()
	}
	return h != nil, nil
}

// drop removes a session whose lock the caller holds and closes its world.
func (s *Server) drop(h *hosted) {
	s.mu.Lock()
	if s.sessions[h.id] == h {
		delete(s.sessions, h.id)
	}
	s.mu.Unlock()
	h.close()
	s.freed()
}

// close closes the session's world once; h.mu is held.
func (h *hosted) close() {
	if h.closed {
		return
	}
	h.closed = true
	if h.sess != nil {
		h.sess.Close()
		h.sess = nil
	}
}

// recoverInto turns a panic of the runtime into an internal error in *err (after running then, if set), so a bad
// handler fails its call, not the process that hosts the twin. Deferred.
func (s *Server) recoverInto(err *error, what string, then func()) {
	p := recover()
	if p == nil {
		return
	}
	s.log.Error("twin runtime panicked", "op", what, "panic", p, "stack", string(debug.Stack()))
	if then != nil {
		then()
	}
	*err = newError(CodeInternal, fmt.Sprintf("%s: the twin runtime panicked: %v", what, p))
}

// runtimeError is a runtime failure as the *Error of the code its sentinel names.
func (s *Server) runtimeError(what string, err error) error {
	switch {
	case errors.Is(err, ErrDiverged):
		return newError(CodeDiverged, err.Error())
	case errors.Is(err, ErrUnknownTool):
		return newError(CodeUnknownTool, err.Error())
	case errors.Is(err, ErrBadArguments):
		return newError(CodeBadArguments, err.Error())
	case errors.Is(err, ErrBadSpec):
		return newError(CodeBadSpec, err.Error())
	case errors.Is(err, ErrNoAnswer):
		return newError(CodeNoAnswer, err.Error())
	case errors.Is(err, ErrUnknownSession):
		return newError(CodeUnknownSession, err.Error())
	default:
		s.log.Error("twin runtime failed", "op", what, "err", err)
		return newError(CodeInternal, what+": "+err.Error())
	}
}

func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, CodeTooLarge, fmt.Sprintf("request body is over %d bytes", tooBig.Limit))
			return false
		}
		writeError(w, CodeBadRequest, "body: "+err.Error())
		return false
	}
	// One JSON value: Unmarshal refuses trailing data.
	if err := json.Unmarshal(data, v); err != nil {
		writeError(w, CodeBadRequest, "body: "+err.Error())
		return false
	}
	return true
}

// MaxSessionIDLen is the longest session id accepted.
const MaxSessionIDLen = 128

func validateSessionID(id string) error {
	if id == "" {
		return errors.New("id: required")
	}
	if len(id) > MaxSessionIDLen {
		return fmt.Errorf("id: %d bytes, longer than %d", len(id), MaxSessionIDLen)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("id: %q has %q; use letters, digits, '_', '-' or '.'", id, c)
		}
	}
	return nil
}

// isObject reports whether raw (already valid JSON, as the decoder checked it) is an object.
func isObject(raw json.RawMessage) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return true
		default:
			return false
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(ErrorBody{Code: CodeInternal, Detail: "encode answer: " + err.Error()})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b))) // never chunked, so an answer is one write
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, code, detail string) {
	writeJSON(w, codeStatus[code], ErrorBody{Code: code, Detail: detail})
}

// reply answers v with status, or err when it is set.
func reply[T any](w http.ResponseWriter, status int, v T, err error) {
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, status, v)
}

// writeErr answers err: an *Error with its code, anything else as internal.
func writeErr(w http.ResponseWriter, err error) {
	var e *Error
	if errors.As(err, &e) {
		writeError(w, e.Code, e.Detail)
		return
	}
	writeError(w, CodeInternal, err.Error())
}

// unknownSession is the error of a session this twin does not hold (any more).
func unknownSession(id string) *Error {
	return newError(CodeUnknownSession, fmt.Sprintf("session %q is not open in this twin", id))
}

// newError is the *Error the RPC answers for code.
func newError(code, detail string) *Error {
	return &Error{Status: codeStatus[code], Code: code, Detail: detail}
}
