package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
)

// DefaultSessionIdle is how long an unused session stays open (spec §8: one hour).
const DefaultSessionIdle = time.Hour

// CreateSession opens a session row and mints its ms_ token, returned once; only its hash is stored.
// The caller sets EnvID, OpenedByKeyID and the seeding fields; ID, WorkspaceID (from the
// environment), TokenHash, Status (open) and the times are filled in. ExpiresAt defaults to
// DefaultSessionIdle from now.
func CreateSession(ctx context.Context, db bun.IDB, s *schema.Session) (string, error) {
	env, err := GetEnvByID(ctx, db, s.EnvID)
	if err != nil {
		return "", fmt.Errorf("store: create session: %w", err)
	}
	if s.WorkspaceID != "" && s.WorkspaceID != env.WorkspaceID {
		return "", fmt.Errorf("store: create session: env %q: %w", s.EnvID, ErrNotFound)
	}
	m, err := cred.Mint(cred.KindSession)
	if err != nil {
		return "", fmt.Errorf("store: create session: %w", err)
	}
	s.WorkspaceID = env.WorkspaceID
	if s.RootKeyID == "" && s.OpenedByKeyID != "" {
		// The session's token ends with the root of the credential that opened it, too.
		if err := db.NewSelect().Model((*schema.APIKey)(nil)).Column("root_key_id").
			Where("id = ?", s.OpenedByKeyID).Scan(ctx, &s.RootKeyID); err != nil && !errors.Is(classify(err), ErrNotFound) {
			return "", wrap(err, "create session: opening key %q", s.OpenedByKeyID)
		}
	}
	if s.ID == "" {
		s.ID = schema.NewID(schema.PrefixSession)
	}
	s.TokenHash = m.Hash
	s.Status = schema.SessionOpen
	t := now()
	s.CreatedAt, s.LastUsedAt = t, t
	if s.ExpiresAt.IsZero() {
		s.ExpiresAt = t.Add(DefaultSessionIdle)
	}
	s.ClosedAt = nil
	if _, err := db.NewInsert().Model(s).Exec(ctx); err != nil {
		return "", wrap(err, "create session on env %q", s.EnvID)
	}
	return m.Plaintext, nil
}

// GetSession returns a workspace's session; another workspace's session is ErrNotFound.
func GetSession(ctx context.Context, db bun.IDB, workspaceID, id string) (*schema.Session, error) {
	s := new(schema.Session)
	if err := db.NewSelect().Model(s).Where("id = ? AND workspace_id = ?", id, workspaceID).Scan(ctx); err != nil {
		return nil, wrap(err, "get session %q", id)
	}
	return s, nil
}

// GetSessionByID returns a session whatever its workspace (for workers, not for requests).
func GetSessionByID(ctx context.Context, db bun.IDB, id string) (*schema.Session, error) {
	s := new(schema.Session)
	if err := db.NewSelect().Model(s).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get session %q", id)
	}
	return s, nil
}

// SessionByToken returns the session an ms_ token belongs to, whatever its status
// (callers decide what a closed or expired session answers). Unknown or malformed tokens are ErrNotFound, and so
// is the token of a session whose opening credential, or that credential's root, was revoked, and that of an open
// fork made with its parent's token whose parent has ended (EndBoundForks ends it; this check holds until then).
func SessionByToken(ctx context.Context, db bun.IDB, token string) (*schema.Session, error) {
	if k, err := cred.Parse(token); err != nil || k != cred.KindSession {
		return nil, fmt.Errorf("store: session by token: %w", ErrNotFound)
	}
	s := new(schema.Session)
	if err := db.NewSelect().Model(s).Where("token_hash = ?", cred.Hash(token)).
		Where("NOT EXISTS (SELECT 1 FROM api_keys AS k WHERE k.id = session.opened_by_key_id AND k.revoked_at IS NOT NULL)").
		Scan(ctx); err != nil {
		return nil, wrap(err, "session by token")
	}
	if !cred.Matches(token, s.TokenHash) {
		return nil, fmt.Errorf("store: session by token: %w", ErrNotFound)
	}
	// Derived sessions only (the common one, opened by a root key and not bound to a parent, takes one read).
	if s.RootKeyID != "" {
		n, err := db.NewSelect().Model((*schema.APIKey)(nil)).Where("id = ? AND revoked_at IS NOT NULL", s.RootKeyID).Count(ctx)
		if err != nil {
			return nil, wrap(err, "session by token: root key")
		}
		if n > 0 {
			return nil, fmt.Errorf("store: session by token: %w: the key it derives from was revoked", ErrNotFound)
		}
	}
	if s.EndsWithParent && s.Status == schema.SessionOpen {
		n, err := db.NewSelect().Model((*schema.Session)(nil)).Where("id = ? AND status = ?", s.ForkedFrom, schema.SessionOpen).Count(ctx)
		if err != nil {
			return nil, wrap(err, "session by token: parent")
		}
		if n == 0 {
			return nil, fmt.Errorf("store: session by token: %w: the session it was forked from has ended", ErrNotFound)
		}
	}
	return s, nil
}

// ListSessions returns an environment's sessions, newest first; status "" means any; limit ≤ 0 means all.
func ListSessions(ctx context.Context, db bun.IDB, envID, status string, limit int) ([]schema.Session, error) {
	out := []schema.Session{}
	q := db.NewSelect().Model(&out).Where("env_id = ?", envID)
	if status != "" {
		q = q.Where("status = ?", status)
	}
	q = q.Order("created_at DESC", "id DESC")
	if limit > 0 {
		q = q.Limit(int64(limit))
	}
	if err := q.Scan(ctx); err != nil {
		return nil, wrap(err, "list sessions of env %q", envID)
	}
	return out, nil
}

// UpdateSession writes the named columns of s (all mutable columns when none are named).
func UpdateSession(ctx context.Context, db bun.IDB, s *schema.Session, columns ...string) error {
	q := db.NewUpdate().Model(s).WherePK()
	if len(columns) > 0 {
		q = q.Column(columns...)
	} else {
		q = q.ExcludeColumn("id", "env_id", "workspace_id", "token_hash", "opened_by_key_id", "created_at")
	}
	res, err := q.Exec(ctx)
	if err != nil {
		return wrap(err, "update session %q", s.ID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: update session %q: %w", s.ID, ErrNotFound)
	}
	return nil
}

// EndSession moves an open session to status (closed, expired or broken), which revokes its token.
// It reports whether the session was open; ending an ended session changes nothing.
func EndSession(ctx context.Context, db bun.IDB, id, status string) (bool, error) {
	switch status {
	case schema.SessionClosed, schema.SessionExpired, schema.SessionBroken:
	default:
		return false, fmt.Errorf("store: end session: %w: status %q is not closed|expired|broken", ErrInvalid, status)
	}
	res, err := db.NewUpdate().Model((*schema.Session)(nil)).
		Set("status = ?", status).Set("closed_at = ?", now()).
		Where("id = ? AND status = ?", id, schema.SessionOpen).Exec(ctx)
	if err != nil {
		return false, wrap(err, "end session %q", id)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// BoundForks returns the open forks of parentID made with its token (EndsWithParent), which end when it ends.
func BoundForks(ctx context.Context, db bun.IDB, parentID string) ([]schema.Session, error) {
	var out []schema.Session
	if err := db.NewSelect().Model(&out).Where("forked_from = ? AND ends_with_parent AND status = ?", parentID, schema.SessionOpen).
		Order("id").Scan(ctx); err != nil {
		return nil, wrap(err, "forks of session %q", parentID)
	}
	return out, nil
}

// OrphanedForks returns open forks made with a token whose parent is no longer open (their end was cut short, say by
// a crash between the parent's end and theirs), at most limit.
func OrphanedForks(ctx context.Context, db bun.IDB, limit int) ([]schema.Session, error) {
	var out []schema.Session
	if err := db.NewSelect().Model(&out).Where("session.ends_with_parent AND session.status = ?", schema.SessionOpen).
		Where("NOT EXISTS (SELECT 1 FROM sessions AS p WHERE p.id = session.forked_from AND p.status = ?)", schema.SessionOpen).
		Order("session.id").Limit(int64(limit)).Scan(ctx); err != nil {
		return nil, wrap(err, "orphaned forks")
	}
	return out, nil
}

// ExpireIdleSessions marks every open session whose expires_at is before at as expired and returns their ids.
func ExpireIdleSessions(ctx context.Context, db bun.IDB, at time.Time) ([]string, error) {
	var ids []string
	err := db.NewUpdate().Model((*schema.Session)(nil)).
		Set("status = ?", schema.SessionExpired).Set("closed_at = ?", at.UTC()).
		Where("status = ? AND expires_at < ?", schema.SessionOpen, at.UTC()).
		Returning("id").Scan(ctx, &ids)
	if err != nil {
		return nil, wrap(err, "expire idle sessions")
	}
	return ids, nil
}
