package twinrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
}

// Server is the twin RPC's http.Handler. It answers /healthz at once and everything else with 503 not_ready until
// SetRuntime is called.
type Server struct {
	maxBody int64
	log     *slog.Logger
	mux     *http.ServeMux

	mu       sync.RWMutex
	rt       Runtime
	sessions map[string]*hosted

	// lastUse is the monotonic time of the last session request, in nanoseconds since start.
	start   time.Time
	lastUse atomic.Int64
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
	s := &Server{maxBody: opts.MaxBodyBytes, log: opts.Logger, sessions: map[string]*hosted{}, start: time.Now()}
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
	mux.HandleFunc("POST "+PathSessions, s.used(s.open))
	mux.HandleFunc("GET "+PathSessions+"/{id}", s.used(s.state))
	mux.HandleFunc("DELETE "+PathSessions+"/{id}", s.used(s.close))
	mux.HandleFunc("POST "+PathSessions+"/{id}/call", s.used(s.call))
	s.mux = mux
	return s
}

// used marks the twin in use for its idle time.
func (s *Server) used(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.lastUse.Store(int64(time.Since(s.start)))
		h(w, r)
	}
}

// SetRuntime makes the server ready, hosting sessions on rt.
func (s *Server) SetRuntime(rt Runtime) {
	s.mu.Lock()
	s.rt = rt
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
	rt := s.runtime()
	if rt == nil {
		writeError(w, CodeNotReady, "the bundle is still loading")
		return
	}
	var req OpenRequest
	if !s.decode(w, r, &req) {
		return
	}
	if err := validateSessionID(req.ID); err != nil {
		writeError(w, CodeBadRequest, err.Error())
		return
	}
	for i, e := range req.Journal {
		if e.Tool == "" {
			writeError(w, CodeBadRequest, fmt.Sprintf("journal[%d].tool: required", i))
			return
		}
		if !isObject(e.Arguments) {
			writeError(w, CodeBadRequest, fmt.Sprintf("journal[%d].arguments: must be a JSON object", i))
			return
		}
	}
	s.mu.RLock()
	_, exists := s.sessions[req.ID]
	s.mu.RUnlock()
	if exists {
		writeError(w, CodeSessionExists, fmt.Sprintf("session %q is already open in this twin", req.ID))
		return
	}

	var (
		sess     Session
		receipts Receipts
		err      error
	)
	if len(req.Journal) > 0 {
		sess, receipts, err = rt.Rebuild(r.Context(), req.Spec, req.Journal)
	} else {
		sess, receipts, err = rt.Open(req.Spec)
	}
	if err != nil {
		s.runtimeError(w, "open session "+req.ID, err)
		return
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
		writeError(w, CodeSessionExists, fmt.Sprintf("session %q is already open in this twin", req.ID))
		return
	}
	s.sessions[req.ID] = h
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, OpenResponse{ID: req.ID, Receipts: receipts, StateHash: sess.StateHash(), Calls: h.calls})
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*hosted, bool) {
	if s.runtime() == nil {
		writeError(w, CodeNotReady, "the bundle is still loading")
		return nil, false
	}
	id := r.PathValue("id")
	s.mu.RLock()
	h := s.sessions[id]
	s.mu.RUnlock()
	if h == nil {
		writeError(w, CodeUnknownSession, fmt.Sprintf("session %q is not open in this twin", id))
		return nil, false
	}
	return h, true
}

func (s *Server) call(w http.ResponseWriter, r *http.Request) {
	h, ok := s.lookup(w, r)
	if !ok {
		return
	}
	var req CallRequest
	if !s.decode(w, r, &req) {
		return
	}
	switch {
	case req.Tool == "":
		writeError(w, CodeBadRequest, "tool: required")
		return
	case !isObject(req.Arguments):
		writeError(w, CodeBadRequest, "arguments: must be a JSON object")
		return
	case req.Requestor != "" && req.Requestor != RequestorAssistant && req.Requestor != RequestorUser:
		writeError(w, CodeBadRequest, fmt.Sprintf("requestor: must be %q or %q, got %q", RequestorAssistant, RequestorUser, req.Requestor))
		return
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		writeError(w, CodeUnknownSession, fmt.Sprintf("session %q is not open in this twin", h.id))
		return
	}
	if req.ExpectCalls != nil && *req.ExpectCalls != h.calls {
		writeError(w, CodeCallsMismatch, fmt.Sprintf("expect_calls: the session holds %d calls, not %d", h.calls, *req.ExpectCalls))
		return
	}
	// A call runs to its end even if the caller goes away, so a session's state is always the result of whole calls;
	// the runtime's own time budget bounds it.
	res, err := h.sess.Call(context.WithoutCancel(r.Context()), req.Tool, req.Arguments)
	if err != nil {
		s.runtimeError(w, "call "+req.Tool+" in session "+h.id, err)
		return
	}
	h.calls++
	if res.Error {
		h.errors++
	}
	h.fidelity[res.Fidelity]++
	res.Calls = h.calls
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) state(w http.ResponseWriter, r *http.Request) {
	h, ok := s.lookup(w, r)
	if !ok {
		return
	}
	h.mu.Lock()
	st := SessionState{ID: h.id, Spec: h.spec, Receipts: h.receipts, StateHash: h.sess.StateHash(), Calls: h.calls,
		Errors: h.errors, Fidelity: make(map[string]int64, len(h.fidelity))}
	for k, v := range h.fidelity {
		st.Fidelity[k] = v
	}
	h.mu.Unlock()
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) close(w http.ResponseWriter, r *http.Request) {
	if s.runtime() == nil {
		writeError(w, CodeNotReady, "the bundle is still loading")
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	h := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	if h != nil {
		h.mu.Lock()
		h.closed = true
		h.sess.Close()
		h.sess = nil
		h.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, CloseResponse{Existed: h != nil})
}

// runtimeError answers a runtime failure with the code its sentinel names.
func (s *Server) runtimeError(w http.ResponseWriter, what string, err error) {
	switch {
	case errors.Is(err, ErrDiverged):
		writeError(w, CodeDiverged, err.Error())
	case errors.Is(err, ErrUnknownTool):
		writeError(w, CodeUnknownTool, err.Error())
	case errors.Is(err, ErrBadArguments):
		writeError(w, CodeBadArguments, err.Error())
	case errors.Is(err, ErrBadSpec):
		writeError(w, CodeBadSpec, err.Error())
	case errors.Is(err, ErrNoAnswer):
		writeError(w, CodeNoAnswer, err.Error())
	case errors.Is(err, ErrUnknownSession):
		writeError(w, CodeUnknownSession, err.Error())
	default:
		s.log.Error("twin runtime failed", "op", what, "err", err)
		writeError(w, CodeInternal, what+": "+err.Error())
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
