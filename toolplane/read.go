package toolplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// State is a session as a read reports it: its row, the call counts per fidelity label, its world's hash now,
// its last use, when it expires, and its receipts.
type State struct {
	Session     *schema.Session
	Counts      []journal.FidelityCount
	NCalls      int64
	NErrors     int64
	NDowngraded int64
	StateHash   string
	LastUsedAt  time.Time
	ExpiresAt   time.Time
	Receipts    rpc.Receipts
}

// Read reports a session: calls, errors, fidelity mix, state hash, last use, expiry and receipts.
func (p *Plane) Read(ctx context.Context, s *schema.Session) (*State, error) {
	counts, err := journal.CountCalls(ctx, p.db, s.ID)
	if err != nil {
		return nil, err
	}
	st := &State{Session: s, Counts: counts, StateHash: s.WorldHash, LastUsedAt: s.CreatedAt}
	if s.ForkedFrom != "" {
		st.StateHash = s.StateHash // a fork opens on its parent's world at the fork point
	}
	for _, c := range counts {
		st.NCalls += c.N
		st.NErrors += c.Errors
		st.NDowngraded += c.Downgraded
	}
	last, err := journal.LastCall(ctx, p.db, s.ID)
	if err != nil {
		return nil, err
	}
	if last != nil {
		st.StateHash, st.LastUsedAt = last.StateHash, last.CreatedAt
	}
	if s.LastUsedAt.After(st.LastUsedAt) {
		st.LastUsedAt = s.LastUsedAt
	}
	st.ExpiresAt = st.LastUsedAt.Add(p.idle)
	if s.Status == schema.SessionOpen && schema.Now().Sub(st.LastUsedAt) > p.idle {
		// Idle past its deadline: a call would expire it now, so the read does too rather than say open until the
		// reaper comes by.
		if err := p.expireIdle(ctx, s); err != nil {
			return nil, err
		}
	}
	if s.Status != schema.SessionOpen && s.ClosedAt != nil {
		st.ExpiresAt = *s.ClosedAt
	}
	if len(s.Receipts) > 0 {
		if err := json.Unmarshal(s.Receipts, &st.Receipts); err != nil {
			return nil, fmt.Errorf("receipts of session %s: %w", s.ID, err)
		}
	}
	if st.Receipts.Pinned == nil {
		st.Receipts.Pinned = map[string][]string{}
	}
	return st, nil
}

// Transcript lists a session's calls in order: those after seq after, at most limit (0: all).
func (p *Plane) Transcript(ctx context.Context, s *schema.Session, after int64, limit int) ([]schema.Call, error) {
	return journal.ListCalls(ctx, p.db, s.ID, after, limit)
}

// Close ends a session: its token is refused at once and its world dropped. existed is true when it was open.
func (p *Plane) Close(ctx context.Context, s *schema.Session) (existed bool, err error) {
	l := p.liveOf(s.ID)
	l.mu.Lock() // wait for a call in flight
	existed, err = p.endSession(ctx, s, schema.SessionClosed)
	l.mu.Unlock()
	if err != nil {
		return false, err
	}
	p.forget(s.ID)
	if existed {
		p.finish(context.WithoutCancel(ctx), s)
	}
	p.endForks(context.WithoutCancel(ctx), s.ID, schema.SessionClosed)
	return existed, nil
}

// end moves an open session to status (expired, broken), forgets it, drops its world and ends the forks made with
// its token.
func (p *Plane) end(ctx context.Context, s *schema.Session, status string) error {
	ended, err := p.endSession(ctx, s, status)
	if err != nil {
		return err
	}
	p.forget(s.ID)
	if ended {
		p.finish(context.WithoutCancel(ctx), s)
	}
	p.endForks(context.WithoutCancel(ctx), s.ID, status)
	return nil
}

// endForks ends the open forks made with the token of session parentID, which has ended with status, and theirs in
// turn (spec §5.7: what a session token derives never outlives the session). Forks made with a key are sessions of
// that key's and stay. A fork it fails to end is logged, not reported: its token is refused all the same (its
// parent is not open) and the reaper ends it (EndOrphanedForks), so the parent's end stands.
func (p *Plane) endForks(ctx context.Context, parentID, status string) {
	forks, err := store.BoundForks(ctx, p.db, parentID)
	if err != nil {
		p.log.Warn("end the forks of an ended session", "session", parentID, "err", err)
		return
	}
	for i := range forks {
		f := &forks[i]
		l := p.liveOf(f.ID)
		l.mu.Lock() // as a close does: a call in flight finishes first
		err := p.end(ctx, f, endedWith(status))
		l.mu.Unlock()
		if err != nil {
			p.log.Warn("end a fork of an ended session", "session", parentID, "fork", f.ID, "err", err)
		}
	}
}

// endedWith is the status a fork made with its parent's token ends with when the parent ends with status: expired
// with an expired parent, closed otherwise (a broken parent's journal says nothing of the fork's own).
func endedWith(status string) string {
	if status == schema.SessionExpired {
		return schema.SessionExpired
	}
	return schema.SessionClosed
}

// endSession moves an open session to status and, with events on, records session.closed or session.expired in
// the same transaction (a broken session has no event); it reports whether the session was open.
func (p *Plane) endSession(ctx context.Context, s *schema.Session, status string) (bool, error) {
	typ := map[string]string{schema.SessionClosed: events.SessionClosed, schema.SessionExpired: events.SessionExpired}[status]
	if p.events == nil || typ == "" {
		return store.EndSession(ctx, p.db, s.ID, status)
	}
	var ended bool
	var kick []string
	err := p.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		if ended, err = store.EndSession(ctx, tx, s.ID, status); err != nil || !ended {
			return err
		}
		env, err := store.GetEnvByID(ctx, tx, s.EnvID)
		if err != nil {
			return err
		}
		ev, err := store.NewEvent(s.WorkspaceID, typ, s.ID, typ+":"+s.ID, events.SessionData{SessionID: s.ID,
			EnvID: env.ID, Env: env.Slug, BuildID: s.BuildID})
		if err != nil {
			return err
		}
		kick, err = p.events.Record(ctx, tx, ev)
		return err
	})
	if err != nil {
		return false, err
	}
	p.kick(kick)
	return ended, nil
}

// finish does what follows a session's end: its world dropped on its twin, its counters written into its row.
func (p *Plane) finish(ctx context.Context, s *schema.Session) {
	p.DropWorld(ctx, s)
	if err := store.SnapshotSession(ctx, p.db, s.ID); err != nil {
		p.log.Warn("snapshot session counters", "session", s.ID, "err", err)
	}
}

// expireIdle expires s when it is idle past the idle time, as its next call would, and updates s (status, closed
// time) to its row's.
func (p *Plane) expireIdle(ctx context.Context, s *schema.Session) error {
	l := p.liveOf(s.ID)
	l.mu.Lock() // as a call does: a call in flight finishes first, and counts as use
	err := p.checkIdle(ctx, s, l, schema.Now())
	l.mu.Unlock()
	var pe *Error
	if err != nil && !(errors.As(err, &pe) && pe.Kind == NotFound) {
		return err
	}
	row, err := store.GetSessionByID(ctx, p.db, s.ID)
	if err != nil {
		return err
	}
	s.Status, s.ClosedAt = row.Status, row.ClosedAt
	return nil
}

// ExpireDue expires an environment's open sessions that are idle past the idle time as of now, and brings the
// recorded expiry of those still in use up to date, as Reap does for every environment: a listing then says
// expired at once. At most limit sessions are looked at (default 1000).
func (p *Plane) ExpireDue(ctx context.Context, envID string, limit int) error {
	if limit <= 0 {
		limit = 1000
	}
	now := schema.Now()
	due, err := store.DueSessionsOf(ctx, p.db, envID, now, limit)
	if err != nil {
		return err
	}
	_, _, err = p.reap(ctx, due, now, p.idle)
	return err
}

// Reap expires open sessions whose last activity (their last journaled call, or their opening) is older than
// idle as of now, drops their worlds on their twins, and moves the expiry of sessions still in use to their last
// call + idle (the call path journals calls without touching the session row, so the row's expires_at is a
// lower bound this brings up to date). It also ends the forks made with a token whose parent ended without ending
// them (EndOrphanedForks). At most limit sessions are looked at (default 1000).
func (p *Plane) Reap(ctx context.Context, now time.Time, idle time.Duration, limit int) (expired []string, extended int, err error) {
	if idle <= 0 {
		return nil, 0, errors.New("reap: idle must be positive")
	}
	if limit <= 0 {
		limit = 1000
	}
	now = now.UTC()
	due, err := store.DueSessions(ctx, p.db, now, limit)
	if err != nil {
		return nil, 0, err
	}
	if expired, extended, err = p.reap(ctx, due, now, idle); err != nil {
		return expired, extended, err
	}
	_, err = p.EndOrphanedForks(ctx, limit)
	return expired, extended, err
}

// reap expires the due sessions idle past idle as of now and extends the others' recorded expiry.
func (p *Plane) reap(ctx context.Context, due []schema.Session, now time.Time, idle time.Duration) (expired []string, extended int, err error) {
	for i := range due {
		s := &due[i]
		last, err := journal.LastActivity(ctx, p.db, s)
		if err != nil {
			return expired, extended, err
		}
		if until := last.Add(idle); until.After(now) {
			if err := store.ExtendSession(ctx, p.db, s.ID, until, last); err != nil {
				return expired, extended, err
			}
			extended++
			continue
		}
		ended, err := p.endSession(ctx, s, schema.SessionExpired)
		if err != nil {
			return expired, extended, fmt.Errorf("expire session %s: %w", s.ID, err)
		}
		if !ended {
			continue // closed meanwhile
		}
		expired = append(expired, s.ID)
		p.forget(s.ID)
		p.finish(ctx, s)
		p.endForks(ctx, s.ID, schema.SessionExpired)
	}
	return expired, extended, nil
}

// EndOrphanedForks ends open forks made with a token whose parent has ended without ending them (a process died
// between the two), at most limit (default 1000); the reaper runs it. It answers how many it ended.
func (p *Plane) EndOrphanedForks(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = 1000
	}
	orphans, err := store.OrphanedForks(ctx, p.db, limit)
	if err != nil {
		return 0, err
	}
	for i := range orphans {
		f := &orphans[i]
		status := schema.SessionClosed
		if parent, err := store.GetSessionByID(ctx, p.db, f.ForkedFrom); err == nil {
			status = endedWith(parent.Status)
		}
		l := p.liveOf(f.ID)
		l.mu.Lock()
		err := p.end(ctx, f, status)
		l.mu.Unlock()
		if err != nil {
			return i, err
		}
	}
	return len(orphans), nil
}

// Woken is a wake's answer: the twin's state (booting or ready) and the build it serves.
type Woken struct {
	Env     string
	State   string
	BuildID string
	Addr    string
}

// Wake starts the twin of the environment's active build without opening a session.
func (p *Plane) Wake(ctx context.Context, workspaceID, slug string) (*Woken, error) {
	env, err := store.GetEnv(ctx, p.db, workspaceID, slug)
	if err != nil {
		return nil, notFoundOr(err, "environment "+slug)
	}
	active, err := store.ActiveTwinBuild(ctx, p.db, env)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errorf(NotReady, "environment %s has no build yet (status %s): nothing to wake", env.Slug, env.Status)
	}
	if err != nil {
		return nil, err
	}
	if p.twins == nil {
		return nil, errorf(Unavailable, "no twin directory is configured")
	}
	st, err := p.twins.WakeTwin(ctx, twinstate.Wake{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Active: active})
	if err != nil {
		return nil, errorf(Unavailable, "waking the twin of %s: %v", env.Slug, err)
	}
	if st.State == twinstate.Ready && st.HandleID != "" && !p.answers(ctx, st.Addr) {
		// The directory's ready may be stale (the twin died since its last inspection): name it a suspect, and the
		// directory inspects it and answers what it found — booting when it is gone.
		p.dropTwin(active.BuildID)
		suspect := st.HandleID
		st, err = p.twins.WakeTwin(ctx, twinstate.Wake{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Active: active, Suspect: suspect})
		if err != nil {
			return nil, errorf(Unavailable, "waking the twin of %s: %v", env.Slug, err)
		}
		if stuckOnEngine(st, suspect) {
			// It does not answer and cannot be inspected or restarted until the engine is back.
			return nil, errorf(Unavailable, "the twin of %s does not answer and cannot be restarted: %s", env.Slug, st.Error)
		}
	}
	state := st.State
	switch st.State {
	case twinstate.Ready:
	case twinstate.Failed:
		_ = store.SetTwinState(ctx, p.db, env.ID, twinstate.Stopped, "")
		return nil, errorf(Unavailable, "the twin of %s failed to start: %s", env.Slug, st.Error)
	default:
		state = twinstate.Booting
	}
	if err := store.SetTwinState(ctx, p.db, env.ID, state, st.Addr); err != nil {
		return nil, err
	}
	return &Woken{Env: env.Slug, State: state, BuildID: active.BuildID, Addr: st.Addr}, nil
}

// wakePingTimeout bounds the readiness check a wake makes of a twin its directory says is ready.
const wakePingTimeout = 2 * time.Second

// answers reports whether the twin at addr answers its readiness check (one still loading its bundle answers).
func (p *Plane) answers(ctx context.Context, addr string) bool {
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, wakePingTimeout)
	defer cancel()
	err := rpc.NewClient(addr, p.hc).Ready(ctx)
	return err == nil || errors.Is(err, rpc.ErrNotReady)
}
