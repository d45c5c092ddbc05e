package store

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// Meter names.
const (
	MeterTaskMinutes = "task_minutes"
	MeterSessions    = "sessions"
	MeterCalls       = "calls"
	MeterQueries     = "queries"
)

// Period is the usage period a time falls in: its UTC month, "2006-01".
func Period(t time.Time) string { return t.UTC().Format("2006-01") }

// AddUsage adds amount to a workspace's meter for a period, creating the meter at 0 first.
// Concurrent adds are summed, never lost.
func AddUsage(ctx context.Context, db bun.IDB, workspaceID, period, meter string, amount float64) error {
	if period == "" || meter == "" {
		return fmt.Errorf("store: add usage: %w: period and meter are required", ErrInvalid)
	}
	m := &schema.UsageMeter{WorkspaceID: workspaceID, Period: period, Meter: meter, Amount: amount, UpdatedAt: now()}
	_, err := db.NewInsert().Model(m).
		On("CONFLICT (workspace_id, period, meter) DO UPDATE").
		Set("amount = ?TableAlias.amount + EXCLUDED.amount").
		Set("updated_at = EXCLUDED.updated_at").
		Exec(ctx)
	if err != nil {
		return wrap(err, "add usage %s/%s", period, meter)
	}
	return nil
}

// ListUsage returns a workspace's meters for a period, by meter name.
func ListUsage(ctx context.Context, db bun.IDB, workspaceID, period string) ([]schema.UsageMeter, error) {
	out := []schema.UsageMeter{}
	if err := db.NewSelect().Model(&out).Where("workspace_id = ? AND period = ?", workspaceID, period).Order("meter ASC").Scan(ctx); err != nil {
		return nil, wrap(err, "list usage %s", period)
	}
	return out, nil
}

// SessionSpan is what billing reads of one session, all from durable rows: when it opened, when it ended (nil
// while open), its recorded idle deadline (a lower bound: the call path does not move it, the reaper does), its
// last activity (its last journaled call, or its last recorded use) and its journaled calls made in the period.
type SessionSpan struct {
	CreatedAt    time.Time  `bun:"created_at"`
	ClosedAt     *time.Time `bun:"closed_at"`
	ExpiresAt    time.Time  `bun:"expires_at"`
	LastUsedAt   time.Time  `bun:"last_used_at"`
	LastCallAt   *time.Time `bun:"last_call_at"`
	CallsInRange int64      `bun:"calls_in_range"`
}

// SessionSpans returns the spans of a workspace's sessions that may have been open in [from, to): opened before
// to and not ended before from. Calls are read from the journal (the calls rows), never from the session's
// counters, which are written only when it ends.
func SessionSpans(ctx context.Context, db bun.IDB, workspaceID string, from, to time.Time) ([]SessionSpan, error) {
	from, to = from.UTC(), to.UTC()
	out := []SessionSpan{}
	calls := db.NewSelect().TableExpr("calls AS c").
		ColumnExpr("c.session_id, MAX(c.created_at) AS last_call_at").
		ColumnExpr("SUM(CASE WHEN c.created_at >= ? AND c.created_at < ? THEN 1 ELSE 0 END) AS calls_in_range", from, to).
		Join("JOIN sessions AS cs ON cs.id = c.session_id").
		Where("cs.workspace_id = ? AND cs.created_at < ?", workspaceID, to).
		Where("(cs.closed_at IS NULL OR cs.closed_at >= ?)", from).
		Group("c.session_id")
	err := db.NewSelect().TableExpr("sessions AS s").
		ColumnExpr("s.created_at, s.closed_at, s.expires_at, s.last_used_at, k.last_call_at").
		ColumnExpr("COALESCE(k.calls_in_range, 0) AS calls_in_range").
		Join("LEFT JOIN (?) AS k ON k.session_id = s.id", calls).
		Where("s.workspace_id = ? AND s.created_at < ?", workspaceID, to).
		Where("(s.closed_at IS NULL OR s.closed_at >= ?)", from).
		Scan(ctx, &out)
	if err != nil {
		return nil, wrap(err, "session spans of workspace %q", workspaceID)
	}
	return out, nil
}

// SessionsOpenedIn counts a workspace's sessions opened in [from, to).
func SessionsOpenedIn(ctx context.Context, db bun.IDB, workspaceID string, from, to time.Time) (int64, error) {
	n, err := db.NewSelect().Model((*schema.Session)(nil)).
		Where("workspace_id = ? AND created_at >= ? AND created_at < ?", workspaceID, from.UTC(), to.UTC()).Count(ctx)
	if err != nil {
		return 0, wrap(err, "sessions of workspace %q", workspaceID)
	}
	return int64(n), nil
}

// OpenSessions counts a workspace's open sessions: the sandbox quota. A session idle past its deadline that the
// reaper has not yet expired still holds its world, so it counts until it is.
func OpenSessions(ctx context.Context, db bun.IDB, workspaceID string) (int, error) {
	n, err := db.NewSelect().Model((*schema.Session)(nil)).
		Where("workspace_id = ? AND status = ?", workspaceID, schema.SessionOpen).Count(ctx)
	if err != nil {
		return 0, wrap(err, "open sessions of workspace %q", workspaceID)
	}
	return int(n), nil
}

// EnvBytes is one environment's collected bytes.
type EnvBytes struct {
	Slug           string `bun:"slug"`
	CollectedBytes int64  `bun:"collected_bytes"`
}

// CollectedBytes lists a workspace's environments' collected bytes, by slug.
func CollectedBytes(ctx context.Context, db bun.IDB, workspaceID string) ([]EnvBytes, error) {
	out := []EnvBytes{}
	err := db.NewSelect().Model((*schema.Environment)(nil)).Column("slug", "collected_bytes").
		Where("workspace_id = ?", workspaceID).Order("slug ASC").Scan(ctx, &out)
	if err != nil {
		return nil, wrap(err, "collected bytes of workspace %q", workspaceID)
	}
	return out, nil
}

// OpenLimitError refuses a session that would take a workspace past its most open sessions at once.
type OpenLimitError struct {
	Open, Limit int
}

func (e *OpenLimitError) Error() string {
	return fmt.Sprintf("store: %d sessions are open, the most this workspace may have open at once is %d", e.Open, e.Limit)
}

// CreateSessionWithin is CreateSession that refuses (*OpenLimitError, nothing written) when the workspace already
// has maxOpen sessions open (maxOpen ≤ 0: no cap). The count and the insert are one transaction serialized per
// workspace: on PostgreSQL by a lock on the workspace's row, on SQLite by its immediate transactions, so racing
// opens never pass the cap.
func CreateSessionWithin(ctx context.Context, db bun.IDB, s *schema.Session, maxOpen int) (string, error) {
	if maxOpen <= 0 {
		return CreateSession(ctx, db, s)
	}
	var token string
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		env, err := GetEnvByID(ctx, tx, s.EnvID)
		if err != nil {
			return fmt.Errorf("store: create session: %w", err)
		}
		if isPostgres(tx) {
			if _, err := tx.NewSelect().Model((*schema.Workspace)(nil)).Column("id").Where("id = ?", env.WorkspaceID).
				For("UPDATE").Exec(ctx); err != nil {
				return wrap(err, "lock workspace %q", env.WorkspaceID)
			}
		}
		open, err := OpenSessions(ctx, tx, env.WorkspaceID)
		if err != nil {
			return err
		}
		if open >= maxOpen {
			return &OpenLimitError{Open: open, Limit: maxOpen}
		}
		token, err = CreateSession(ctx, tx, s)
		return err
	})
	if err != nil {
		return "", err
	}
	return token, nil
}

// TaskTotals are a workspace's billed task-seconds and journaled calls in a period.
type TaskTotals struct {
	Seconds int64 `bun:"seconds"`
	Calls   int64 `bun:"calls"`
}

// Part splits a workspace's sessions at a moment: those that ended before it (settled: nothing about them changes
// any more) and the rest (live). The zero Part is every session. A settled Part with EndedFrom set holds only the
// sessions that ended in [EndedFrom, EndedBefore): what a memo of the settled sessions up to EndedFrom lacks.
type Part struct {
	EndedBefore time.Time
	Settled     bool
	EndedFrom   time.Time
}

// sessions is the SQL of the part's sessions of a workspace that may have been open in [from, to), with its
// arguments. Settled increments and the live part are read through sessions_workspace_closed_idx, by when they
// ended, so neither grows with the period's history: the live part is the open sessions (closed_at NULL) and
// the ones that ended at or after EndedBefore, two ranges of the index.
func (p Part) sessions(pg bool, workspaceID string, from, to time.Time) (string, []any) {
	cols := "SELECT id, created_at, closed_at, expires_at, last_used_at FROM sessions WHERE workspace_id = ? AND created_at < ?"
	if !p.EndedBefore.IsZero() && !pg {
		// The unary plus keeps SQLite's planner off the (workspace_id, created_at) index, which would walk the
		// whole period, and on the closed_at ranges.
		cols = "SELECT id, created_at, closed_at, expires_at, last_used_at FROM sessions WHERE workspace_id = ? AND +created_at < ?"
	}
	args := []any{workspaceID, to}
	switch {
	case p.EndedBefore.IsZero():
		return cols + " AND (closed_at IS NULL OR closed_at >= ?)", append(args, from)
	case p.Settled:
		lo := from
		if p.EndedFrom.After(lo) {
			lo = p.EndedFrom.UTC()
		}
		return cols + " AND closed_at >= ? AND closed_at < ?", append(args, lo, p.EndedBefore.UTC())
	}
	lo := p.EndedBefore.UTC()
	if from.After(lo) {
		lo = from
	}
	return cols + " AND closed_at IS NULL UNION ALL " + cols + " AND closed_at >= ?", append(args, workspaceID, to, lo)
}

// usec is the SQL of a stored time as integer microseconds since the epoch, exact on both databases: SQLite keeps
// times as fixed-width text (schema.TimeLayout), PostgreSQL as timestamptz.
func usec(pg bool, col string) string {
	if pg {
		return "(EXTRACT(EPOCH FROM " + col + ") * 1000000)::bigint"
	}
	return "(unixepoch(substr(" + col + ", 1, 19)) * 1000000 + CAST(substr(" + col + ", 21, 6) AS INTEGER))"
}

// SumTaskTime computes in the database what usage.TaskSeconds computes over SessionSpans — each session's time
// open in [from, to) by now, ended at its close or its idle deadline (last activity + idle, or its recorded expiry
// when later), rounded up to the whole second — and the calls journaled in the period, in one query that returns
// one row: exact integer microsecond arithmetic, no row per session leaves the database.
//
// part narrows the sessions summed: the zero Part sums all of them.
func SumTaskTime(ctx context.Context, db bun.IDB, workspaceID string, from, to, now time.Time, idle time.Duration, part Part) (TaskTotals, error) {
	pg := isPostgres(db)
	greatest, least := "MAX", "MIN"
	if pg {
		greatest, least = "GREATEST", "LEAST"
	}
	from, to, now = from.UTC(), to.UTC(), now.UTC()
	fromU, toU, nowU, idleU := from.UnixMicro(), to.UnixMicro(), now.UnixMicro(), idle.Microseconds()
	sessions, args := part.sessions(pg, workspaceID, from, to)
	q := `
WITH s AS (` + sessions + `
), r AS MATERIALIZED (
	SELECT s.created_at, s.closed_at, s.expires_at, s.last_used_at,
		(SELECT lc.created_at FROM calls AS lc WHERE lc.session_id = s.id ORDER BY lc.seq DESC LIMIT 1) AS last_call
	FROM s
), u AS (
	SELECT ` + usec(pg, "created_at") + ` AS o,
		COALESCE(` + usec(pg, "closed_at") + `, ?) AS c,
		` + usec(pg, "expires_at") + ` AS e,
		` + greatest + `(` + usec(pg, "created_at") + `, ` + usec(pg, "last_used_at") + `, COALESCE(` + usec(pg, "last_call") + `, 0)) AS a
	FROM r
), b AS (
	SELECT ` + greatest + `(o, ?) AS lo, ` + least + `(c, ` + greatest + `(e, a + ?), ?) AS hi FROM u
)
SELECT COALESCE(SUM(CASE WHEN hi > lo THEN (hi - lo + 999999) / 1000000 ELSE 0 END), 0) AS seconds,
	(SELECT COALESCE(SUM((SELECT COUNT(*) FROM calls AS k WHERE k.session_id = s.id AND k.created_at >= ? AND k.created_at < ?)), 0)
		FROM s) AS calls
FROM b`
	var out TaskTotals
	args = append(args, nowU, fromU, idleU, toU, from, to)
	err := db.NewRaw(q, args...).Scan(ctx, &out)
	if err != nil {
		return TaskTotals{}, wrap(err, "task time of workspace %q", workspaceID)
	}
	return out, nil
}

// QueryTotals are a workspace's queries in a period and the model tokens they used.
type QueryTotals struct {
	Queries int64
	Tokens  int64 // prompt and completion tokens of the model the queries ran (replay queries use none)
}

// QueriesIn sums a workspace's queries created in [from, to) from their rows.
func QueriesIn(ctx context.Context, db bun.IDB, workspaceID string, from, to time.Time) (QueryTotals, error) {
	var tot QueryTotals
	err := db.NewSelect().Model((*schema.Query)(nil)).
		ColumnExpr("count(*)").ColumnExpr("coalesce(sum(prompt_tokens + completion_tokens), 0)").
		Where("workspace_id = ? AND created_at >= ? AND created_at < ?", workspaceID, from.UTC(), to.UTC()).
		Scan(ctx, &tot.Queries, &tot.Tokens)
	if err != nil {
		return QueryTotals{}, wrap(err, "queries of workspace %q", workspaceID)
	}
	return tot, nil
}
