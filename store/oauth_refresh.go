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

// ErrRefreshReused means a refresh token already rotated was presented again: it may have been stolen, so its
// family (every token of the same authorization) is revoked.
var ErrRefreshReused = errors.New("refresh token already used")

// Grant is what the token endpoint answers: an access token and the refresh token that renews it, shown once.
type Grant struct {
	Access       *schema.APIKey
	AccessToken  string
	Refresh      *schema.OAuthRefreshToken
	RefreshToken string
}

// GrantTTL bounds a grant's tokens.
type GrantTTL struct {
	Access, Refresh time.Duration
}

// IssueOAuthGrant exchanges an authorization code for an access token (mcp_at_…) bound to resource ("" for every
// MCP address) and a refresh token (mcp_rt_…) of a new family, in one transaction that marks the code used. A code
// already used is ErrCodeUsed, and what it issued is revoked.
func IssueOAuthGrant(ctx context.Context, db bun.IDB, c *schema.OAuthCode, resource string, ttl GrantTTL) (*Grant, error) {
	if ttl.Access <= 0 || ttl.Refresh <= 0 {
		return nil, fmt.Errorf("store: issue oauth grant: %w: ttl must be positive", ErrInvalid)
	}
	var g *Grant
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		// The tokens derive from the key that consented: they end with that key and with its chain's root.
		granting, err := GetKey(ctx, tx, c.WorkspaceID, c.KeyID)
		if err != nil {
			return err
		}
		res, err := tx.NewUpdate().Model((*schema.OAuthCode)(nil)).Set("used_at = ?", now()).
			Where("id = ? AND used_at IS NULL", c.ID).Exec(ctx)
		if err != nil {
			return wrap(err, "use oauth code %q", c.ID)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrCodeUsed
		}
		g, err = insertGrant(ctx, tx, grantOf{workspace: c.WorkspaceID, client: c.ClientID, family: c.ID,
			parent: granting.ID, root: granting.Root(), resource: resource, scope: c.Scope}, ttl)
		return err
	})
	if errors.Is(err, ErrCodeUsed) {
		if _, rerr := RevokeCodeTokens(ctx, db, c.ID); rerr != nil {
			return nil, rerr
		}
		return nil, fmt.Errorf("store: issue oauth grant: %w", ErrCodeUsed)
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// grantOf is what a grant's tokens carry: whose they are, their family and lineage, and their resource.
type grantOf struct {
	workspace, client, family, parent, root, resource, scope string
}

func insertGrant(ctx context.Context, tx bun.Tx, o grantOf, ttl GrantTTL) (*Grant, error) {
	m, err := cred.Mint(cred.KindMCP)
	if err != nil {
		return nil, fmt.Errorf("store: issue oauth grant: %w", err)
	}
	rt, rhash, err := cred.Secret(cred.PrefixRefresh)
	if err != nil {
		return nil, fmt.Errorf("store: issue oauth grant: %w", err)
	}
	at := now()
	exp := at.Add(ttl.Access)
	key := &schema.APIKey{
		ID: schema.NewID(schema.PrefixKey), WorkspaceID: o.workspace, Kind: schema.KeyKindMCP, Hash: m.Hash,
		Prefix: m.Display, Name: "oauth " + o.client, CreatedAt: at, ExpiresAt: &exp,
		OAuthClientID: o.client, OAuthCodeID: o.family, ParentKeyID: o.parent, RootKeyID: o.root, Resource: o.resource,
	}
	refresh := &schema.OAuthRefreshToken{
		ID: schema.NewID(schema.PrefixRefresh), Hash: rhash, WorkspaceID: o.workspace, ClientID: o.client,
		Family: o.family, ParentKeyID: o.parent, RootKeyID: o.root, Resource: o.resource, Scope: o.scope,
		CreatedAt: at, ExpiresAt: at.Add(ttl.Refresh),
	}
	if _, err := tx.NewInsert().Model(key).Exec(ctx); err != nil {
		return nil, wrap(err, "insert oauth token")
	}
	if _, err := tx.NewInsert().Model(refresh).Exec(ctx); err != nil {
		return nil, wrap(err, "insert oauth refresh token")
	}
	return &Grant{Access: key, AccessToken: m.Plaintext, Refresh: refresh, RefreshToken: rt}, nil
}

// OAuthRefreshByValue finds a live refresh token by its plaintext: unknown, revoked and expired ones, and one whose
// consenting key or root was revoked, are ErrNotFound. A rotated one is returned (RotateOAuthRefresh refuses it).
func OAuthRefreshByValue(ctx context.Context, db bun.IDB, token string) (*schema.OAuthRefreshToken, error) {
	rt := new(schema.OAuthRefreshToken)
	if err := db.NewSelect().Model(rt).Where("hash = ?", cred.Hash(token)).Scan(ctx); err != nil {
		return nil, wrap(err, "oauth refresh token")
	}
	if !cred.Matches(token, rt.Hash) || rt.RevokedAt != nil || !now().Before(rt.ExpiresAt) {
		return nil, fmt.Errorf("store: oauth refresh token: %w", ErrNotFound)
	}
	n, err := db.NewSelect().Model((*schema.APIKey)(nil)).
		Where("id IN (?) AND revoked_at IS NOT NULL", bun.In([]string{rt.ParentKeyID, rt.RootKeyID})).Count(ctx)
	if err != nil {
		return nil, wrap(err, "oauth refresh token")
	}
	if n > 0 {
		return nil, fmt.Errorf("store: oauth refresh token: %w: the key it derives from was revoked", ErrNotFound)
	}
	return rt, nil
}

// RotateOAuthRefresh uses a refresh token: it is marked rotated, and a new access token (bound to resource) and
// refresh token of the same family are issued, in one transaction. A token already rotated is ErrRefreshReused,
// and its family is revoked.
func RotateOAuthRefresh(ctx context.Context, db bun.IDB, rt *schema.OAuthRefreshToken, resource string, ttl GrantTTL) (*Grant, error) {
	var g *Grant
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		res, err := tx.NewUpdate().Model((*schema.OAuthRefreshToken)(nil)).Set("rotated_at = ?", now()).
			Where("id = ? AND rotated_at IS NULL AND revoked_at IS NULL", rt.ID).Exec(ctx)
		if err != nil {
			return wrap(err, "rotate refresh token %q", rt.ID)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrRefreshReused
		}
		g, err = insertGrant(ctx, tx, grantOf{workspace: rt.WorkspaceID, client: rt.ClientID, family: rt.Family,
			parent: rt.ParentKeyID, root: rt.RootKeyID, resource: resource, scope: rt.Scope}, ttl)
		return err
	})
	if errors.Is(err, ErrRefreshReused) {
		if _, rerr := RevokeCodeTokens(ctx, db, rt.Family); rerr != nil {
			return nil, rerr
		}
		return nil, fmt.Errorf("store: rotate refresh token: %w", ErrRefreshReused)
	}
	return g, err
}

// RevokeOAuthRefresh revokes the family of a refresh token given by its plaintext, when it was issued to clientID
// (RFC 7009 §2.1: revoking a refresh token ends the access tokens of the same authorization). It answers whether
// a token was found.
func RevokeOAuthRefresh(ctx context.Context, db bun.IDB, token, clientID string) (bool, error) {
	if clientID == "" {
		return false, nil
	}
	rt := new(schema.OAuthRefreshToken)
	err := db.NewSelect().Model(rt).Where("hash = ? AND client_id = ?", cred.Hash(token), clientID).Scan(ctx)
	if err != nil {
		if errors.Is(wrap(err, ""), ErrNotFound) {
			return false, nil
		}
		return false, wrap(err, "revoke refresh token")
	}
	_, err = RevokeCodeTokens(ctx, db, rt.Family)
	return true, err
}

// revokeRefreshDerived revokes the live refresh tokens derived from one of ids (their consenting key or root).
func revokeRefreshDerived(ctx context.Context, db bun.IDB, ids []string, at time.Time) (int, error) {
	res, err := db.NewUpdate().Model((*schema.OAuthRefreshToken)(nil)).Set("revoked_at = ?", at).
		Where("revoked_at IS NULL").
		WhereGroup(" AND ", func(q *bun.UpdateQuery) *bun.UpdateQuery {
			return q.Where("parent_key_id IN (?)", bun.In(ids)).WhereOr("root_key_id IN (?)", bun.In(ids))
		}).Exec(ctx)
	if err != nil {
		return 0, wrap(err, "revoke refresh tokens derived from %v", ids)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PutOAuthClient records a client known by its Client ID Metadata Document (its id is the document's https URL):
// created on first use, its name and redirect URIs replaced by each later fetch of the document.
func PutOAuthClient(ctx context.Context, db bun.IDB, id, name string, redirectURIs []string) (*schema.OAuthClient, error) {
	if len(redirectURIs) == 0 {
		return nil, fmt.Errorf("store: put oauth client: %w: no redirect URI", ErrInvalid)
	}
	c := &schema.OAuthClient{ID: id, Name: name, RedirectURIs: redirectURIs, CreatedAt: now()}
	_, err := db.NewInsert().Model(c).On("CONFLICT (id) DO UPDATE").
		Set("name = EXCLUDED.name").Set("redirect_uris = EXCLUDED.redirect_uris").Exec(ctx)
	if err != nil {
		return nil, wrap(err, "put oauth client %q", id)
	}
	return c, nil
}
