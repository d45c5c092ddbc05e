// Package schematest opens migrated metadata databases for tests: SQLite always, real PostgreSQL via testenv.
package schematest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
)

// SQLiteDSN returns the path of a fresh SQLite file in the test's temp dir.
func SQLiteDSN(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "doppel.db")
}

// PostgresDSN creates an empty schema on the real PostgreSQL named by DOPPEL_TEST_POSTGRES
// (or skips), drops it when the test ends, and returns a DSN whose search_path is that schema.
// A schema is much cheaper than a database and isolates tests just as well.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	admin := testenv.Postgres(t)
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("DOPPEL_TEST_POSTGRES: %v", err)
	}
	name := schema.NewID("doppel_t_")
	adm := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(admin)))
	if _, err := adm.ExecContext(context.Background(), fmt.Sprintf(`CREATE SCHEMA %q`, name)); err != nil {
		adm.Close()
		t.Fatalf("create test schema: %v", err)
	}
	t.Cleanup(func() {
		defer adm.Close()
		if _, err := adm.ExecContext(context.Background(), fmt.Sprintf(`DROP SCHEMA IF EXISTS %q CASCADE`, name)); err != nil {
			t.Errorf("drop test schema %s: %v", name, err)
		}
	})
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// Open opens and migrates a fresh database for driver ("sqlite" or "postgres"), closed when the test ends.
func Open(t testing.TB, driver string) *bun.DB {
	t.Helper()
	var dsn string
	switch driver {
	case schema.DriverSQLite:
		dsn = SQLiteDSN(t)
	case schema.DriverPostgres:
		dsn = PostgresDSN(t)
	default:
		t.Fatalf("schematest: unknown driver %q", driver)
	}
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: driver, DSN: dsn})
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	t.Cleanup(func() { db.Close() })
	if err := schema.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate %s: %v", driver, err)
	}
	return db
}

// Drivers returns the backends every metadata test runs on.
func Drivers() []string { return []string{schema.DriverSQLite, schema.DriverPostgres} }

// Each runs fn as a subtest per driver, each with its own fresh migrated database.
// The PostgreSQL subtest skips when DOPPEL_TEST_POSTGRES is unset (and fails under DOPPEL_TEST_REQUIRE=1).
func Each(t *testing.T, fn func(t *testing.T, db *bun.DB)) {
	t.Helper()
	for _, d := range Drivers() {
		t.Run(d, func(t *testing.T) { fn(t, Open(t, d)) })
	}
}
