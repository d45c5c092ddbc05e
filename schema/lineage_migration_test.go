package schema_test

import (
	"context"
	"testing"

	"github.com/doppel-dev/doppel/schema"
)

// Migration 0012 records credential lineage on what exists: an OAuth-issued token derives from (and is rooted at)
// the workspace key that consented, a session opened with such a token is rooted there too, and keys minted
// directly and their sessions stay roots.
func TestMigrationRecordsCredentialLineage(t *testing.T) {
	for _, driver := range []string{schema.DriverSQLite, schema.DriverPostgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db, exec := atVersion(t, driver, 11)
			const at = "2026-01-01T00:00:00Z"
			exec(`INSERT INTO workspaces (id, name, access, created_at) VALUES ('ws_1', 'acme', 'granted', ?)`, at)
			exec(`INSERT INTO environments (id, workspace_id, slug, name, status, created_at, updated_at)
				VALUES ('env_1', 'ws_1', 'shop', 'shop', 'ready', ?, ?)`, at, at)
			for _, k := range []struct{ id, kind, code string }{{"key_k", "workspace", ""}, {"key_m", "mcp", ""}, {"key_t", "mcp", "oac_1"}} {
				exec(`INSERT INTO api_keys (id, workspace_id, kind, hash, prefix, created_at, oauth_code_id) VALUES (?, 'ws_1', ?, ?, 'p', ?, ?)`,
					k.id, k.kind, "h_"+k.id, at, k.code)
			}
			exec(`INSERT INTO oauth_clients (id, name, redirect_uris, created_at) VALUES ('occ_1', 'c', '[]', ?)`, at)
			exec(`INSERT INTO oauth_codes (id, hash, client_id, workspace_id, key_id, redirect_uri, challenge, created_at, expires_at)
				VALUES ('oac_1', 'hc', 'occ_1', 'ws_1', 'key_k', 'http://x', 'c', ?, ?)`, at, at)
			for _, s := range [][2]string{{"ses_k", "key_k"}, {"ses_m", "key_m"}, {"ses_t", "key_t"}} {
				exec(`INSERT INTO sessions (id, env_id, workspace_id, token_hash, opened_by_key_id, status, created_at, last_used_at, expires_at)
					VALUES (?, 'env_1', 'ws_1', ?, ?, 'open', ?, ?, ?)`, s[0], "t_"+s[0], s[1], at, at, at)
			}
			if err := schema.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			var keys []schema.APIKey
			if err := db.NewSelect().Model(&keys).Order("id").Scan(ctx); err != nil {
				t.Fatal(err)
			}
			want := map[string][2]string{"key_k": {"", ""}, "key_m": {"", ""}, "key_t": {"key_k", "key_k"}}
			for _, k := range keys {
				if got := [2]string{k.ParentKeyID, k.RootKeyID}; got != want[k.ID] {
					t.Errorf("key %s: parent, root = %q, want %q", k.ID, got, want[k.ID])
				}
			}
			var sessions []schema.Session
			if err := db.NewSelect().Model(&sessions).Order("id").Scan(ctx); err != nil {
				t.Fatal(err)
			}
			wantRoot := map[string]string{"ses_k": "", "ses_m": "", "ses_t": "key_k"}
			for _, s := range sessions {
				if s.RootKeyID != wantRoot[s.ID] || s.EndsWithParent {
					t.Errorf("session %s: root %q ends_with_parent %v, want root %q and false", s.ID, s.RootKeyID, s.EndsWithParent, wantRoot[s.ID])
				}
			}
		})
	}
}
