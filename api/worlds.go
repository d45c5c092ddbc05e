package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
)

// registerWorlds adds the verbs over a session's world beyond calls: fork, diff and assert.
func (sr *SessionRoutes) registerWorlds(a huma.API, d *Deps) {
	Declare(a, Verb[ForkInput, ForkOutput]{
		Name:    "sessions.fork",
		Method:  http.MethodPost,
		Path:    "/v1/sessions/{session_id}/fork",
		Status:  http.StatusCreated,
		Summary: "Fork a session",
		Description: "Opens a new session — its own `ms_` token, journal and receipts — whose world is exactly this " +
			"session's after call `at_call` (default: its last call; 0: its opening world). Forking the world as it " +
			"is now is copy-on-write on the twin, so a fork costs what its own writes cost; an earlier point is " +
			"rebuilt from the journal. The fork keeps the parent's build, seed, clock and fault plan, and numbers " +
			"its own calls from `at_call + 1`, so it continues exactly as the uninterrupted session would. The " +
			"parent is not changed. Its read and transcript name what it was forked from. A fork is an opened " +
			"session: it counts among the open sessions, and past the sandbox quota it is refused with the open's " +
			"402. A fork made with the session's token ends when the session ends; one made with a key outlives " +
			"it and ends with that key.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Errors:   []int{http.StatusPaymentRequired, http.StatusConflict, http.StatusServiceUnavailable},
		Handler:  sr.fork(d),
	})
	Declare(a, Verb[DiffInput, DiffOutput]{
		Name:    "sessions.diff",
		Method:  http.MethodGet,
		Path:    "/v1/sessions/{session_id}/diff",
		Summary: "Diff a session's world",
		Description: "The entity-level change from the session's opening world (or from the world of `against`, " +
			"another session of the same build: a fork, its parent) to its world now: rows created, deleted and " +
			"updated, with each changed field's old and new value, ordered by entity, key and field path. " +
			"`expectations` are that end state as `sessions.assert` expectations: a reference run's diff is a " +
			"grader for other runs. A session that ended is rebuilt from its journal to be compared.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Errors:   []int{http.StatusConflict, http.StatusServiceUnavailable},
		Handler:  sr.diff(d),
	})
	Declare(a, Verb[AssertInput, AssertOutput]{
		Name:    "sessions.assert",
		Method:  http.MethodPost,
		Path:    "/v1/sessions/{session_id}/assert",
		Summary: "Grade a session's end state",
		Description: "Checks end-state expectations against the session's world and answers pass or fail per " +
			"expectation with what was observed. An expectation names the world's hash (`state_hash`), an entity " +
			"(`entity`), a row (`key`) or a field of it (`field`, dotted; a number indexes an array), and one " +
			"predicate: `equals` (a JSON value), `exists` (true/false), `unchanged` or `changed` (against the " +
			"opening world, or `against`'s; with no key: every row of the entity but those in `except`). Example: " +
			"order `#W1` is cancelled — `{\"entity\":\"orders\",\"key\":\"#W1\",\"field\":\"status\",\"equals\":\"cancelled\"}`; " +
			"no other order changed — `{\"entity\":\"orders\",\"unchanged\":true,\"except\":[\"#W1\"]}`. Nothing changes.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Errors:   []int{http.StatusConflict, http.StatusServiceUnavailable},
		Handler:  sr.assert(d),
	})
}

// ---- fork ----

// ForkBody is the body of POST /v1/sessions/{session_id}/fork.
type ForkBody struct {
	AtCall  *int64 `json:"at_call,omitempty" minimum:"0" doc:"Fork the world as it was after this call (0: the opening world). Omitted: after the last call."`
	AtCallB *int64 `json:"atCall,omitempty" minimum:"0" doc:"at_call, variant B name."`
	N       *int   `json:"n,omitempty" minimum:"1" doc:"Make n forks in one call, each its own session with its own id and token, all copy-on-write copies of the same world; the answer is then an array of n fork answers. The plan admits all n or none (402), and each is billed. At most config session.max_group (default 256)."`
}

// ForkInput is POST /v1/sessions/{session_id}/fork.
type ForkInput struct {
	SessionID string    `path:"session_id" doc:"Session id (ses_…) to fork."`
	Body      *ForkBody `required:"false"`
}

// ForkedFrom names the session a fork was made from and the call it was forked after.
type ForkedFrom struct {
	SessionID string `json:"sessionId" doc:"The parent session." example:"ses_0123456789abcdef"`
	AtCall    int64  `json:"atCall" doc:"The parent's call the fork was taken after (0: its opening world)."`
}

// ForkedFromA is ForkedFrom in variant A names.
type ForkedFromA struct {
	SessionID string `json:"session_id"`
	AtCall    int64  `json:"at_call"`
}

// ForkBodyOut answers a fork: a session open's answer, with where it was forked from.
type ForkBodyOut struct {
	OpenSessionBodyOut
	ForkedFrom ForkedFrom `json:"forkedFrom"`
	StateHash  string     `json:"state_hash" doc:"sha256: hash of the fork's world: the parent's after at_call."`
}

// ForkOutput is the 201 answer of a fork.
type ForkOutput struct {
	Body ForkAnswer
}

func (sr *SessionRoutes) fork(d *Deps) func(context.Context, *ForkInput) (*ForkOutput, error) {
	return func(ctx context.Context, in *ForkInput) (*ForkOutput, error) {
		p := PrincipalFrom(ctx)
		body := in.Body
		if body == nil {
			body = &ForkBody{}
		}
		at, err := oneOfInt("at_call", body.AtCall, "atCall", body.AtCallB)
		if err != nil {
			return nil, err
		}
		req := toolplaneForkRequest(p, at)
		mcpURL := func(o *toolplane.Opened) string { return sessionMCPURL(sr.MCPBase, o.Env, o.Session.ID) }
		if body.N != nil {
			os, err := sr.Plane.ForkGroup(ctx, p.Session, req, *body.N)
			if err != nil {
				return nil, err
			}
			out := &ForkOutput{Body: ForkAnswer{Many: make([]ForkBodyOut, len(os))}}
			for i, o := range os {
				out.Body.Many[i] = forkedOut(o, mcpURL(o))
			}
			return out, nil
		}
		o, err := sr.Plane.Fork(ctx, p.Session, req)
		if err != nil {
			return nil, err
		}
		one := forkedOut(o, mcpURL(o))
		return &ForkOutput{Body: ForkAnswer{One: &one}}, nil
	}
}

func oneOfInt(nameA string, a *int64, nameB string, b *int64) (*int64, error) {
	switch {
	case a != nil && b != nil && *a != *b:
		return nil, Invalid("body."+nameB, "differs from body."+nameA+": give one of the two names, or the same value under both")
	case a != nil:
		return a, nil
	}
	return b, nil
}

// ---- diff ----

// DiffInput is GET /v1/sessions/{session_id}/diff.
type DiffInput struct {
	SessionID string `path:"session_id" doc:"Session id (ses_…)."`
	Against   string `query:"against" maxLength:"128" doc:"Compare with this session's world (same build; with a session token, the session's parent or a fork of it). Omitted: the opening world."`
}

// FieldChange is one changed field of an updated row.
type FieldChange struct {
	Path string          `json:"path" doc:"Dotted path of the field (nested objects are followed; arrays are compared whole)." example:"status"`
	Old  json.RawMessage `json:"old,omitempty" doc:"The value before; absent when the field was added."`
	New  json.RawMessage `json:"new,omitempty" doc:"The value after; absent when the field was removed."`
}

// RowChange is one row's change.
type RowChange struct {
	Entity string          `json:"entity" doc:"The entity (table)." example:"orders"`
	Key    string          `json:"key" doc:"The row's key." example:"#W2378156"`
	Op     string          `json:"op" enum:"created,deleted,updated"`
	Fields []FieldChange   `json:"fields,omitempty" doc:"For updated rows: the fields that changed, by path."`
	Before json.RawMessage `json:"before,omitempty" doc:"For deleted rows: the row as it was."`
	After  json.RawMessage `json:"after,omitempty" doc:"For created rows: the row as it is."`
}

// DiffBody answers GET /v1/sessions/{session_id}/diff.
type DiffBody struct {
	SessionID    string        `json:"sessionId"`
	Against      *string       `json:"against" doc:"The session compared with; null: the opening world."`
	StateHash    string        `json:"stateHash" doc:"The hash of the session's world compared."`
	Changes      []RowChange   `json:"changes" doc:"Ordered by entity, key, field path."`
	Expectations []Expectation `json:"expectations" doc:"The end state as sessions.assert expectations (against the same baseline)."`
}

// DiffOutput wraps DiffBody.
type DiffOutput struct {
	Body DiffBody
}

func (sr *SessionRoutes) diff(d *Deps) func(context.Context, *DiffInput) (*DiffOutput, error) {
	return func(ctx context.Context, in *DiffInput) (*DiffOutput, error) {
		p := PrincipalFrom(ctx)
		against, err := sr.againstSession(ctx, p, "query.against", in.Against)
		if err != nil {
			return nil, err
		}
		res, err := sr.Plane.Diff(ctx, p.Session, against)
		if err != nil {
			return nil, err
		}
		out := DiffBody{SessionID: p.Session.ID, StateHash: res.StateHash, Changes: make([]RowChange, len(res.Changes)),
			Expectations: make([]Expectation, len(res.Expectations))}
		if against != nil {
			out.Against = &against.ID
		}
		for i, c := range res.Changes {
			rc := RowChange{Entity: c.Entity, Key: c.Key, Op: c.Op, Before: c.Before, After: c.After}
			for _, f := range c.Fields {
				rc.Fields = append(rc.Fields, FieldChange(f))
			}
			out.Changes[i] = rc
		}
		for i, e := range res.Expectations {
			out.Expectations[i] = expectationOut(e)
		}
		return &DiffOutput{Body: out}, nil
	}
}

// againstSession resolves the session to compare with: the caller's workspace's; with a session token, only the
// session's parent or a fork of it.
func (sr *SessionRoutes) againstSession(ctx context.Context, p *Principal, field, id string) (*schema.Session, error) {
	if id == "" {
		return nil, nil
	}
	s, err := sr.Plane.Session(ctx, p.Workspace.ID, id)
	if err != nil {
		return nil, err
	}
	if p.Key == nil && p.Session.ForkedFrom != s.ID && s.ForkedFrom != p.Session.ID {
		return nil, NotFound("session %s not found (a session token compares only with its parent or its forks)", id)
	}
	if s.BuildID != p.Session.BuildID {
		return nil, Invalid(field, "session "+id+" runs another build: worlds of different builds are not compared")
	}
	return s, nil
}

// ---- assert ----

// Expectation is one end-state expectation (see sessions.assert).
type Expectation struct {
	Entity    string          `json:"entity,omitempty" maxLength:"200" doc:"The entity (table), e.g. orders." example:"orders"`
	Key       *string         `json:"key,omitempty" maxLength:"1000" doc:"A row's key; omitted: the whole entity (with unchanged or changed)." example:"#W2378156"`
	Field     string          `json:"field,omitempty" maxLength:"1000" doc:"A dotted field path in the row (a number indexes an array); omitted: the whole row." example:"status"`
	Equals    json.RawMessage `json:"equals,omitempty" doc:"The row or field holds this JSON value."`
	Exists    *bool           `json:"exists,omitempty" doc:"The row or field is there (true) or not (false)."`
	Unchanged bool            `json:"unchanged,omitempty" doc:"The row, field or entity is as in the baseline (the opening world, or against's)."`
	Changed   bool            `json:"changed,omitempty" doc:"The row, field or entity differs from the baseline."`
	Except    []string        `json:"except,omitempty" maxItems:"10000" doc:"With an entity-wide unchanged/changed: keys left out."`
	StateHash string          `json:"state_hash,omitempty" maxLength:"100" doc:"The whole world hashes to this (a reference run's state_hash)."`
}

func expectationOut(e twin.Expectation) Expectation {
	return Expectation{Entity: e.Entity, Key: e.Key, Field: e.Field, Equals: e.Equals, Exists: e.Exists,
		Unchanged: e.Unchanged, Changed: e.Changed, Except: e.Except, StateHash: e.StateHash}
}

// AssertBody is the body of POST /v1/sessions/{session_id}/assert.
type AssertBody struct {
	Expect  []Expectation `json:"expect" minItems:"1" maxItems:"10000" doc:"The expectations, checked in order."`
	Against string        `json:"against,omitempty" maxLength:"128" doc:"Baseline of unchanged/changed: this session's world (same build). Omitted: the opening world."`
}

// AssertInput is POST /v1/sessions/{session_id}/assert.
type AssertInput struct {
	SessionID string `path:"session_id" doc:"Session id (ses_…)."`
	Body      AssertBody
}

// AssertResult is one expectation's verdict.
type AssertResult struct {
	Index       int             `json:"index" doc:"The expectation's place in expect, from 0."`
	Pass        bool            `json:"pass"`
	Observed    json.RawMessage `json:"observed" doc:"What the world holds there now (null: absent); for an entity, the keys that changed."`
	Baseline    json.RawMessage `json:"baseline,omitempty" doc:"For unchanged/changed on a row or field: the baseline's value."`
	Detail      string          `json:"detail" doc:"The verdict in words."`
	Expectation Expectation     `json:"expectation"`
}

// AssertBodyOut answers POST /v1/sessions/{session_id}/assert.
type AssertBodyOut struct {
	SessionID string         `json:"sessionId"`
	Pass      bool           `json:"pass" doc:"Every expectation passed."`
	Passed    int            `json:"passed"`
	Failed    int            `json:"failed"`
	StateHash string         `json:"stateHash" doc:"The hash of the world graded: compare with a reference run's."`
	Results   []AssertResult `json:"results" doc:"One per expectation, in order."`
}

// AssertOutput wraps AssertBodyOut.
type AssertOutput struct {
	Body AssertBodyOut
}

func (sr *SessionRoutes) assert(d *Deps) func(context.Context, *AssertInput) (*AssertOutput, error) {
	return func(ctx context.Context, in *AssertInput) (*AssertOutput, error) {
		p := PrincipalFrom(ctx)
		against, err := sr.againstSession(ctx, p, "body.against", in.Body.Against)
		if err != nil {
			return nil, err
		}
		exps := make([]twin.Expectation, len(in.Body.Expect))
		for i, e := range in.Body.Expect {
			exps[i] = twin.Expectation{Entity: e.Entity, Key: e.Key, Field: e.Field, Equals: e.Equals, Exists: e.Exists,
				Unchanged: e.Unchanged, Changed: e.Changed, Except: e.Except, StateHash: e.StateHash}
		}
		res, err := sr.Plane.Assert(ctx, p.Session, against, exps)
		if err != nil {
			return nil, err
		}
		out := AssertBodyOut{SessionID: p.Session.ID, StateHash: res.StateHash, Results: make([]AssertResult, len(res.Outcomes))}
		for i, o := range res.Outcomes {
			out.Results[i] = AssertResult{Index: i, Pass: o.Pass, Observed: o.Observed, Baseline: o.Baseline, Detail: o.Detail,
				Expectation: in.Body.Expect[i]}
			if o.Pass {
				out.Passed++
			} else {
				out.Failed++
			}
		}
		out.Pass = out.Failed == 0
		return &AssertOutput{Body: out}, nil
	}
}

func toolplaneForkRequest(p *Principal, at *int64) toolplane.ForkRequest {
	req := toolplane.ForkRequest{AtCall: at}
	if p.Key != nil {
		req.KeyID = p.Key.ID
	}
	return req
}
