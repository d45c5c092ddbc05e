package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// TestKeyCacheRevocationWindow: a cached workspace key or MCP token revoked by another process (here: straight in
// the database) is still accepted until its entry is DefaultKeyCacheTTL old, and refused from then on; one the
// cache has not seen is served; a key past its own expiry is refused even with a fresh entry; and the
// cache serves copies, so a caller's change does not leak into the next request.
func TestKeyCacheRevocationWindow(t *testing.T) {
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db := schematest.Open(t, driver)
			ws, err := store.CreateWorkspace(ctx, db, "acme")
			if err != nil {
				t.Fatal(err)
			}
			clock := time.Now()
			a := &Authenticator{DB: db, keys: newKeyCache(db, DefaultKeyCacheTTL)}
			a.keys.now = func() time.Time { return clock }

			for _, kind := range []cred.Kind{cred.KindWorkspace, cred.KindMCP} {
				row, plain, err := store.CreateKey(ctx, db, ws.ID, kind, "k")
				if err != nil {
					t.Fatal(err)
				}
				_, fresh, err := store.CreateKey(ctx, db, ws.ID, kind, "never used")
				if err != nil {
					t.Fatal(err)
				}
				p, err := a.Key(ctx, "Bearer "+plain, kind)
				if err != nil {
					t.Fatalf("%s: live key: %v", kind, err)
				}
				p.Workspace.Access, p.Key.Name = schema.AccessDenied, "changed by a caller"

				if _, err := store.RevokeKey(ctx, db, ws.ID, row.ID); err != nil {
					t.Fatal(err)
				}
				clock = clock.Add(DefaultKeyCacheTTL - time.Millisecond)
				p, err = a.Key(ctx, "Bearer "+plain, kind)
				if err != nil {
					t.Fatalf("%s: revoked elsewhere, inside the window: %v (the cache should still hold it)", kind, err)
				}
				if p.Workspace.Access != schema.AccessGranted || p.Key.Name != "k" {
					t.Errorf("%s: the cached copy was changed by a caller: access %q, name %q", kind, p.Workspace.Access, p.Key.Name)
				}
				clock = clock.Add(time.Millisecond)
				if _, err := a.Key(ctx, "Bearer "+plain, kind); !isStatus(err, http.StatusUnauthorized) {
					t.Errorf("%s: revoked elsewhere, %s later: err %v, want 401", kind, DefaultKeyCacheTTL, err)
				}
				if _, err := a.Key(ctx, "Bearer "+fresh, kind); err != nil {
					t.Errorf("%s: another live key: %v", kind, err)
				}
			}

			// An MCP token past its expiry is refused though its entry is fresh.
			row, plain, err := store.CreateKey(ctx, db, ws.ID, cred.KindMCP, "expiring")
			if err != nil {
				t.Fatal(err)
			}
			// Real time from here: the database's clock decides expiry too.
			a.keys.now, a.keys.ttl = time.Now, time.Hour // the entry outlives the token
			exp := time.Now().Add(300 * time.Millisecond)
			if _, err := db.NewUpdate().Model((*schema.APIKey)(nil)).Set("expires_at = ?", exp).Where("id = ?", row.ID).Exec(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Key(ctx, "Bearer "+plain, cred.KindMCP); err != nil {
				t.Fatalf("an MCP token before its expiry: %v", err)
			}
			time.Sleep(time.Until(exp) + 10*time.Millisecond)
			if _, err := a.Key(ctx, "Bearer "+plain, cred.KindMCP); !isStatus(err, http.StatusUnauthorized) {
				t.Errorf("an MCP token past its expiry with a fresh cache entry: err %v, want 401", err)
			}
		})
	}
}

// TestKeyCacheRevokeHere: with the cache on, a key this process revokes (keys.revoke) is refused on its very next
// request, though another key of the workspace had just been served from the cache.
func TestKeyCacheRevokeHere(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	ws, err := store.CreateWorkspace(ctx, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	row, victim, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "victim")
	if err != nil {
		t.Fatal(err)
	}
	_, admin, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "admin")
	if err != nil {
		t.Fatal(err)
	}
	h, _ := New(Options{DB: db, KeyCacheTTL: time.Hour})
	do := func(method, path, key string) int {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, k := range []string{victim, admin} {
		if code := do(http.MethodGet, "/v1/keys", k); code != http.StatusOK {
			t.Fatalf("list keys: %d", code)
		}
	}
	if code := do(http.MethodDelete, "/v1/keys/"+row.ID, admin); code != http.StatusOK {
		t.Fatalf("revoke: %d", code)
	}
	if code := do(http.MethodGet, "/v1/keys", victim); code != http.StatusUnauthorized {
		t.Errorf("the key this process revoked, next request: %d, want 401 at once", code)
	}
	if code := do(http.MethodGet, "/v1/keys", admin); code != http.StatusOK {
		t.Errorf("the other key after the revoke: %d", code)
	}
}

func isStatus(err error, status int) bool {
	if err == nil {
		return false
	}
	_, got := EnvelopeOf(context.Background(), err)
	return got == status
}
