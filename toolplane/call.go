package toolplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// CallRequest is one tool call.
type CallRequest struct {
	Tool string
	// Arguments is a JSON object.
	Arguments []byte
	// Requestor is assistant, user or "" (recorded, not enforced).
	Requestor string
}

// CallResult is a journaled call's answer, with where its time went.
type CallResult struct {
	rpc.CallResult
	CallID string
	// Ms is the latency of the tool answer in milliseconds.
	Ms int64
	// Twin is the twin's answer time (with the RPC); Journal the durable commit's.
	Twin, Journal time.Duration
	// Fault labels an injected fault (nil: none): an error or timeout answered instead of the tool, or latency added.
	Fault *Fault
	// Episode is where the session's episode stands after the call (nil: the session is not an episode).
	Episode *EpisodeState
}

// Call runs one tool call in an open session's world down the rung ladder and journals it durably before it
// answers. A twin that lost the session gets it rebuilt from the journal; a stopped twin is woken (NotReady).
func (p *Plane) Call(ctx context.Context, s *schema.Session, req CallRequest) (*CallResult, error) {
	if s.Status != schema.SessionOpen {
		return nil, errorf(NotFound, "session %s is %s", s.ID, s.Status)
	}
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || args[0] != '{' {
		return nil, invalid("body.arguments", "expected a JSON object")
	}
	l := p.liveOf(s.ID)
	l.mu.Lock()
	defer l.mu.Unlock()

	now := schema.Now()
	if err := p.checkIdle(ctx, s, l, now); err != nil {
		return nil, err
	}
	if p.quota != nil {
		// Before the twin runs anything: a refused call changes nothing and is not journaled.
		if err := p.quota.AdmitCall(ctx, s.WorkspaceID); err != nil {
			return nil, err
		}
	}
	if err := p.loadBuild(ctx, s, l); err != nil {
		return nil, err
	}
	bundle, err := p.bundles.Get(ctx, l.build)
	if err != nil {
		return nil, err
	}
	if _, ok := bundle.ToolByName(req.Tool); !ok {
		return nil, errorf(NotFound, "tool %q not found: the twin cannot route it (GET /v1/envs/{slug}/tools lists the tools)", req.Tool)
	}
	// Arguments whose values break the tool's input schema are the tool's own error, answered by the twin (spec
	// §4.8); only arguments that are not a JSON object are refused here.
	if !json.Valid(args) {
		return nil, invalid("body.arguments", "not valid JSON")
	}
	if l.calls < 0 {
		n, err := p.lastSeq(ctx, s)
		if err != nil {
			return nil, err
		}
		l.calls, l.lastToolKnown = n, false
	}
	ep, err := p.episode(s, l)
	if err != nil {
		return nil, err
	}
	if ep != nil {
		// A call after the episode is done is refused before anything runs.
		if err := p.episodeDone(ctx, s, l, ep); err != nil {
			return nil, err
		}
	}

	treq := rpc.CallRequest{Tool: req.Tool, Arguments: json.RawMessage(args), Requestor: req.Requestor}
	started := time.Now()
	fault, inject, err := p.drawFault(s, l, bundle, req.Tool, l.calls+1)
	if err != nil {
		return nil, err
	}
	treq.Inject = inject
	if err := wait(ctx, fault); err != nil {
		return nil, errorf(Unavailable, "the call was given up during its injected latency, and not run: %v", err)
	}
	tctx, span := p.span(ctx, "twin.call")
	res, err := p.callTwin(tctx, s, l, treq)
	if span != nil {
		span.SetAttributes(attribute.String("doppel.session_id", s.ID), attribute.String("doppel.tool", req.Tool))
		if err == nil {
			span.SetAttributes(attribute.String("doppel.fidelity", res.Fidelity), attribute.String("doppel.rung", res.Rung),
				attribute.Bool("doppel.tool_error", res.Error))
		}
		endSpan(span, err)
	}
	if err != nil {
		return nil, err
	}
	ms := time.Since(started).Milliseconds()
	c := schema.Call{
		ID: schema.NewSortableID(schema.PrefixCall, now), SessionID: s.ID, Seq: l.calls + 1, Tool: treq.Tool,
		Arguments: json.RawMessage(args), Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
		Downgraded: res.Downgraded, Ms: ms, Requestor: treq.Requestor, StateHash: res.StateHash, CreatedAt: now,
	}
	if fault != nil {
		if c.Fault, err = json.Marshal(fault); err != nil {
			return nil, err
		}
	}
	// Outputs are kept when asked for, and always for simulated answers: a rebuilt session replays those from the
	// journal instead of asking the model again.
	if s.RecordOutputs || res.Rung == twin.RungSimulate {
		c.Content = res.Content
	}
	journaled := time.Now()
	_, span = p.span(ctx, "journal.commit")
	err = p.journal.Submit(context.WithoutCancel(ctx), c)
	if span != nil {
		span.SetAttributes(attribute.String("doppel.call_id", c.ID))
		endSpan(span, err)
	}
	if err != nil {
		// The twin applied a call the journal does not hold: drop the twin's copy so the next call rebuilds the
		// session from the journal, and do not answer.
		l.calls = -1
		p.DropWorld(context.WithoutCancel(ctx), s)
		return nil, errorf(Unavailable, "the call could not be journaled, so it was not answered; retry: %v", err)
	}
	l.calls++
	l.lastTool, l.lastToolKnown = treq.Tool, true
	l.lastUsed = now
	if p.quota != nil {
		p.quota.Called(s.WorkspaceID)
	}
	out := &CallResult{CallResult: res, CallID: c.ID, Ms: ms, Twin: journaled.Sub(started), Journal: time.Since(journaled), Fault: fault}
	if ep != nil {
		if out.Episode, err = p.grade(ctx, s, l, ep); err != nil {
			return nil, fmt.Errorf("the call %s was journaled, but its episode could not be graded (grade it with sessions.assert): %w", c.ID, err)
		}
	}
	return out, nil
}

// checkIdle answers NotFound for a session idle past the idle time, expiring it (the reaper would, later).
func (p *Plane) checkIdle(ctx context.Context, s *schema.Session, l *liveSession, now time.Time) error {
	if !l.lastUsed.IsZero() && now.Sub(l.lastUsed) <= p.idle {
		return nil
	}
	// This process has not seen the session used recently (or at all): ask the journal.
	act, err := journal.LastActivity(ctx, p.db, s)
	if err != nil {
		return err
	}
	l.lastUsed = act
	if now.Sub(act) <= p.idle {
		return nil
	}
	if err := p.end(ctx, s, schema.SessionExpired); err != nil {
		return err
	}
	return errorf(NotFound, "session %s expired after %s idle", s.ID, p.idle)
}

// callTwin runs the call on the twin of the session's build, recovering what can be recovered: a twin that lost the
// session (restart) gets it rebuilt from the journal; a stale journal length is re-read; a twin that does not
// answer is reported to the directory (which restarts it if dead). A twin that is stopped or booting is woken and
// answered NotReady.
func (p *Plane) callTwin(ctx context.Context, s *schema.Session, l *liveSession, req rpc.CallRequest) (rpc.CallResult, error) {
	suspect := ""
	for attempt := 0; ; attempt++ {
		te, err := p.twin(ctx, s, l, suspect)
		if err != nil {
			return rpc.CallResult{}, err
		}
		expect := l.calls
		req.ExpectCalls = &expect
		res, err := te.c.Call(ctx, s.ID, req)
		if err == nil {
			if res.Calls != expect+1 {
				return rpc.CallResult{}, fmt.Errorf("twin reports %d calls after call %d of session %s", res.Calls, expect+1, s.ID)
			}
			return res, nil
		}
		last := attempt >= 2
		switch {
		case errors.Is(err, rpc.ErrUnknownTool):
			return rpc.CallResult{}, errorf(NotFound, "tool %q not found: the twin cannot route it", req.Tool)
		case errors.Is(err, rpc.ErrNoAnswer):
			return rpc.CallResult{}, errorf(NotFound, "tool %q cannot be answered by this twin: %s", req.Tool, twinDetail(err))
		case errors.Is(err, rpc.ErrBadArguments):
			return rpc.CallResult{}, invalid("body.arguments", twinDetail(err))
		case errors.Is(err, rpc.ErrUnknownSession) && !last:
			if err := p.rebuild(ctx, te.c, s, l); err != nil {
				return rpc.CallResult{}, err
			}
		case errors.Is(err, rpc.ErrCallsMismatch) && !last:
			if err := p.resync(ctx, te.c, s, l); err != nil {
				return rpc.CallResult{}, err
			}
		case rpc.IsRetryable(err) && suspect == "" && !last:
			// The twin did not answer: have the directory check it (and restart it if dead), then try again.
			p.dropTwin(s.BuildID)
			suspect = te.handleID
			if suspect == "" {
				suspect = "unreachable"
			}
		case rpc.IsRetryable(err):
			p.dropTwin(s.BuildID)
			return rpc.CallResult{}, errorf(NotReady, "the session's twin is starting; retry in a moment")
		default:
			return rpc.CallResult{}, fmt.Errorf("call %s in session %s: %w", req.Tool, s.ID, err)
		}
	}
}

func twinDetail(err error) string {
	var te *rpc.Error
	if errors.As(err, &te) {
		return te.Detail
	}
	return err.Error()
}

// rebuild reopens a session its twin no longer holds from its spec and journal. A rebuilt state that differs from
// the journal's marks the session broken.
func (p *Plane) rebuild(ctx context.Context, tc *rpc.Client, s *schema.Session, l *liveSession) error {
	// The twin may have dropped the world because the session ended (closed through another API process, or
	// reaped): never bring an ended session back.
	cur, err := store.GetSessionByID(ctx, p.db, s.ID)
	if err != nil {
		return err
	}
	if cur.Status != schema.SessionOpen {
		p.forget(s.ID)
		return errorf(NotFound, "session %s is %s", s.ID, cur.Status)
	}
	journal, err := p.lineage(ctx, s, allCalls, 0)
	if err != nil {
		return err
	}
	_, err = tc.Open(context.WithoutCancel(ctx), rpc.OpenRequest{ID: s.ID, Spec: specOf(s), Journal: journal})
	switch {
	case err == nil, errors.Is(err, rpc.ErrSessionExists):
		l.calls = int64(len(journal))
		return nil
	case errors.Is(err, rpc.ErrDiverged):
		if _, eerr := store.EndSession(ctx, p.db, s.ID, schema.SessionBroken); eerr != nil {
			return eerr
		}
		p.forget(s.ID)
		p.endForks(context.WithoutCancel(ctx), s.ID, schema.SessionBroken)
		return errorf(Conflict, "session %s is broken: rebuilding it from its journal gave another world (%s); open a new session", s.ID, twinDetail(err))
	}
	return fmt.Errorf("rebuild session %s: %w", s.ID, err)
}

// resync makes the journal length and the twin's agree after a calls mismatch: equal counts just refresh ours; a
// twin ahead of the journal (a call applied but never journaled) loses its copy and is rebuilt.
func (p *Plane) resync(ctx context.Context, tc *rpc.Client, s *schema.Session, l *liveSession) error {
	n, err := p.lastSeq(ctx, s)
	if err != nil {
		return err
	}
	st, err := tc.Session(ctx, s.ID)
	if err != nil && !errors.Is(err, rpc.ErrUnknownSession) {
		return fmt.Errorf("read session %s on its twin: %w", s.ID, err)
	}
	if err == nil && st.Calls == n {
		l.calls = n
		return nil
	}
	if err == nil {
		if _, err := tc.Close(ctx, s.ID); err != nil && !errors.Is(err, rpc.ErrUnknownSession) {
			return err
		}
	}
	return p.rebuild(ctx, tc, s, l)
}

// specOf is the spec that rebuilds a session's world: its open's inputs, plus the rows a Seeder made then and the
// calls of the trace it opened from (kept in its receipts), so the rebuild never asks the model again. Receipts that do not decode give no rows; a world that
// needed them then diverges, and the session is marked broken rather than served a different world.
func specOf(s *schema.Session) rpc.SessionSpec {
	spec := rpc.SessionSpec{Seed: s.Seed, SeedInstructions: s.SeedInstructions, Scenario: s.Scenario, Clock: s.Clock}
	var rc rpc.Receipts
	if len(s.Receipts) > 0 && json.Unmarshal(s.Receipts, &rc) == nil {
		spec.SeedRows, spec.World = rc.SeedRows, rc.World
		if rc.Trace != nil {
			spec.Trace = &twin.TraceSpec{ID: rc.Trace.ID, Calls: rc.TraceCalls}
		}
	}
	return spec
}

// twin returns the ready twin of the session's build: as last found, or from the directory, which wakes it when it
// is stopped (then NotReady; a twin that failed to start is Unavailable). suspect names a twin that did not answer,
// for the directory to check.
func (p *Plane) twin(ctx context.Context, s *schema.Session, l *liveSession, suspect string) (*twinEntry, error) {
	if suspect == "" {
		p.mu.Lock()
		te := p.clients[s.BuildID]
		p.mu.Unlock()
		if te != nil {
			return te, nil
		}
	}
	if p.twins == nil {
		return nil, errorf(Unavailable, "no twin directory is configured")
	}
	env, err := store.GetEnvByID(ctx, p.db, s.EnvID)
	if err != nil {
		return nil, notFoundOr(err, "environment")
	}
	active, err := store.ActiveTwinBuild(ctx, p.db, env)
	if errors.Is(err, store.ErrNotFound) {
		active = store.TwinBuildOf(l.build)
	} else if err != nil {
		return nil, err
	}
	st, err := p.twins.WakeTwin(ctx, twinstate.Wake{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Active: active, Build: store.TwinBuildOf(l.build), Suspect: suspect})
	if err != nil {
		return nil, errorf(Unavailable, "the session's twin cannot be found: %v", err)
	}
	if stuckOnEngine(st, suspect) {
		// It does not answer and the engine cannot be asked why or restart it: not a wait of a moment.
		return nil, errorf(Unavailable, "the session's twin does not answer, and the Docker engine that would restart it cannot be reached; retry once it is back")
	}
	switch st.State {
	case twinstate.Ready:
		if st.Addr == "" {
			return nil, errorf(NotReady, "the session's twin is starting; retry in a moment")
		}
		te := &twinEntry{c: rpc.Dial(st.Addr, p.hc, p.locals), handleID: st.HandleID}
		p.mu.Lock()
		p.clients[s.BuildID] = te
		p.mu.Unlock()
		return te, nil
	case twinstate.Failed:
		return nil, errorf(Unavailable, "the session's twin failed to start: %s", st.Error)
	}
	return nil, errorf(NotReady, "the session's twin is %s; it is being started, retry in a moment", st.State)
}

// stuckOnEngine reports whether the directory, asked about a twin that did not answer (suspect), still calls it
// ready only because its last inspection could not reach the Docker engine: the twin cannot be checked or
// restarted until the engine is back. (A successful inspection or boot clears the error.)
func stuckOnEngine(st twinstate.Status, suspect string) bool {
	return suspect != "" && st.State == twinstate.Ready && st.ErrorType == twinstate.EngineUnreachable
}

func (p *Plane) dropTwin(buildID string) {
	p.mu.Lock()
	te := p.clients[buildID]
	delete(p.clients, buildID)
	p.mu.Unlock()
	if te != nil {
		te.c.CloseIdle()
	}
}

// DropWorld drops a session's world on its build's twin if that twin runs, best effort: a stopped twin holds no
// worlds, and none is booted for this.
func (p *Plane) DropWorld(ctx context.Context, s *schema.Session) {
	p.mu.Lock()
	te := p.clients[s.BuildID]
	p.mu.Unlock()
	var tc *rpc.Client
	switch {
	case te != nil:
		tc = te.c
	case p.twins != nil:
		running, err := p.twins.RunningTwins(ctx, s.EnvID)
		if err != nil {
			p.log.Warn("list running twins", "env", s.EnvID, "err", err)
			return
		}
		st, ok := running[s.BuildID]
		if !ok || st.Addr == "" {
			return // no twin runs that build: nothing holds the world
		}
		tc = rpc.Dial(st.Addr, p.hc, p.locals)
	default:
		return
	}
	if _, err := tc.Close(ctx, s.ID); err != nil && !errors.Is(err, rpc.ErrUnknownSession) && !errors.Is(err, rpc.ErrUnreachable) {
		p.log.Warn("drop session world on twin", "session", s.ID, "err", err)
	}
}
