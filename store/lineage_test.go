package store_test

import (
	"errors"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// Keys derived from a key end with it however many hops away: revoking cascades down the chain (and no further
// up it), and a key derived from one already revoked — a process that had it cached derived it after the
// revocation — is refused on use. Sessions opened with a derived key are rooted at the chain's root and end with
// it too; a fork made with its parent's token ends with the parent.
func TestDerivedCredentialsEndWithTheirChain(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		k, kTok, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "root")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.DeriveKey(ctx, db, k, cred.KindWorkspace, "peer"); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("DeriveKey(workspace) err = %v, want ErrInvalid: workspace keys derive from nothing", err)
		}
		m, mTok, err := store.DeriveKey(ctx, db, k, cred.KindMCP, "mcp")
		if err != nil || m.ParentKeyID != k.ID || m.RootKeyID != k.ID || m.Root() != k.ID || k.Root() != k.ID {
			t.Fatalf("DeriveKey = %+v, %v", m, err)
		}
		// A link below the MCP token, as a refreshed token would be.
		r, rTok, err := store.DeriveKey(ctx, db, m, cred.KindMCP, "refreshed")
		if err != nil || r.ParentKeyID != m.ID || r.RootKeyID != k.ID {
			t.Fatalf("DeriveKey(from a derived key) = %+v, %v", r, err)
		}
		s := &schema.Session{EnvID: env.ID, OpenedByKeyID: r.ID}
		sTok, err := store.CreateSession(ctx, db, s)
		if err != nil || s.RootKeyID != k.ID {
			t.Fatalf("session opened by a derived key: root %q (%v), want %s", s.RootKeyID, err, k.ID)
		}
		fork := &schema.Session{EnvID: env.ID, OpenedByKeyID: r.ID, RootKeyID: k.ID, ForkedFrom: s.ID, EndsWithParent: true}
		fTok, err := store.CreateSession(ctx, db, fork)
		if err != nil {
			t.Fatal(err)
		}
		live := func(tok string) bool {
			t.Helper()
			var err error
			if cred.KindOf(tok) == cred.KindSession {
				_, err = store.SessionByToken(ctx, db, tok)
			} else {
				_, _, err = store.ResolveKey(ctx, db, tok)
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatal(err)
			}
			return err == nil
		}
		for _, tok := range []string{kTok, mTok, rTok, sTok, fTok} {
			if !live(tok) {
				t.Fatalf("%s refused before any revocation", cred.Display(tok))
			}
		}

		// Revoking the middle link ends what derives from it, not what it derives from.
		if _, err := store.RevokeKey(ctx, db, ws.ID, m.ID); err != nil {
			t.Fatal(err)
		}
		if !live(kTok) || live(mTok) || live(rTok) || live(sTok) || live(fTok) {
			t.Fatalf("after revoking the MCP token: root %v, mcp %v, refreshed %v, session %v, fork %v; want only the root live",
				live(kTok), live(mTok), live(rTok), live(sTok), live(fTok))
		}
		if got, _ := store.GetKey(ctx, db, ws.ID, r.ID); got.RevokedAt == nil {
			t.Error("the key derived from the revoked one was not revoked with it")
		}

		// A key derived from a key already revoked (by a process that had it cached) is refused on use.
		late, lateTok, err := store.DeriveKey(ctx, db, m, cred.KindMCP, "late")
		if err != nil {
			t.Fatal(err)
		}
		if live(lateTok) {
			t.Fatal("a key derived from a revoked key resolves")
		}
		// Revoking the root ends the rest of its chain, whatever it is.
		m2, m2Tok, _ := store.DeriveKey(ctx, db, k, cred.KindMCP, "second")
		s2 := &schema.Session{EnvID: env.ID, OpenedByKeyID: m2.ID}
		s2Tok, _ := store.CreateSession(ctx, db, s2)
		if !live(m2Tok) || !live(s2Tok) {
			t.Fatal("a second chain is refused before its root is revoked")
		}
		if _, err := store.RevokeKey(ctx, db, ws.ID, k.ID); err != nil {
			t.Fatal(err)
		}
		for _, tok := range []string{kTok, m2Tok, s2Tok} {
			if live(tok) {
				t.Errorf("%s live after its root was revoked", cred.Display(tok))
			}
		}
		if got, _ := store.GetKey(ctx, db, ws.ID, late.ID); got.RevokedAt == nil {
			t.Error("revoking the root left a key of its chain unrevoked")
		}
	})
}

// A fork made with its parent's token is refused once the parent has ended, even before its own row ends; a fork
// made with a key is not. BoundForks and OrphanedForks find the former.
func TestBoundForks(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		parent, _ := openSession(t, db, env, "key_x")
		bound := &schema.Session{EnvID: env.ID, OpenedByKeyID: "key_x", ForkedFrom: parent.ID, EndsWithParent: true}
		bTok, err := store.CreateSession(ctx, db, bound)
		if err != nil {
			t.Fatal(err)
		}
		free := &schema.Session{EnvID: env.ID, OpenedByKeyID: "key_y", ForkedFrom: parent.ID}
		fTok, err := store.CreateSession(ctx, db, free)
		if err != nil {
			t.Fatal(err)
		}
		if fs, err := store.BoundForks(ctx, db, parent.ID); err != nil || len(fs) != 1 || fs[0].ID != bound.ID {
			t.Fatalf("BoundForks = %v, %v; want [%s]", fs, err, bound.ID)
		}
		if os, err := store.OrphanedForks(ctx, db, 10); err != nil || len(os) != 0 {
			t.Fatalf("OrphanedForks with the parent open = %v, %v", os, err)
		}
		if _, err := store.EndSession(ctx, db, parent.ID, schema.SessionClosed); err != nil {
			t.Fatal(err)
		}
		if _, err := store.SessionByToken(ctx, db, bTok); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the bound fork's token after its parent ended: %v, want ErrNotFound", err)
		}
		if _, err := store.SessionByToken(ctx, db, fTok); err != nil {
			t.Errorf("the free fork's token after the parent ended: %v", err)
		}
		if os, err := store.OrphanedForks(ctx, db, 10); err != nil || len(os) != 1 || os[0].ID != bound.ID {
			t.Fatalf("OrphanedForks = %v, %v; want [%s]", os, err, bound.ID)
		}
		// Once ended itself, its token reads its own status (the caller answers 401 closed, 404 expired).
		if _, err := store.EndSession(ctx, db, bound.ID, schema.SessionExpired); err != nil {
			t.Fatal(err)
		}
		if got, err := store.SessionByToken(ctx, db, bTok); err != nil || got.Status != schema.SessionExpired {
			t.Errorf("the ended bound fork's token = %v, %v; want its expired row", got, err)
		}
	})
}
