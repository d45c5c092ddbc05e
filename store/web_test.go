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

// GetWebKey reads a web session's key and whether the session was signed out in one query, on both databases.
func TestGetWebKey(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		key, _, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "console")
		if err != nil {
			t.Fatal(err)
		}
		if err := store.SignOutWeb(ctx, db, "jti-out", schema.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, keyID, jti string
			signedOut        bool
			err              error
		}{
			{"live session", key.ID, "jti-live", false, nil},
			{"signed out", key.ID, "jti-out", true, nil},
			{"unknown key", "key_nope", "jti-live", false, store.ErrNotFound},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, out, err := store.GetWebKey(ctx, db, tc.keyID, tc.jti)
				if tc.err != nil {
					if !errors.Is(err, tc.err) {
						t.Fatalf("err = %v, want %v", err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.ID != key.ID || got.WorkspaceID != ws.ID || got.Hash != key.Hash || got.Kind != key.Kind {
					t.Errorf("key = %+v, want %+v", got, key)
				}
				if out != tc.signedOut {
					t.Errorf("signed out = %v, want %v", out, tc.signedOut)
				}
			})
		}
	})
}
