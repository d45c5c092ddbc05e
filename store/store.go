// Package store holds doppel's metadata data functions; each takes a bun.IDB so it runs in or out of a transaction.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/doppel-dev/doppel/schema"
)

// Sentinel errors, wrapped with %w by every function here.
var (
	// ErrNotFound: no such row, or a row of another workspace.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a unique key is already taken, or the row is in a state that forbids the change.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: an argument is malformed; nothing was written.
	ErrInvalid = errors.New("invalid")
)

// now is the time stamped on rows: UTC, microsecond precision (what both dialects keep).
func now() time.Time { return schema.Now() }

// sqliteCoder is the method modernc.org/sqlite errors carry.
type sqliteCoder interface{ Code() int }

// SQLite extended result codes.
const (
	sqliteConstraintForeignKey = 787
	sqliteConstraintPrimaryKey = 1555
	sqliteConstraintUnique     = 2067
)

// classify maps driver errors onto the sentinels: unique violations → ErrConflict,
// foreign-key violations → ErrNotFound (the referenced row is missing), no rows → ErrNotFound.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	var pg pgdriver.Error
	if errors.As(err, &pg) {
		switch pg.Field('C') {
		case "23505":
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case "23503":
			return fmt.Errorf("%w: referenced row missing: %w", ErrNotFound, err)
		}
		return err
	}
	var lite sqliteCoder
	if errors.As(err, &lite) {
		switch lite.Code() {
		case sqliteConstraintUnique, sqliteConstraintPrimaryKey:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case sqliteConstraintForeignKey:
			return fmt.Errorf("%w: referenced row missing: %w", ErrNotFound, err)
		}
	}
	return err
}

// wrap prefixes an error with what was being done, classifying driver errors.
func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("store: "+format+": %w", append(args, classify(err))...)
}

// inTx runs fn in a transaction (a savepoint when db already is one).
func inTx(ctx context.Context, db bun.IDB, fn func(ctx context.Context, tx bun.Tx) error) error {
	return db.RunInTx(ctx, nil, fn)
}

// isPostgres reports whether db speaks PostgreSQL.
func isPostgres(db bun.IDB) bool { return db.Dialect().Name().String() == "pg" }
