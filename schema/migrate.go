package schema

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

//go:embed migrations
var migrationFS embed.FS

// migrationLockKey is the PostgreSQL advisory lock key that serializes migrators ("doppel").
const migrationLockKey int64 = 0x646f7070656c

// Migration is one embedded schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations for a dialect, in order. It takes a driver name
// ("sqlite", "postgres") or a bun dialect name (db.Dialect().Name().String(): "sqlite", "pg").
func Migrations(dialectName string) ([]Migration, error) {
	switch dialectName {
	case "pg", "postgresql":
		dialectName = DriverPostgres
	case "sqlite3":
		dialectName = DriverSQLite
	}
	dir := path.Join("migrations", dialectName)
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, fmt.Errorf("schema: no migrations for dialect %q: %w", dialectName, err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, rest, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("schema: migration file %s: name must be NNNN_name.sql", e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("schema: migrations %s and %s share version %d", prev, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(migrationFS, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("schema: read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: rest, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

func dialectDir(db bun.IDB) (string, error) {
	switch db.Dialect().Name() {
	case dialect.SQLite:
		return DriverSQLite, nil
	case dialect.PG:
		return DriverPostgres, nil
	default:
		return "", fmt.Errorf("schema: unsupported dialect %s", db.Dialect().Name())
	}
}

// Migrate applies every pending embedded migration. It is idempotent and safe to run
// from several processes at once: on PostgreSQL migrators queue on an advisory lock and
// each migration commits in its own transaction; on SQLite the whole run is one
// IMMEDIATE transaction, so the database file's write lock serializes migrators.
func Migrate(ctx context.Context, db *bun.DB) error {
	_, err := Apply(ctx, db)
	return err
}

// Apply is Migrate that also returns the versions it applied (none when up to date).
func Apply(ctx context.Context, db *bun.DB) ([]int, error) {
	name, err := dialectDir(db)
	if err != nil {
		return nil, err
	}
	migs, err := Migrations(name)
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: migrate: %w", err)
	}
	defer conn.Close()

	if name == DriverSQLite {
		var applied []int
		err := conn.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			var err error
			applied, err = applyPending(ctx, tx, migs, name)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("schema: migrate sqlite: %w", err)
		}
		return applied, nil
	}

	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(?)", migrationLockKey); err != nil {
		return nil, fmt.Errorf("schema: migrate: take advisory lock: %w", err)
	}
	defer func() {
		// A fresh context: the caller's may be done, and the lock must not outlive the migration.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(?)", migrationLockKey)
	}()
	var applied []int
	for i := range migs {
		var did []int
		err := conn.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			var err error
			did, err = applyPending(ctx, tx, migs[i:i+1], name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("schema: migrate postgres: %w", err)
		}
		applied = append(applied, did...)
	}
	// Refuse a database that a newer binary has migrated further than we know.
	if err := checkNotNewer(ctx, conn, migs); err != nil {
		return applied, err
	}
	return applied, nil
}

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS doppel_migrations (
	version INTEGER PRIMARY KEY,
	name TEXT NOT NULL,
	applied_at TEXT NOT NULL
)`

// applyPending runs, inside tx, each migration not yet recorded.
func applyPending(ctx context.Context, tx bun.Tx, migs []Migration, dialectName string) ([]int, error) {
	if _, err := tx.ExecContext(ctx, createMigrationsTable); err != nil {
		return nil, fmt.Errorf("create doppel_migrations: %w", err)
	}
	done, err := appliedVersions(ctx, tx)
	if err != nil {
		return nil, err
	}
	if dialectName == DriverSQLite {
		if err := newerThanKnown(done, migs); err != nil {
			return nil, err
		}
	}
	var applied []int
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return applied, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx,
			"INSERT INTO doppel_migrations (version, name, applied_at) VALUES (?, ?, ?)",
			m.Version, m.Name, Now().Format(TimeLayout)); err != nil {
			return applied, fmt.Errorf("record migration %04d: %w", m.Version, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

func appliedVersions(ctx context.Context, db bun.IConn) (map[int]bool, error) {
	rows, err := db.QueryContext(ctx, "SELECT version FROM doppel_migrations")
	if err != nil {
		return nil, fmt.Errorf("read doppel_migrations: %w", err)
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read doppel_migrations: %w", err)
		}
		done[v] = true
	}
	return done, rows.Err()
}

func checkNotNewer(ctx context.Context, db bun.IConn, migs []Migration) error {
	done, err := appliedVersions(ctx, db)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if err := newerThanKnown(done, migs); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return nil
}

// ErrNewerSchema means the database holds migrations this binary does not know.
var ErrNewerSchema = errors.New("database schema is newer than this binary")

func newerThanKnown(done map[int]bool, migs []Migration) error {
	known := map[int]bool{}
	for _, m := range migs {
		known[m.Version] = true
	}
	var unknown []int
	for v := range done {
		if !known[v] {
			unknown = append(unknown, v)
		}
	}
	if len(unknown) > 0 {
		sort.Ints(unknown)
		return fmt.Errorf("%w: applied versions %v are unknown", ErrNewerSchema, unknown)
	}
	return nil
}

// Version returns the highest applied migration version, 0 when none.
func Version(ctx context.Context, db bun.IDB) (int, error) {
	var v sql.NullInt64
	err := db.NewRaw("SELECT MAX(version) FROM doppel_migrations").Scan(ctx, &v)
	if err != nil {
		return 0, fmt.Errorf("schema: version: %w", err)
	}
	return int(v.Int64), nil
}
