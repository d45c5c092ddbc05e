// Package usage meters a workspace's use per period from durable records and holds it to its plan's limits.
package usage

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Meter names.
const (
	MeterTaskMinutes    = "task_minutes"    // session open time; a query is billed through the session it opens
	MeterToolCalls      = "tool_calls"      // journaled tool calls
	MeterQueries        = "queries"         // one-shot queries (envs.query) started in the period
	MeterModelTokens    = "model_tokens"    // prompt and completion tokens of the queries' model calls
	MeterOpenSessions   = "open_sessions"   // sessions open at once: the sandbox quota
	MeterSessions       = "sessions"        // sessions opened in the period (reported, never limited)
	MeterCollectedBytes = "collected_bytes" // per environment; over its cap collect answers 413
)

// Period lengths.
const (
	PeriodMonth = "month" // calendar month, UTC
	PeriodDay   = "day"   // calendar day, UTC
)

// Bounds returns the period of kind (PeriodMonth or PeriodDay) that t falls in: [start, end) in UTC.
func Bounds(t time.Time, kind string) (start, end time.Time) {
	t = t.UTC()
	if kind == PeriodDay {
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	}
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// Plan is an allowance per meter: a limit of 0 means none.
type Plan struct {
	TaskMinutes  int64 `koanf:"task_minutes"`
	ToolCalls    int64 `koanf:"tool_calls"`
	Queries      int64 `koanf:"queries"`
	ModelTokens  int64 `koanf:"model_tokens"`
	OpenSessions int64 `koanf:"open_sessions"`
	// CardLifts says a card on file lifts the period limits (task minutes, tool calls, queries): usage past them
	// is then billed, not refused. The open-sessions quota is never lifted.
	CardLifts bool `koanf:"card_lifts"`
	// Entitlements are given to workspaces created on the plan when the admin names none.
	Entitlements []string `koanf:"entitlements"`
}

// limit is the plan's limit of a meter, 0 for none.
func (p Plan) limit(meter string) int64 {
	switch meter {
	case MeterTaskMinutes:
		return p.TaskMinutes
	case MeterToolCalls:
		return p.ToolCalls
	case MeterQueries:
		return p.Queries
	case MeterModelTokens:
		return p.ModelTokens
	case MeterOpenSessions:
		return p.OpenSessions
	}
	return 0
}

// Value is one meter's reading.
type Value struct {
	Name string
	// Env is the environment's slug for per-environment meters (collected bytes), "" otherwise.
	Env   string
	Used  float64
	Limit float64 // 0: none
	Unit  string
}

// Reading is a workspace's usage in one period.
type Reading struct {
	Start, End time.Time
	At         time.Time
	Plan       string
	// TaskSeconds is the exact billed open time in whole seconds (see TaskSeconds for the rounding rule).
	TaskSeconds int64
	Meters      []Value
	// openSessions is the sandbox count at At; the gate extrapolates task time from it.
	openSessions int64
	sessions     int64
	calls        int64
	queries      store.QueryTotals
}

// Meter returns the named meter ("" env for workspace meters), false when absent.
func (r *Reading) Meter(name, env string) (Value, bool) {
	for _, m := range r.Meters {
		if m.Name == name && m.Env == env {
			return m, true
		}
	}
	return Value{}, false
}

// TaskSeconds is the billed open time of sessions in [from, to) at now, in whole seconds, for sessions that expire
// after idle without activity.
//
// A session is open from its open until it is closed, or until its idle deadline — its last activity (its last
// journaled call, or its opening) plus idle — whichever comes first; an open session counts up to now. The reaper
// notices an expired session later than its deadline: that delay is never billed. Rounding rule: each session's
// open time within the period is rounded up to the whole second, so a session is billed at most one second it was
// not open, and a session spanning the period boundary is billed its part in each. Task-minutes are these seconds
// / 60.
func TaskSeconds(spans []store.SessionSpan, from, to, now time.Time, idle time.Duration) int64 {
	var total int64
	for _, s := range spans {
		total += seconds(s, from, to, now, idle)
	}
	return total
}

// seconds is one session's billed seconds in [from, to).
func seconds(s store.SessionSpan, from, to, now time.Time, idle time.Duration) int64 {
	last := s.LastUsedAt
	if last.Before(s.CreatedAt) {
		last = s.CreatedAt
	}
	if s.LastCallAt != nil && s.LastCallAt.After(last) {
		last = *s.LastCallAt
	}
	deadline := s.ExpiresAt
	if idle > 0 && last.Add(idle).After(deadline) {
		deadline = last.Add(idle)
	}
	start, end := s.CreatedAt, now
	if s.ClosedAt != nil {
		end = *s.ClosedAt
	}
	if deadline.Before(end) {
		end = deadline
	}
	if start.Before(from) {
		start = from
	}
	if end.After(to) {
		end = to
	}
	d := end.Sub(start)
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Source reads a workspace's meters from the durable records: the sessions rows (open time, calls, the open
// count) and the environments rows (collected bytes). What it keeps in memory is only a memo of sums of records
// that can no longer change, so a reading after a crash is what the records say, and a session is counted once
// however often it is read.
type Source struct {
	DB     *bun.DB
	Plans  Plans
	Period string // PeriodMonth (default) or PeriodDay
	// EnvBytesCap is the collected-bytes cap of each environment (collect.max_env_bytes; 0: none).
	EnvBytesCap int64
	// Idle is how long a session without activity stays open (session.idle; default store.DefaultSessionIdle).
	Idle time.Duration

	mu      sync.Mutex
	settled map[settledKey]settled
}

// SettleAfter is how far behind now a Source's memo stops: a session that ended before it is settled (its billed
// time and calls can no longer change: no call is journaled for a session after its end), and a session opened
// before it has its row. The margin covers a commit in flight at that moment, a slow journal batch and another
// API process's clock.
const SettleAfter = time.Minute

type settledKey struct {
	workspace string
	from      time.Time
}

// settled memoizes sums of a workspace's records in one period up to a moment: the sessions that ended before it
// (their time and calls) and the sessions opened before it. These records no longer change, so the memo holds
// until the period ends; it is moved forward by summing only the records between its moment and the next (read
// through indexes by when sessions ended and opened), and summed from the records whenever it is missing (a
// restart). A reading is then the memo plus what came after it, whatever the period's history.
type settled struct {
	before time.Time
	tot    store.TaskTotals
	opened int64
}

// memo returns the workspace's memo of the period starting at from, moved forward to cut; ok is false when there
// is none to use (cut is not in the period, or behind the memo: a reading of an earlier moment).
func (s *Source) memo(ctx context.Context, workspaceID string, from, to, now, cut time.Time, idle time.Duration) (settled, bool, error) {
	if !cut.After(from) {
		return settled{}, false, nil
	}
	key := settledKey{workspaceID, from}
	s.mu.Lock()
	m, ok := s.settled[key]
	s.mu.Unlock()
	switch {
	case ok && m.before.After(cut):
		return settled{}, false, nil
	case ok && m.before.Equal(cut):
		return m, true, nil
	}
	since := from
	if ok {
		since = m.before
	}
	tot, err := store.SumTaskTime(ctx, s.DB, workspaceID, from, to, now, idle, store.Part{EndedFrom: since, EndedBefore: cut, Settled: true})
	if err != nil {
		return settled{}, false, err
	}
	opened, err := store.SessionsOpenedIn(ctx, s.DB, workspaceID, since, cut)
	if err != nil {
		return settled{}, false, err
	}
	m = settled{before: cut, tot: store.TaskTotals{Seconds: m.tot.Seconds + tot.Seconds, Calls: m.tot.Calls + tot.Calls}, opened: m.opened + opened}
	s.mu.Lock()
	if s.settled == nil {
		s.settled = map[settledKey]settled{}
	}
	for k := range s.settled {
		if k.workspace == workspaceID && k.from != from {
			delete(s.settled, k) // a past period's memo
		}
	}
	if cur, ok := s.settled[key]; !ok || cur.before.Before(cut) {
		s.settled[key] = m
	}
	s.mu.Unlock()
	return m, true, nil
}

// taskTime is the period's task time, calls and sessions opened: the memo's sums plus the live sessions' and the
// ones opened since (read each time), which equals summing every session at once.
func (s *Source) taskTime(ctx context.Context, workspaceID string, from, to, now time.Time, idle time.Duration) (store.TaskTotals, int64, error) {
	m, ok, err := s.memo(ctx, workspaceID, from, to, now, now.Add(-SettleAfter), idle)
	if err != nil {
		return store.TaskTotals{}, 0, err
	}
	if !ok {
		tot, err := store.SumTaskTime(ctx, s.DB, workspaceID, from, to, now, idle, store.Part{})
		if err != nil {
			return store.TaskTotals{}, 0, err
		}
		opened, err := store.SessionsOpenedIn(ctx, s.DB, workspaceID, from, to)
		return tot, opened, err
	}
	live, err := store.SumTaskTime(ctx, s.DB, workspaceID, from, to, now, idle, store.Part{EndedBefore: m.before})
	if err != nil {
		return store.TaskTotals{}, 0, err
	}
	opened, err := store.SessionsOpenedIn(ctx, s.DB, workspaceID, m.before, to)
	if err != nil {
		return store.TaskTotals{}, 0, err
	}
	return store.TaskTotals{Seconds: m.tot.Seconds + live.Seconds, Calls: m.tot.Calls + live.Calls}, m.opened + opened, nil
}

// Read reads ws's usage in the period now falls in.
func (s *Source) Read(ctx context.Context, ws *schema.Workspace, now time.Time) (*Reading, error) {
	from, to := Bounds(now, s.Period)
	planName, plan := s.Plans.Of(ws)
	open, err := store.OpenSessions(ctx, s.DB, ws.ID)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	envs, err := store.CollectedBytes(ctx, s.DB, ws.ID)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	idle := s.Idle
	if idle <= 0 {
		idle = store.DefaultSessionIdle
	}
	// The database applies TaskSeconds's rule (store.SumTaskTime; a test holds the two equal).
	tot, sessions, err := s.taskTime(ctx, ws.ID, from, to, now, idle)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	qs, err := store.QueriesIn(ctx, s.DB, ws.ID, from, to)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	r := &Reading{Start: from, End: to, At: now, Plan: planName, openSessions: int64(open), sessions: sessions,
		calls: tot.Calls, TaskSeconds: tot.Seconds, queries: qs}
	r.fill(plan, envs, s.EnvBytesCap)
	return r, nil
}

// fill derives the meters from the counts.
func (r *Reading) fill(plan Plan, envs []store.EnvBytes, envCap int64) {
	lim := func(m string) float64 { return float64(plan.limit(m)) }
	r.Meters = []Value{
		{Name: MeterTaskMinutes, Used: float64(r.TaskSeconds) / 60, Limit: lim(MeterTaskMinutes), Unit: "minutes"},
		{Name: MeterToolCalls, Used: float64(r.calls), Limit: lim(MeterToolCalls), Unit: "calls"},
		{Name: MeterQueries, Used: float64(r.queries.Queries), Limit: lim(MeterQueries), Unit: "queries"},
		{Name: MeterModelTokens, Used: float64(r.queries.Tokens), Limit: lim(MeterModelTokens), Unit: "tokens"},
		{Name: MeterOpenSessions, Used: float64(r.openSessions), Limit: lim(MeterOpenSessions), Unit: "sessions"},
		{Name: MeterSessions, Used: float64(r.sessions), Unit: "sessions"},
	}
	for _, e := range envs {
		r.Meters = append(r.Meters, Value{Name: MeterCollectedBytes, Env: e.Slug, Used: float64(e.CollectedBytes), Limit: float64(envCap), Unit: "bytes"})
	}
}
