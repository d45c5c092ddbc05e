package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/doppel-dev/doppel/twin"
)

// Forker is a Session that can be forked: Fork answers an independent session whose world is this one's now.
type Forker interface {
	Fork() (Session, error)
}

// Grader is a Session whose world can be compared: Diff answers the entity-level change from against's world (nil:
// its opening world) to its own, with the expectations that hold exactly for it; Assert checks expectations, with
// against (nil: the opening world) as the baseline of unchanged/changed.
type Grader interface {
	Diff(against Session) ([]twin.Change, []twin.Expectation, error)
	Assert(exps []twin.Expectation, against Session) ([]twin.Outcome, error)
}

// ForkRequest is the body of POST /sessions/{id}/fork: the new session's id, and optionally the number of calls the
// session must hold (else code "calls_mismatch"), so a fork is taken exactly after the call the caller means.
type ForkRequest struct {
	ID          string `json:"id"`
	ExpectCalls *int64 `json:"expect_calls,omitempty"`
}

// DiffRequest is the body of POST /sessions/{id}/diff: the session to compare with ("" for the opening world).
type DiffRequest struct {
	Against string `json:"against,omitempty"`
}

// DiffResult answers POST /sessions/{id}/diff.
type DiffResult struct {
	Changes      []twin.Change      `json:"changes"`
	Expectations []twin.Expectation `json:"expectations"`
	StateHash    string             `json:"state_hash"`
}

// AssertRequest is the body of POST /sessions/{id}/assert.
type AssertRequest struct {
	Against string             `json:"against,omitempty"`
	Expect  []twin.Expectation `json:"expect"`
}

// AssertResult answers POST /sessions/{id}/assert: one outcome per expectation, in order.
type AssertResult struct {
	Outcomes  []twin.Outcome `json:"outcomes"`
	StateHash string         `json:"state_hash"`
}

// CodeBadExpectation answers an expectation that is not well formed; the detail starts with its place
// ("expect[2].entity: …").
const CodeBadExpectation = "bad_expectation"

// ErrBadExpectation is the sentinel of CodeBadExpectation.
var ErrBadExpectation = errors.New("twin/rpc: bad expectation")

func init() {
	codeErrors[CodeBadExpectation] = ErrBadExpectation
	codeStatus[CodeBadExpectation] = http.StatusUnprocessableEntity
}

func (s *Server) routeWorlds(mux *http.ServeMux) {
	mux.HandleFunc("POST "+PathSessions+"/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		var req ForkRequest
		if !s.decode(w, r, &req) {
			return
		}
		out, err := s.ForkSession(r.PathValue("id"), req)
		reply(w, http.StatusCreated, out, err)
	})
	mux.HandleFunc("POST "+PathSessions+"/{id}/diff", func(w http.ResponseWriter, r *http.Request) {
		var req DiffRequest
		if !s.decode(w, r, &req) {
			return
		}
		out, err := s.DiffSession(r.PathValue("id"), req)
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST "+PathSessions+"/{id}/assert", func(w http.ResponseWriter, r *http.Request) {
		var req AssertRequest
		if !s.decode(w, r, &req) {
			return
		}
		out, err := s.AssertSession(r.PathValue("id"), req)
		reply(w, http.StatusOK, out, err)
	})
}

// ForkSession opens session req.ID as a fork of session id: its world is id's world now, copy-on-write; its call
// count, errors and fidelity mix start as id's (POST /sessions/{id}/fork).
func (s *Server) ForkSession(id string, req ForkRequest) (out OpenResponse, err error) {
	s.markUsed()
	if err := validateSessionID(req.ID); err != nil {
		return out, newError(CodeBadRequest, err.Error())
	}
	h, err := s.lookup(id)
	if err != nil {
		return out, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return out, unknownSession(id)
	}
	if req.ExpectCalls != nil && *req.ExpectCalls != h.calls {
		h.mu.Unlock()
		return out, newError(CodeCallsMismatch, fmt.Sprintf("expect_calls: the session holds %d calls, not %d", h.calls, *req.ExpectCalls))
	}
	fk, ok := h.sess.(Forker)
	if !ok {
		h.mu.Unlock()
		return out, newError(CodeBadRequest, "this twin's sessions cannot be forked")
	}
	what := "fork session " + id
	defer s.recoverInto(&err, what, nil)
	sess, err := fk.Fork()
	f := &hosted{id: req.ID, spec: h.spec, receipts: h.receipts, calls: h.calls, errors: h.errors,
		fidelity: make(map[string]int64, len(h.fidelity))}
	for k, v := range h.fidelity {
		f.fidelity[k] = v
	}
	h.mu.Unlock()
	if err != nil {
		return out, s.runtimeError(what, err)
	}
	f.sess = sess
	s.mu.Lock()
	if _, exists := s.sessions[req.ID]; exists {
		s.mu.Unlock()
		sess.Close()
		return out, newError(CodeSessionExists, fmt.Sprintf("session %q is already open in this twin", req.ID))
	}
	s.sessions[req.ID] = f
	s.mu.Unlock()
	return OpenResponse{ID: req.ID, Receipts: f.receipts, StateHash: sess.StateHash(), Calls: f.calls}, nil
}

// grader answers session id's world as a Grader, and against's ("" for none).
func (s *Server) grader(id, against string) (Grader, Session, error) {
	one := func(id string) (Session, error) {
		h, err := s.lookup(id)
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.closed {
			return nil, unknownSession(id)
		}
		return h.sess, nil
	}
	sess, err := one(id)
	if err != nil {
		return nil, nil, err
	}
	g, ok := sess.(Grader)
	if !ok {
		return nil, nil, newError(CodeBadRequest, "this twin's sessions cannot be compared")
	}
	if against == "" {
		return g, nil, nil
	}
	other, err := one(against)
	if err != nil {
		return nil, nil, err
	}
	return g, other, nil
}

// DiffSession answers the change from req.Against's world (or the opening world) to session id's (POST
// /sessions/{id}/diff).
func (s *Server) DiffSession(id string, req DiffRequest) (out DiffResult, err error) {
	s.markUsed()
	g, other, err := s.grader(id, req.Against)
	if err != nil {
		return out, err
	}
	what := "diff session " + id
	defer s.recoverInto(&err, what, nil)
	out.Changes, out.Expectations, err = g.Diff(other)
	if err != nil {
		return DiffResult{}, s.worldError(what, err)
	}
	out.StateHash = g.(Session).StateHash()
	return out, nil
}

// AssertSession checks expectations against session id's world (POST /sessions/{id}/assert).
func (s *Server) AssertSession(id string, req AssertRequest) (out AssertResult, err error) {
	s.markUsed()
	g, other, err := s.grader(id, req.Against)
	if err != nil {
		return out, err
	}
	what := "assert on session " + id
	defer s.recoverInto(&err, what, nil)
	out.Outcomes, err = g.Assert(req.Expect, other)
	if err != nil {
		return AssertResult{}, s.worldError(what, err)
	}
	out.StateHash = g.(Session).StateHash()
	return out, nil
}

func (s *Server) worldError(what string, err error) error {
	var ee *twin.ExpectError
	switch {
	case errors.As(err, &ee):
		return newError(CodeBadExpectation, ee.Error())
	case errors.Is(err, twin.ErrOtherWorld):
		return newError(CodeBadRequest, err.Error())
	}
	return s.runtimeError(what, mapTwinErr(err))
}

// Fork opens session req.ID as a fork of session id.
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) (OpenResponse, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "fork")
		if err != nil {
			return OpenResponse{}, err
		}
		return s.ForkSession(id, req)
	}
	var out OpenResponse
	err := c.do(ctx, http.MethodPost, sessionPath(id)+"/fork", req, &out)
	return out, err
}

// Diff answers the change from req.Against's world (or the opening world) to session id's.
func (c *Client) Diff(ctx context.Context, id string, req DiffRequest) (DiffResult, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "diff")
		if err != nil {
			return DiffResult{}, err
		}
		return s.DiffSession(id, req)
	}
	var out DiffResult
	err := c.do(ctx, http.MethodPost, sessionPath(id)+"/diff", req, &out)
	return out, err
}

// Assert checks expectations against session id's world.
func (c *Client) Assert(ctx context.Context, id string, req AssertRequest) (AssertResult, error) {
	if c.local != nil {
		s, err := c.direct(ctx, "assert")
		if err != nil {
			return AssertResult{}, err
		}
		return s.AssertSession(id, req)
	}
	var out AssertResult
	err := c.do(ctx, http.MethodPost, sessionPath(id)+"/assert", req, &out)
	return out, err
}

func (s twinSession) Fork() (Session, error) {
	f, err := s.s.Fork()
	if err != nil {
		return nil, mapTwinErr(err)
	}
	return twinSession{f}, nil
}

func (s twinSession) other(against Session) (*twin.Session, error) {
	if against == nil {
		return nil, nil
	}
	o, ok := against.(twinSession)
	if !ok {
		return nil, twin.ErrOtherWorld
	}
	return o.s, nil
}

func (s twinSession) Diff(against Session) ([]twin.Change, []twin.Expectation, error) {
	o, err := s.other(against)
	if err != nil {
		return nil, nil, err
	}
	d, err := s.s.Diff(o)
	if err != nil {
		return nil, nil, err
	}
	return d, s.s.ExpectationsFrom(d), nil
}

func (s twinSession) Assert(exps []twin.Expectation, against Session) ([]twin.Outcome, error) {
	o, err := s.other(against)
	if err != nil {
		return nil, err
	}
	return s.s.Assert(exps, o)
}
