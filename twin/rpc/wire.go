// Package rpc is the twin process's internal RPC: HTTP/1.1 JSON on loopback, its server, Serve and a typed Client.
package rpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/doppel-dev/doppel/twin"
)

// Routes of the twin RPC.
const (
	PathHealth   = "/healthz"
	PathReady    = "/readyz"
	PathInfo     = "/info"
	PathSessions = "/sessions"
)

// SessionSpec is what a session's world is a pure function of (with the bundle): seed, instructions or scenario,
// clock, and the rows a Seeder made for its instructions. The same spec on the same bundle gives the same
// world_hash in any twin process.
type SessionSpec = twin.SessionSpec

// JournalEntry is one committed call of a session, as the API's journal holds it; replaying a journal rebuilds the
// session in a fresh twin. StateHash is the session's state_hash after the call.
type JournalEntry struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Content   string          `json:"content,omitempty"`
	Error     bool            `json:"error,omitempty"`
	Fidelity  string          `json:"fidelity,omitempty"`
	Rung      string          `json:"rung,omitempty"`
	StateHash string          `json:"state_hash"`
	// Injected marks a call an injected fault answered: it never reached the world, and a rebuild passes over it.
	Injected bool `json:"injected,omitempty"`
}

// Receipts are a session's reproducibility receipts (spec §2.2, §2.3).
type Receipts = twin.Receipts

// OpenRequest is the body of POST /sessions. ID is chosen by the caller. A non-empty Journal rebuilds the session:
// the twin replays it and fails with code "diverged" unless the final state_hash equals the journal's last one.
type OpenRequest struct {
	ID      string         `json:"id"`
	Spec    SessionSpec    `json:"spec"`
	Journal []JournalEntry `json:"journal,omitempty"`
}

// OpenResponse answers POST /sessions.
type OpenResponse struct {
	ID        string   `json:"id"`
	Receipts  Receipts `json:"receipts"`
	StateHash string   `json:"state_hash"`
	// Calls is the number of calls the session holds: the journal's length after a rebuild, else 0.
	Calls int64 `json:"calls"`
}

// Requestor values a call may carry (recorded, not enforced).
const (
	RequestorAssistant = "assistant"
	RequestorUser      = "user"
)

// CallRequest is the body of POST /sessions/{id}/call.
type CallRequest struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Requestor string          `json:"requestor,omitempty"`
	// ExpectCalls, when set, makes the call conditional: the twin runs it only if the session holds exactly this
	// many calls, else answers code "calls_mismatch" and changes nothing. A caller that retries a call whose answer
	// it lost sets it to its journal's length, so a call is never applied twice.
	ExpectCalls *int64 `json:"expect_calls,omitempty"`
	// Inject, when set, answers the call with an injected fault instead of running it: the session counts the call,
	// its world is unchanged, and the answer is Inject's, as the tool's error.
	Inject *Inject `json:"inject,omitempty"`
}

// Inject is an injected fault's answer: the text (a recorded error answer of the tool, or a timeout's) and the labels
// it carries.
type Inject struct {
	Content  string `json:"content"`
	Fidelity string `json:"fidelity"`
	Rung     string `json:"rung"`
}

// CallResult answers POST /sessions/{id}/call: the tool's answer and its labels, and the session's state after it.
type CallResult struct {
	Content    string `json:"content"`
	Error      bool   `json:"error"`
	Fidelity   string `json:"fidelity"`
	Rung       string `json:"rung"`
	Downgraded bool   `json:"downgraded"`
	StateHash  string `json:"state_hash"`
	// Changed reports whether the call changed the world; Note says why higher rungs did not answer.
	Changed bool   `json:"changed"`
	Note    string `json:"note,omitempty"`
	// Calls is the number of calls the session holds after this one.
	Calls int64 `json:"calls"`
}

// SessionState answers GET /sessions/{id}.
type SessionState struct {
	ID        string           `json:"id"`
	Spec      SessionSpec      `json:"spec"`
	Receipts  Receipts         `json:"receipts"`
	StateHash string           `json:"state_hash"`
	Calls     int64            `json:"calls"`
	Errors    int64            `json:"errors"`
	Fidelity  map[string]int64 `json:"fidelity"`
}

// CloseResponse answers DELETE /sessions/{id}.
type CloseResponse struct {
	Existed bool `json:"existed"`
}

// Info answers GET /info. With ?gc=1 the twin collects garbage first, so Memory reflects live data.
type Info struct {
	Ready      bool   `json:"ready"`
	BundleHash string `json:"bundle_hash"`
	Sessions   int    `json:"sessions"`
	Memory     Memory `json:"memory"`
	Goroutines int    `json:"goroutines"`
	// IdleMS is how long ago, in milliseconds, the twin last served a session request (open, call, state or
	// close), or started when it has served none: what an idle timer decides on.
	IdleMS int64 `json:"idle_ms"`
}

// Memory is the twin process's Go memory, in bytes.
type Memory struct {
	HeapAlloc uint64 `json:"heap_alloc"`
	HeapInuse uint64 `json:"heap_inuse"`
	Sys       uint64 `json:"sys"`
}

// Error codes of the twin RPC's error body.
const (
	CodeBadRequest     = "bad_request"
	CodeTooLarge       = "too_large"
	CodeNotReady       = "not_ready"
	CodeUnknownSession = "unknown_session"
	CodeUnknownTool    = "unknown_tool"
	CodeBadArguments   = "bad_arguments"
	CodeBadSpec        = "bad_spec"
	CodeNoAnswer       = "no_answer"
	CodeSessionExists  = "session_exists"
	CodeCallsMismatch  = "calls_mismatch"
	CodeDiverged       = "diverged"
	CodeInternal       = "internal"
)

// ErrorBody is the JSON body of every non-2xx answer.
type ErrorBody struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Sentinel errors. The client's errors wrap them (test with errors.Is); runtimes return errors wrapping the ones
// they apply to (ErrUnknownTool, ErrBadArguments, ErrBadSpec, ErrNoAnswer, ErrDiverged, ErrUnknownSession) so the server answers the right code.
var (
	ErrBadRequest     = errors.New("twin/rpc: bad request")
	ErrNotReady       = errors.New("twin/rpc: twin not ready")
	ErrUnknownSession = errors.New("twin/rpc: unknown session")
	ErrUnknownTool    = errors.New("twin/rpc: unknown tool")
	ErrBadArguments   = errors.New("twin/rpc: bad arguments")
	ErrBadSpec        = errors.New("twin/rpc: bad session spec")
	ErrNoAnswer       = errors.New("twin/rpc: no rung could answer")
	ErrSessionExists  = errors.New("twin/rpc: session exists")
	ErrCallsMismatch  = errors.New("twin/rpc: calls mismatch")
	ErrDiverged       = errors.New("twin/rpc: rebuilt session diverged from its journal")
	ErrUnreachable    = errors.New("twin/rpc: twin unreachable")
	ErrInternal       = errors.New("twin/rpc: twin internal error")
)

var codeErrors = map[string]error{
	CodeBadRequest:     ErrBadRequest,
	CodeTooLarge:       ErrBadRequest,
	CodeNotReady:       ErrNotReady,
	CodeUnknownSession: ErrUnknownSession,
	CodeUnknownTool:    ErrUnknownTool,
	CodeBadArguments:   ErrBadArguments,
	CodeBadSpec:        ErrBadSpec,
	CodeNoAnswer:       ErrNoAnswer,
	CodeSessionExists:  ErrSessionExists,
	CodeCallsMismatch:  ErrCallsMismatch,
	CodeDiverged:       ErrDiverged,
	CodeInternal:       ErrInternal,
}

var codeStatus = map[string]int{
	CodeBadRequest:     http.StatusBadRequest,
	CodeTooLarge:       http.StatusRequestEntityTooLarge,
	CodeNotReady:       http.StatusServiceUnavailable,
	CodeUnknownSession: http.StatusNotFound,
	CodeUnknownTool:    http.StatusNotFound,
	CodeBadArguments:   http.StatusUnprocessableEntity,
	CodeBadSpec:        http.StatusUnprocessableEntity,
	CodeNoAnswer:       http.StatusUnprocessableEntity,
	CodeSessionExists:  http.StatusConflict,
	CodeCallsMismatch:  http.StatusConflict,
	CodeDiverged:       http.StatusConflict,
	CodeInternal:       http.StatusInternalServerError,
}

// Error is a twin's error answer as the client sees it. It unwraps to the sentinel of its code.
type Error struct {
	Status int
	Code   string
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("twin answered %d %s: %s", e.Status, e.Code, e.Detail)
}

// Unwrap returns the sentinel error of e's code (ErrInternal for an unknown code).
func (e *Error) Unwrap() error {
	if err, ok := codeErrors[e.Code]; ok {
		return err
	}
	return ErrInternal
}
