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

// CreateWorkspace adds a workspace with access granted.
func CreateWorkspace(ctx context.Context, db bun.IDB, name string) (*schema.Workspace, error) {
	if name == "" {
		return nil, fmt.Errorf("store: create workspace: %w: name is empty", ErrInvalid)
	}
	ws := &schema.Workspace{ID: schema.NewID(schema.PrefixWorkspace), Name: name, Access: schema.AccessGranted, CreatedAt: now(),
		Entitlements: schema.DefaultEntitlements}
	if _, err := db.NewInsert().Model(ws).Exec(ctx); err != nil {
		return nil, wrap(err, "create workspace %q", name)
	}
	return ws, nil
}

// GetWorkspace returns one workspace.
func GetWorkspace(ctx context.Context, db bun.IDB, id string) (*schema.Workspace, error) {
	ws := new(schema.Workspace)
	if err := db.NewSelect().Model(ws).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get workspace %q", id)
	}
	return ws, nil
}

// SetWorkspaceAccess sets a workspace's access: granted, pending or denied.
func SetWorkspaceAccess(ctx context.Context, db bun.IDB, id, access string) error {
	switch access {
	case schema.AccessGranted, schema.AccessPending, schema.AccessDenied:
	default:
		return fmt.Errorf("store: set access: %w: access %q is not granted|pending|denied", ErrInvalid, access)
	}
	res, err := db.NewUpdate().Model((*schema.Workspace)(nil)).Set("access = ?", access).Where("id = ?", id).Exec(ctx)
	if err != nil {
		return wrap(err, "set access of workspace %q", id)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: set access of workspace %q: %w", id, ErrNotFound)
	}
	return nil
}

func keyKind(k cred.Kind) (string, error) {
	switch k {
	case cred.KindWorkspace:
		return schema.KeyKindWorkspace, nil
	case cred.KindMCP:
		return schema.KeyKindMCP, nil
	}
	return "", fmt.Errorf("%w: key kind %q: want %q or %q", ErrInvalid, k, cred.KindWorkspace, cred.KindMCP)
}

// CreateKey mints a workspace key (cred.KindWorkspace) or an MCP token (cred.KindMCP) and stores its hash.
// The plaintext is returned once and kept nowhere.
func CreateKey(ctx context.Context, db bun.IDB, workspaceID string, kind cred.Kind, name string) (*schema.APIKey, string, error) {
	if _, err := keyKind(kind); err != nil {
		return nil, "", fmt.Errorf("store: create key: %w", err)
	}
	m, err := cred.Mint(kind)
	if err != nil {
		return nil, "", fmt.Errorf("store: create key: %w", err)
	}
	k, err := InsertKey(ctx, db, workspaceID, name, m.Plaintext)
	if err != nil {
		return nil, "", err
	}
	return k, m.Plaintext, nil
}

// DeriveKey mints an MCP token (cred.KindMCP) derived from the credential from (the key that asks for it): it lives
// in from's workspace and ends with from and with from's root (schema.APIKey.Root), however it is revoked. The
// plaintext is returned once and kept nowhere.
func DeriveKey(ctx context.Context, db bun.IDB, from *schema.APIKey, kind cred.Kind, name string) (*schema.APIKey, string, error) {
	if kind != cred.KindMCP {
		return nil, "", fmt.Errorf("store: derive key: %w: only MCP tokens derive from a key, not %q", ErrInvalid, kind)
	}
	m, err := cred.Mint(kind)
	if err != nil {
		return nil, "", fmt.Errorf("store: derive key: %w", err)
	}
	key := &schema.APIKey{
		ID: schema.NewID(schema.PrefixKey), WorkspaceID: from.WorkspaceID, Kind: schema.KeyKindMCP,
		Hash: m.Hash, Prefix: m.Display, Name: name, CreatedAt: now(), ParentKeyID: from.ID, RootKeyID: from.Root(),
	}
	if _, err := db.NewInsert().Model(key).Exec(ctx); err != nil {
		return nil, "", wrap(err, "derive key from %q", from.ID)
	}
	return key, m.Plaintext, nil
}

// InsertKey stores a key whose plaintext the caller chose (e.g. DOPPEL_BOOTSTRAP_KEY).
// The plaintext must be a well-formed mk_live_ or mcp_at_ credential.
func InsertKey(ctx context.Context, db bun.IDB, workspaceID, name, plaintext string) (*schema.APIKey, error) {
	k, err := cred.Parse(plaintext)
	if err != nil {
		return nil, fmt.Errorf("store: insert key: %w: %w", ErrInvalid, err)
	}
	kind, err := keyKind(k)
	if err != nil {
		return nil, fmt.Errorf("store: insert key: %w", err)
	}
	key := &schema.APIKey{
		ID: schema.NewID(schema.PrefixKey), WorkspaceID: workspaceID, Kind: kind,
		Hash: cred.Hash(plaintext), Prefix: cred.Display(plaintext), Name: name, CreatedAt: now(),
	}
	if _, err := db.NewInsert().Model(key).Exec(ctx); err != nil {
		return nil, wrap(err, "insert key into workspace %q", workspaceID)
	}
	return key, nil
}

// ListKeys returns a workspace's keys and MCP tokens, revoked ones included, newest first.
func ListKeys(ctx context.Context, db bun.IDB, workspaceID string) ([]schema.APIKey, error) {
	var keys []schema.APIKey
	err := db.NewSelect().Model(&keys).Where("workspace_id = ?", workspaceID).
		Order("created_at DESC", "id DESC").Scan(ctx)
	if err != nil {
		return nil, wrap(err, "list keys of workspace %q", workspaceID)
	}
	return keys, nil
}

// GetKey returns one key of a workspace; another workspace's key is ErrNotFound.
func GetKey(ctx context.Context, db bun.IDB, workspaceID, id string) (*schema.APIKey, error) {
	k := new(schema.APIKey)
	if err := db.NewSelect().Model(k).Where("id = ? AND workspace_id = ?", id, workspaceID).Scan(ctx); err != nil {
		return nil, wrap(err, "get key %q", id)
	}
	return k, nil
}

// RevokeKey revokes a workspace's key and, in the same transaction, every key derived from it however many hops
// away (RevokeDerived). Revoking a revoked key changes nothing but revokes what still derives from it, and
// returns it.
func RevokeKey(ctx context.Context, db bun.IDB, workspaceID, id string) (*schema.APIKey, error) {
	at := now()
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		if _, err := GetKey(ctx, tx, workspaceID, id); err != nil {
			return err
		}
		_, err := tx.NewUpdate().Model((*schema.APIKey)(nil)).Set("revoked_at = ?", at).
			Where("id = ? AND workspace_id = ? AND revoked_at IS NULL", id, workspaceID).Exec(ctx)
		if err != nil {
			return wrap(err, "revoke key %q", id)
		}
		_, err = RevokeDerived(ctx, tx, []string{id}, at)
		return err
	})
	if err != nil {
		return nil, err
	}
	return GetKey(ctx, db, workspaceID, id)
}

// RevokeDerived revokes, as of at, every live key derived from one of ids (whose parent or root it names), then
// what derives from those, until nothing does; it answers how many it revoked. Use is checked too (ResolveKey and
// SessionByToken look at a credential's parent and root), so a key derived while this runs ends all the same.
func RevokeDerived(ctx context.Context, db bun.IDB, ids []string, at time.Time) (int, error) {
	n := 0
	for depth := 0; len(ids) > 0; depth++ {
		if depth > maxDerivation {
			return n, fmt.Errorf("store: revoke derived keys: chains deeper than %d", maxDerivation)
		}
		var next []string
		err := db.NewUpdate().Model((*schema.APIKey)(nil)).Set("revoked_at = ?", at).
			Where("revoked_at IS NULL").
			WhereGroup(" AND ", func(q *bun.UpdateQuery) *bun.UpdateQuery {
				return q.Where("parent_key_id IN (?)", bun.In(ids)).WhereOr("root_key_id IN (?)", bun.In(ids))
			}).
			Returning("id").Scan(ctx, &next)
		if err != nil {
			return n, wrap(err, "revoke keys derived from %v", ids)
		}
		r, err := revokeRefreshDerived(ctx, db, ids, at)
		if err != nil {
			return n, err
		}
		n += len(next) + r
		ids = next
	}
	return n, nil
}

// maxDerivation bounds how many hops a chain of derived keys has (a key, an OAuth token on its consent, a token
// refreshed from that, …): a loop in the records cannot keep RevokeDerived going.
const maxDerivation = 16

// lastUsedEvery bounds how often a key's last_used_at is written.
const lastUsedEvery = time.Minute

// ResolveKey finds the live key a bearer credential names and its workspace.
// Unknown, malformed, session-kind, revoked and expired credentials are all ErrNotFound.
func ResolveKey(ctx context.Context, db bun.IDB, token string) (*schema.APIKey, *schema.Workspace, error) {
	k, err := cred.Parse(token)
	if err != nil || (k != cred.KindWorkspace && k != cred.KindMCP) {
		return nil, nil, fmt.Errorf("store: resolve key: %w", ErrNotFound)
	}
	key := new(schema.APIKey)
	if err := db.NewSelect().Model(key).Where("hash = ?", cred.Hash(token)).Scan(ctx); err != nil {
		return nil, nil, wrap(err, "resolve key")
	}
	if !cred.Matches(token, key.Hash) || key.RevokedAt != nil {
		return nil, nil, fmt.Errorf("store: resolve key: %w", ErrNotFound)
	}
	if key.ExpiresAt != nil && !now().Before(*key.ExpiresAt) {
		return nil, nil, fmt.Errorf("store: resolve key: %w: expired", ErrNotFound)
	}
	if key.ParentKeyID != "" || key.RootKeyID != "" {
		// A derived key ends with the key it derives from and with its chain's root (RevokeDerived revokes the
		// chain between; this check holds for what was derived while that ran).
		n, err := db.NewSelect().Model((*schema.APIKey)(nil)).
			Where("id IN (?) AND revoked_at IS NOT NULL", bun.In([]string{key.ParentKeyID, key.RootKeyID})).Count(ctx)
		if err != nil {
			return nil, nil, wrap(err, "resolve key")
		}
		if n > 0 {
			return nil, nil, fmt.Errorf("store: resolve key: %w: the key it derives from was revoked", ErrNotFound)
		}
	}
	ws, err := GetWorkspace(ctx, db, key.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	if t := now(); key.LastUsedAt == nil || t.Sub(*key.LastUsedAt) >= lastUsedEvery {
		if _, err := db.NewUpdate().Model((*schema.APIKey)(nil)).Set("last_used_at = ?", t).Where("id = ?", key.ID).Exec(ctx); err != nil {
			return nil, nil, wrap(err, "touch key %q", key.ID)
		}
		key.LastUsedAt = &t
	}
	return key, ws, nil
}

// BootstrapOptions names the workspace and key Bootstrap ensures.
type BootstrapOptions struct {
	// Key is the workspace key's plaintext (mk_live_…), e.g. from DOPPEL_BOOTSTRAP_KEY.
	Key string
	// WorkspaceName names the workspace created when the key is new (default "default").
	WorkspaceName string
	// KeyName labels the key (default "bootstrap").
	KeyName string
}

// Bootstrap ensures a workspace holding the given key exists and returns both. It is idempotent:
// a key already stored returns its workspace. A revoked key is ErrConflict (it was revoked on purpose).
// When the key is new it joins the oldest workspace named WorkspaceName, created if absent.
func Bootstrap(ctx context.Context, db bun.IDB, opts BootstrapOptions) (*schema.Workspace, *schema.APIKey, error) {
	if k, err := cred.Parse(opts.Key); err != nil || k != cred.KindWorkspace {
		if err == nil {
			err = fmt.Errorf("want a workspace key (%s…), got a %s credential", cred.PrefixWorkspace, k)
		}
		return nil, nil, fmt.Errorf("store: bootstrap: %w: %w", ErrInvalid, err)
	}
	if opts.WorkspaceName == "" {
		opts.WorkspaceName = "default"
	}
	if opts.KeyName == "" {
		opts.KeyName = "bootstrap"
	}
	var ws *schema.Workspace
	var key *schema.APIKey
	attempt := func() error {
		return inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
			existing := new(schema.APIKey)
			err := tx.NewSelect().Model(existing).Where("hash = ?", cred.Hash(opts.Key)).Scan(ctx)
			switch {
			case err == nil:
				if existing.RevokedAt != nil {
					return fmt.Errorf("store: bootstrap: %w: the bootstrap key %s was revoked", ErrConflict, existing.Prefix)
				}
				key = existing
				ws, err = GetWorkspace(ctx, tx, existing.WorkspaceID)
				return err
			case !errors.Is(classify(err), ErrNotFound):
				return wrap(err, "bootstrap: look up key")
			}
			ws = new(schema.Workspace)
			err = tx.NewSelect().Model(ws).Where("name = ?", opts.WorkspaceName).Order("created_at ASC", "id ASC").Limit(1).Scan(ctx)
			if errors.Is(classify(err), ErrNotFound) {
				ws, err = CreateWorkspace(ctx, tx, opts.WorkspaceName)
			}
			if err != nil {
				return wrap(err, "bootstrap: workspace")
			}
			key, err = InsertKey(ctx, tx, ws.ID, opts.KeyName, opts.Key)
			return err
		})
	}
	err := attempt()
	if errors.Is(err, ErrConflict) && key == nil {
		// Another process stored the same key between our look-up and insert: read theirs.
		err = attempt()
	}
	if err != nil {
		return nil, nil, err
	}
	return ws, key, nil
}
