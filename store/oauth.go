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

// ErrCodeUsed means an authorization code was already exchanged: OAuth 2.1 refuses it, and the tokens issued from
// it are revoked.
var ErrCodeUsed = errors.New("authorization code already used")

// CreateOAuthClient registers a public OAuth client with its redirect URIs.
func CreateOAuthClient(ctx context.Context, db bun.IDB, name string, redirectURIs []string) (*schema.OAuthClient, error) {
	if len(redirectURIs) == 0 {
		return nil, fmt.Errorf("store: create oauth client: %w: no redirect URI", ErrInvalid)
	}
	c := &schema.OAuthClient{ID: schema.NewID(schema.PrefixOAuthClient), Name: name, RedirectURIs: redirectURIs, CreatedAt: now()}
	if _, err := db.NewInsert().Model(c).Exec(ctx); err != nil {
		return nil, wrap(err, "create oauth client")
	}
	return c, nil
}

// GetOAuthClient returns a registered client.
func GetOAuthClient(ctx context.Context, db bun.IDB, id string) (*schema.OAuthClient, error) {
	c := new(schema.OAuthClient)
	if err := db.NewSelect().Model(c).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get oauth client %q", id)
	}
	return c, nil
}

// CreateOAuthCode stores an authorization code (c with its client, workspace, consenting key, redirect URI,
// challenge and expiry set) and returns the code's plaintext, shown once: only its hash is kept.
func CreateOAuthCode(ctx context.Context, db bun.IDB, c *schema.OAuthCode) (string, error) {
	plain, hash, err := cred.Secret(cred.PrefixOAuthCode)
	if err != nil {
		return "", fmt.Errorf("store: create oauth code: %w", err)
	}
	c.ID, c.Hash, c.CreatedAt, c.UsedAt = schema.NewID(schema.PrefixOAuthCode), hash, now(), nil
	if _, err := db.NewInsert().Model(c).Exec(ctx); err != nil {
		return "", wrap(err, "create oauth code")
	}
	return plain, nil
}

// OAuthCodeByValue finds an authorization code by its plaintext, used or not; an unknown code is ErrNotFound.
func OAuthCodeByValue(ctx context.Context, db bun.IDB, code string) (*schema.OAuthCode, error) {
	c := new(schema.OAuthCode)
	if err := db.NewSelect().Model(c).Where("hash = ?", cred.Hash(code)).Scan(ctx); err != nil {
		return nil, wrap(err, "oauth code")
	}
	if !cred.Matches(code, c.Hash) {
		return nil, fmt.Errorf("store: oauth code: %w", ErrNotFound)
	}
	return c, nil
}

// RevokeCodeTokens revokes every token issued from an authorization code (OAuth 2.1 §4.1.3: a code presented twice
// may mean it was stolen). It answers how many it revoked.
func RevokeCodeTokens(ctx context.Context, db bun.IDB, codeID string) (int64, error) {
	at := now()
	var n int64
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		var ids []string
		err := tx.NewUpdate().Model((*schema.APIKey)(nil)).Set("revoked_at = ?", at).
			Where("oauth_code_id = ? AND revoked_at IS NULL", codeID).Returning("id").Scan(ctx, &ids)
		if err != nil {
			return wrap(err, "revoke tokens of code %q", codeID)
		}
		d, err := RevokeDerived(ctx, tx, ids, at)
		n = int64(len(ids) + d)
		if err != nil {
			return err
		}
		// The family's refresh tokens (a reused code or refresh token ends the whole authorization).
		res, err := tx.NewUpdate().Model((*schema.OAuthRefreshToken)(nil)).Set("revoked_at = ?", at).
			Where("family = ? AND revoked_at IS NULL", codeID).Exec(ctx)
		if err != nil {
			return wrap(err, "revoke refresh tokens of code %q", codeID)
		}
		r, _ := res.RowsAffected()
		n += r
		return nil
	})
	return n, err
}

// IssueOAuthToken exchanges an authorization code for an MCP access token (mcp_at_…) of the code's workspace,
// living ttl and bound to the code's resource (IssueOAuthGrant, whose refresh token it drops). The plaintext is
// returned once.
func IssueOAuthToken(ctx context.Context, db bun.IDB, c *schema.OAuthCode, ttl time.Duration) (*schema.APIKey, string, error) {
	g, err := IssueOAuthGrant(ctx, db, c, c.Resource, GrantTTL{Access: ttl, Refresh: ttl})
	if err != nil {
		return nil, "", err
	}
	return g.Access, g.AccessToken, nil
}

// RevokeOAuthToken revokes an OAuth-issued MCP token given by its plaintext, when it was issued to clientID (RFC
// 7009). It answers whether a live token was revoked; unknown tokens, another client's and keys minted directly are
// left alone and answer false.
func RevokeOAuthToken(ctx context.Context, db bun.IDB, token, clientID string) (bool, error) {
	if cred.KindOf(token) != cred.KindMCP || clientID == "" {
		return false, nil
	}
	at := now()
	var ids []string
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		err := tx.NewUpdate().Model((*schema.APIKey)(nil)).Set("revoked_at = ?", at).
			Where("hash = ? AND kind = ? AND oauth_client_id = ? AND revoked_at IS NULL", cred.Hash(token), schema.KeyKindMCP, clientID).
			Returning("id").Scan(ctx, &ids)
		if err != nil {
			return wrap(err, "revoke oauth token")
		}
		_, err = RevokeDerived(ctx, tx, ids, at)
		return err
	})
	return len(ids) > 0, err
}
