package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
)

// CreateSessions opens a group of session rows of one environment, opened by one key, in one statement of db (the
// caller's transaction, or one of its own): all of them or none. Each gets its own ms_ token, answered in order;
// the fields are filled in as CreateSession fills them. With maxOpen > 0 the group is refused
// (*OpenLimitError, nothing written) when it would take the workspace past maxOpen open sessions.
func CreateSessions(ctx context.Context, db bun.IDB, ss []*schema.Session, maxOpen int) ([]string, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	var tokens []string
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		var err error
		tokens, err = createSessions(ctx, tx, ss, maxOpen)
		return err
	})
	if err != nil {
		return nil, err
	}
	return tokens, nil
}

func createSessions(ctx context.Context, tx bun.Tx, ss []*schema.Session, maxOpen int) ([]string, error) {
	first := ss[0]
	env, err := GetEnvByID(ctx, tx, first.EnvID)
	if err != nil {
		return nil, fmt.Errorf("store: create sessions: %w", err)
	}
	if maxOpen > 0 {
		if isPostgres(tx) {
			if _, err := tx.NewSelect().Model((*schema.Workspace)(nil)).Column("id").Where("id = ?", env.WorkspaceID).
				For("UPDATE").Exec(ctx); err != nil {
				return nil, wrap(err, "lock workspace %q", env.WorkspaceID)
			}
		}
		open, err := OpenSessions(ctx, tx, env.WorkspaceID)
		if err != nil {
			return nil, err
		}
		if open+len(ss) > maxOpen {
			return nil, &OpenLimitError{Open: open, Limit: maxOpen}
		}
	}
	// The opening key's root, read once for the keys the group names.
	roots := map[string]string{}
	t := now()
	tokens := make([]string, len(ss))
	for i, s := range ss {
		if s.EnvID != first.EnvID {
			return nil, fmt.Errorf("store: create sessions: a group is of one environment (%q, then %q)", first.EnvID, s.EnvID)
		}
		if s.WorkspaceID != "" && s.WorkspaceID != env.WorkspaceID {
			return nil, fmt.Errorf("store: create sessions: env %q: %w", s.EnvID, ErrNotFound)
		}
		s.WorkspaceID = env.WorkspaceID
		if s.RootKeyID == "" && s.OpenedByKeyID != "" {
			root, ok := roots[s.OpenedByKeyID]
			if !ok {
				if err := tx.NewSelect().Model((*schema.APIKey)(nil)).Column("root_key_id").
					Where("id = ?", s.OpenedByKeyID).Scan(ctx, &root); err != nil && !errors.Is(classify(err), ErrNotFound) {
					return nil, wrap(err, "create sessions: opening key %q", s.OpenedByKeyID)
				}
				roots[s.OpenedByKeyID] = root
			}
			s.RootKeyID = root
		}
		m, err := cred.Mint(cred.KindSession)
		if err != nil {
			return nil, fmt.Errorf("store: create sessions: %w", err)
		}
		if s.ID == "" {
			s.ID = schema.NewID(schema.PrefixSession)
		}
		s.TokenHash = m.Hash
		s.Status = schema.SessionOpen
		s.CreatedAt, s.LastUsedAt = t, t
		if s.ExpiresAt.IsZero() {
			s.ExpiresAt = t.Add(DefaultSessionIdle)
		}
		s.ClosedAt = nil
		tokens[i] = m.Plaintext
	}
	if _, err := tx.NewInsert().Model(&ss).Exec(ctx); err != nil {
		return nil, wrap(err, "create %d sessions on env %q", len(ss), first.EnvID)
	}
	return tokens, nil
}
