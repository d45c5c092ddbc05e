package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// An authorization code is exchanged once for an expiring, revocable mcp_at_ token stored hashed; a second exchange
// is refused and revokes the first token.
func TestOAuthCodesAndTokens(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		consent, _, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "ci")
		if err != nil {
			t.Fatal(err)
		}
		client, err := store.CreateOAuthClient(ctx, db, "claude", []string{"http://127.0.0.1:7777/cb"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := store.GetOAuthClient(ctx, db, client.ID)
		if err != nil || len(got.RedirectURIs) != 1 || got.RedirectURIs[0] != "http://127.0.0.1:7777/cb" {
			t.Fatalf("client = %+v, %v", got, err)
		}
		if _, err := store.GetOAuthClient(ctx, db, "oc_nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown client: %v", err)
		}
		newCode := func() (*schema.OAuthCode, string) {
			c := &schema.OAuthCode{ClientID: client.ID, WorkspaceID: ws.ID, KeyID: consent.ID, RedirectURI: client.RedirectURIs[0],
				Challenge: "abc", ExpiresAt: schema.Now().Add(time.Minute)}
			plain, err := store.CreateOAuthCode(ctx, db, c)
			if err != nil {
				t.Fatal(err)
			}
			return c, plain
		}
		code, plain := newCode()
		found, err := store.OAuthCodeByValue(ctx, db, plain)
		if err != nil || found.ID != code.ID || found.Hash == plain || found.UsedAt != nil {
			t.Fatalf("code by value = %+v, %v", found, err)
		}
		key, tok, err := store.IssueOAuthToken(ctx, db, found, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if cred.KindOf(tok) != cred.KindMCP || key.Hash != cred.Hash(tok) || key.OAuthCodeID != code.ID || key.ExpiresAt == nil {
			t.Fatalf("token %s, key %+v", tok, key)
		}
		if k, w, err := store.ResolveKey(ctx, db, tok); err != nil || k.ID != key.ID || w.ID != ws.ID {
			t.Fatalf("resolve token: %v", err)
		}
		// The code again: refused, and the token it gave is revoked.
		if _, _, err := store.IssueOAuthToken(ctx, db, found, time.Hour); !errors.Is(err, store.ErrCodeUsed) {
			t.Fatalf("reused code: %v, want ErrCodeUsed", err)
		}
		if _, _, err := store.ResolveKey(ctx, db, tok); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("token of a reused code still resolves: %v", err)
		}

		// Expiry.
		_, plain2 := newCode()
		c2, _ := store.OAuthCodeByValue(ctx, db, plain2)
		key2, tok2, err := store.IssueOAuthToken(ctx, db, c2, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.NewUpdate().Model((*schema.APIKey)(nil)).Set("expires_at = ?", schema.Now().Add(-time.Second)).
			Where("id = ?", key2.ID).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.ResolveKey(ctx, db, tok2); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("expired token resolves: %v", err)
		}

		// Revocation (RFC 7009): only by the client it was issued to.
		_, plain3 := newCode()
		c3, _ := store.OAuthCodeByValue(ctx, db, plain3)
		_, tok3, err := store.IssueOAuthToken(ctx, db, c3, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := store.RevokeOAuthToken(ctx, db, tok3, "oc_someoneelse"); ok || err != nil {
			t.Fatalf("another client revoked it: %v %v", ok, err)
		}
		if ok, err := store.RevokeOAuthToken(ctx, db, tok3, client.ID); !ok || err != nil {
			t.Fatalf("revoke: %v %v", ok, err)
		}
		if _, _, err := store.ResolveKey(ctx, db, tok3); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("revoked token resolves: %v", err)
		}
		if ok, err := store.RevokeOAuthToken(ctx, db, tok3, client.ID); ok || err != nil {
			t.Fatalf("revoking twice: %v %v", ok, err)
		}

		// A token lives no longer than the workspace key that consented to it (as a session token lives no longer
		// than the key that opened the session).
		_, plain4 := newCode()
		c4, _ := store.OAuthCodeByValue(ctx, db, plain4)
		_, tok4, err := store.IssueOAuthToken(ctx, db, c4, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.ResolveKey(ctx, db, tok4); err != nil {
			t.Fatalf("fresh token: %v", err)
		}
		if _, err := store.RevokeKey(ctx, db, ws.ID, consent.ID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.ResolveKey(ctx, db, tok4); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a token whose consenting key was revoked resolves: %v", err)
		}
	})
}
