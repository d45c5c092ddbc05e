package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/driver/sqliteshim"
)

// Drivers Open accepts.
const (
	DriverSQLite   = "sqlite"
	DriverPostgres = "postgres"
)

// Options says which database to open.
type Options struct {
	// Driver is "sqlite" or "postgres".
	Driver string
	// DSN is a file path or file: URI for SQLite (":memory:" for a private in-memory database),
	// or a postgres:// URL for PostgreSQL.
	DSN string
	// MaxOpenConns overrides the pool size (default: 4 for SQLite, 4×GOMAXPROCS for PostgreSQL).
	MaxOpenConns int
	// BusyTimeout is how long a SQLite writer waits for the file lock (default 10s).
	BusyTimeout time.Duration
}

// Open opens the metadata database with a pool suited to its driver. It does not migrate.
//
// SQLite is opened in WAL mode with a busy timeout, foreign keys on, and every
// transaction begun IMMEDIATE, so concurrent writers queue for the lock instead
// of failing; times are stored as fixed-width RFC 3339 UTC text with microseconds.
// The WAL is checkpointed in the background (see checkpoints), not by the commit
// that happens to fill it.
func Open(ctx context.Context, opts Options) (*bun.DB, error) {
	switch opts.Driver {
	case DriverSQLite:
		return openSQLite(ctx, opts)
	case DriverPostgres:
		return openPostgres(ctx, opts)
	default:
		return nil, fmt.Errorf("schema: driver %q: want %q or %q", opts.Driver, DriverSQLite, DriverPostgres)
	}
}

func openSQLite(ctx context.Context, opts Options) (*bun.DB, error) {
	if opts.DSN == "" {
		return nil, errors.New("schema: sqlite DSN is empty: give a file path")
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 10 * time.Second
	}
	dsn, memory, err := sqliteDSN(opts.DSN, busy)
	if err != nil {
		return nil, err
	}
	sqldb, err := sql.Open(sqliteshim.ShimName, dsn)
	if err != nil {
		return nil, fmt.Errorf("schema: open sqlite %q: %w", opts.DSN, err)
	}
	n := opts.MaxOpenConns
	if n <= 0 {
		n = 4
	}
	if memory {
		n = 1 // each connection to :memory: is its own database
	}
	sqldb.SetMaxOpenConns(n)
	sqldb.SetMaxIdleConns(n)
	sqldb.SetConnMaxIdleTime(0)
	db := bun.NewDB(sqldb, &sqliteDialect{Dialect: sqlitedialect.New()})
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("schema: open sqlite %q: %w", opts.DSN, err)
	}
	if !memory {
		go checkpoints(sqldb, checkpointEvery, walRestartFrames)
	}
	return db, nil
}

// checkpointEvery is how often the WAL is checkpointed in the background; walRestartFrames is the WAL length (in
// pages, 4 KiB each) past which the background checkpoint also restarts the WAL.
const (
	checkpointEvery  = 250 * time.Millisecond
	walRestartFrames = 4096
)

// checkpoints copies the WAL into the database file every period, until db is closed. SQLite's own automatic
// checkpoint (off: wal_autocheckpoint(0)) copies 1,000 pages inside the commit that crosses that mark, which under
// a steady stream of tool calls stalled one journal commit every few hundred for milliseconds (p99 at 1,000
// calls/s: 5.1-6.4 ms with it, 2.3-2.5 ms without). A PASSIVE checkpoint waits for no reader or writer, but
// while writes keep coming it never catches up with the WAL's end, and the WAL only starts over from its
// beginning once everything in it was copied. So when the WAL passes restartFrames, a RESTART checkpoint
// follows: it holds writers back while it copies what arrived since the PASSIVE one (little) and makes the next
// writer start the WAL over, so the file stays near restartFrames pages. It waits at most restartBusy for
// readers to finish, so a long read cannot hold the journal's writes back.
func checkpoints(db *sql.DB, period time.Duration, restartFrames int) {
	t := time.NewTicker(period)
	defer t.Stop()
	for range t.C {
		var busy, log, done int
		err := db.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &done)
		if err == nil && log >= restartFrames {
			err = restartWAL(db)
		}
		// database/sql does not export its closed-database error; its text has been the same since Go 1.
		if err != nil && strings.Contains(err.Error(), "database is closed") {
			return
		}
	}
}

// restartBusy is how long a RESTART checkpoint waits for readers and writers, holding new writers back as it
// does: it gives up after that, to try again a period later.
const restartBusy = 5 * time.Millisecond

// restartWAL runs a RESTART checkpoint on a connection whose busy timeout is restartBusy for its duration.
func restartWAL(db *sql.DB) error {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var normal int
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&normal); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", restartBusy.Milliseconds())); err != nil {
		return err
	}
	var busy, log, done int
	err = conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(RESTART)").Scan(&busy, &log, &done)
	if _, rerr := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", normal)); rerr != nil {
		// A connection left with the short timeout must not go back to the pool.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return rerr
	}
	return err
}

// sqliteDSN turns a path or file: URI into a modernc DSN carrying doppel's pragmas.
func sqliteDSN(in string, busy time.Duration) (dsn string, memory bool, err error) {
	path, query, _ := strings.Cut(strings.TrimPrefix(in, "file:"), "?")
	memory = path == ":memory:" || strings.Contains(query, "mode=memory")
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", false, fmt.Errorf("schema: sqlite DSN %q: %w", in, err)
	}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	if !memory {
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(NORMAL)")
		q.Add("_pragma", "wal_autocheckpoint(0)") // see checkpoints
	}
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode(), memory, nil
}

func openPostgres(ctx context.Context, opts Options) (*bun.DB, error) {
	if opts.DSN == "" {
		return nil, errors.New("schema: postgres DSN is empty: give a postgres:// URL")
	}
	if !strings.HasPrefix(opts.DSN, "postgres://") && !strings.HasPrefix(opts.DSN, "postgresql://") {
		return nil, fmt.Errorf("schema: postgres DSN must be a postgres:// URL")
	}
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(opts.DSN), pgdriver.WithTimeout(10*time.Second)))
	n := opts.MaxOpenConns
	if n <= 0 {
		n = 4 * runtime.GOMAXPROCS(0)
	}
	sqldb.SetMaxOpenConns(n)
	sqldb.SetMaxIdleConns(n)
	sqldb.SetConnMaxIdleTime(5 * time.Minute)
	sqldb.SetConnMaxLifetime(time.Hour)
	db := bun.NewDB(sqldb, pgdialect.New())
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("schema: open postgres: %w", err)
	}
	return db, nil
}

// sqliteDialect is bun's SQLite dialect with times written as fixed-width RFC 3339 UTC
// ("2006-01-02T15:04:05.000000Z"), so they read as RFC 3339 and sort as text.
type sqliteDialect struct {
	*sqlitedialect.Dialect
}

// TimeLayout is how SQLite stores times.
const TimeLayout = "2006-01-02T15:04:05.000000Z07:00"

func (d *sqliteDialect) AppendTime(b []byte, tm time.Time) []byte {
	b = append(b, '\'')
	b = tm.UTC().AppendFormat(b, TimeLayout)
	return append(b, '\'')
}

// Now returns the current time as stored: UTC, truncated to the microsecond both dialects keep.
func Now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
