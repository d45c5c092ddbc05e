package schema_test

import (
	"context"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// Migration 0003 gives environments their current build inputs: one built from uploads before it existed starts
// from its latest upload, so its next rebuild keeps them.
func TestMigrationStartsInputsFromLatestUpload(t *testing.T) {
	for _, driver := range []string{schema.DriverSQLite, schema.DriverPostgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db, exec := atVersion(t, driver, 2)
			exec(`INSERT INTO workspaces (id, name, access, created_at) VALUES ('ws_1', 'acme', 'granted', '2026-01-01T00:00:00Z')`)
			for _, env := range []string{"env_up", "env_none"} {
				exec(`INSERT INTO environments (id, workspace_id, slug, name, status, created_at, updated_at)
					VALUES (?, 'ws_1', ?, ?, 'ready', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')`, env, env, env)
			}
			for _, b := range []struct{ id, env, upload, at string }{
				{"bld_1", "env_up", "uploads/old", "2026-01-01T00:00:01Z"},
				{"bld_2", "env_up", "uploads/latest", "2026-01-01T00:00:02Z"},
				{"bld_3", "env_up", "", "2026-01-01T00:00:03Z"}, // a rebuild that dropped the upload
				{"bld_4", "env_none", "", "2026-01-01T00:00:01Z"},
			} {
				exec(`INSERT INTO builds (id, env_id, workspace_id, status, upload_key, created_at, updated_at)
					VALUES (?, ?, 'ws_1', 'succeeded', ?, ?, ?)`, b.id, b.env, b.upload, b.at, b.at)
			}
			if err := schema.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			for env, want := range map[string]string{"env_up": "uploads/latest", "env_none": ""} {
				var got string
				if err := db.NewRaw(`SELECT inputs_key FROM environments WHERE id = ?`, env).Scan(ctx, &got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s: inputs_key %q, want %q", env, got, want)
				}
			}
		})
	}
}

// atVersion opens a fresh database of driver with its first n migrations applied and recorded, as an older doppel
// left it, and answers it with a function that runs a statement on it (failing the test on an error).
func atVersion(t *testing.T, driver string, n int) (*bun.DB, func(q string, args ...any)) {
	t.Helper()
	_, db := openDSN(t, driver)
	migs, err := schema.Migrations(driver)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE doppel_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`)
	for _, m := range migs[:n] {
		exec(m.SQL)
		exec(`INSERT INTO doppel_migrations (version, name, applied_at) VALUES (?, ?, ?)`, m.Version, m.Name, "2026-01-01T00:00:00Z")
	}
	return db, exec
}
