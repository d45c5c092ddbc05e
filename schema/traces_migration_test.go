package schema_test

import (
	"context"
	"testing"

	"github.com/doppel-dev/doppel/schema"
)

// Migration 0011 drops the trace rows' batch key and keeps them: each row is as it was, a row may name a batch
// unchecked, and deleting an environment still deletes its rows.
func TestMigrationKeepsTracesWithoutBatchKey(t *testing.T) {
	for _, driver := range []string{schema.DriverSQLite, schema.DriverPostgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			db, exec := atVersion(t, driver, 10)
			const at = "2026-01-01T00:00:00Z"
			exec(`INSERT INTO workspaces (id, name, access, created_at) VALUES ('ws_1', 'acme', 'granted', ?)`, at)
			for _, env := range []string{"env_a", "env_b"} {
				exec(`INSERT INTO environments (id, workspace_id, slug, name, status, created_at, updated_at)
					VALUES (?, 'ws_1', ?, ?, 'collecting', ?, ?)`, env, env, env, at, at)
				exec(`INSERT INTO trace_batches (id, env_id, blob_key, n_traces, n_duplicates, bytes, tools_seen, created_at)
					VALUES (?, ?, 'batches/x', 2, 0, 10, '[]', ?)`, "tb_"+env, env, at)
				for i, id := range []string{"t1", "t2"} {
					exec(`INSERT INTO traces (env_id, trace_id, batch_id, idx, created_at) VALUES (?, ?, ?, ?, ?)`, env, id, "tb_"+env, i, at)
				}
			}
			if err := schema.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			type row struct {
				EnvID   string `bun:"env_id"`
				TraceID string `bun:"trace_id"`
				BatchID string `bun:"batch_id"`
				Idx     int64  `bun:"idx"`
			}
			var rows []row
			if err := db.NewRaw(`SELECT env_id, trace_id, batch_id, idx FROM traces ORDER BY env_id, trace_id`).Scan(ctx, &rows); err != nil {
				t.Fatal(err)
			}
			want := []row{{"env_a", "t1", "tb_env_a", 0}, {"env_a", "t2", "tb_env_a", 1}, {"env_b", "t1", "tb_env_b", 0}, {"env_b", "t2", "tb_env_b", 1}}
			if len(rows) != len(want) {
				t.Fatalf("rows %+v, want %+v", rows, want)
			}
			for i := range want {
				if rows[i] != want[i] {
					t.Fatalf("rows %+v, want %+v", rows, want)
				}
			}
			exec(`INSERT INTO traces (env_id, trace_id, batch_id, idx, created_at) VALUES ('env_a', 't3', 'tb_unknown', 2, ?)`, at)
			exec(`DELETE FROM environments WHERE id = 'env_a'`)
			var left int
			if err := db.NewRaw(`SELECT count(*) FROM traces`).Scan(ctx, &left); err != nil || left != 2 {
				t.Fatalf("%d trace rows after deleting env_a (%v), want env_b's 2", left, err)
			}
		})
	}
}
