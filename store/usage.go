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

// SessionSpan is what billing reads of one session: when it opened, when it ended (nil while open), when it
// expires (the idle deadline, moved on by each call) and its journaled calls.
type SessionSpan struct {
	CreatedAt time.Time  `bun:"created_at"`
	ClosedAt  *time.Time `bun:"closed_at"`
	ExpiresAt time.Time  `bun:"expires_at"`
	NCalls    int64      `bun:"n_calls"`
}

// SessionSpans returns the spans of a workspace's sessions that may have been open in [from, to): opened before
// to, and not ended before from.
func SessionSpans(ctx context.Context, db bun.IDB, workspaceID string, from, to time.Time) ([]SessionSpan, error) {
	out := []SessionSpan{}
	err := db.NewSelect().Model((*schema.Session)(nil)).Column("created_at", "closed_at", "expires_at", "n_calls").
		Where("workspace_id = ? AND created_at < ?", workspaceID, to.UTC()).
		Where("(closed_at IS NULL OR closed_at >= ?) AND expires_at >= ?", from.UTC(), from.UTC()).
		Scan(ctx, &out)
	if err != nil {
		return nil, wrap(err, "session spans of workspace %q", workspaceID)
	}
	return out, nil
}

// CallsOpenedIn sums the journaled calls of a workspace's sessions opened in [from, to).
func CallsOpenedIn(ctx context.Context, db bun.IDB, workspaceID string, from, to time.Time) (sessions, calls int64, err error) {
	var row struct {
		N     int64 `bun:"n"`
		Calls int64 `bun:"calls"`
	}
	err = db.NewSelect().Model((*schema.Session)(nil)).ColumnExpr("COUNT(*) AS n, COALESCE(SUM(n_calls), 0) AS calls").
		Where("workspace_id = ? AND created_at >= ? AND created_at < ?", workspaceID, from.UTC(), to.UTC()).
		Scan(ctx, &row)
	if err != nil {
		return 0, 0, wrap(err, "calls of workspace %q", workspaceID)
	}
	return row.N, row.Calls, nil
}

// OpenSessions counts a workspace's sessions open at at: status open and not past their idle deadline.
func OpenSessions(ctx context.Context, db bun.IDB, workspaceID string, at time.Time) (int, error) {
	n, err := db.NewSelect().Model((*schema.Session)(nil)).
		Where("workspace_id = ? AND status = ? AND expires_at > ?", workspaceID, schema.SessionOpen, at.UTC()).Count(ctx)
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
		open, err := OpenSessions(ctx, tx, env.WorkspaceID, now())
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
