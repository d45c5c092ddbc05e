package journal

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	"github.com/doppel-dev/doppel/schema"
)

// InsertCalls writes a batch of transcript entries with one multi-row INSERT. It does not touch the
// sessions rows: a session's counters, fidelity mix, last state hash and last activity are read from its
// calls, so the hot path costs one statement per batch whatever the number of sessions in it.
func InsertCalls(ctx context.Context, db bun.IDB, calls []schema.Call) error {
	if len(calls) == 0 {
		return nil
	}
	if _, err := db.NewInsert().Model(&calls).Exec(ctx); err != nil {
		return fmt.Errorf("insert %d calls: %w", len(calls), err)
	}
	return nil
}

// sqliteCalls writes a batch with one prepared single-row INSERT per call, in one transaction. On SQLite this beats InsertCalls' multi-row INSERT, whose text SQLite parses afresh for every batch
// into a program as long as the batch (and modernc's allocator maps and unmaps the larger ones): the
// prepared statement is parsed once per connection and each row only binds and steps it. Rows are written
// exactly as bun writes them (schema.TimeLayout times, 0/1 booleans), so either path reads back the same.
//
// When the pool has room (more than one connection), the journal keeps one connection of its own, added to the
// pool's limit while it holds it: its statements stay prepared on it, and a batch takes no connection or
// transaction from database/sql (BenchmarkCallServer: about 5% less CPU per call, with the rows bound to the driver).
type sqliteCalls struct {
	db *bun.DB

	mu   sync.Mutex
	wmu  sync.Mutex // one batch at a time on the journal's connection (a BEGIN … COMMIT of its own)
	conn *sql.Conn  // held while it works; nil: taken on first use (or the pool's, when it has one connection)
	// grown is set while the pool's limit counts the journal's connection on top of the connections it had.
	grown bool
	stmt  *sql.Stmt // prepared on first use
	// On the journal's connection, a batch's rows go to the driver's statement directly (prepared there on first
	// use), with one argument slice reused: database/sql's bookkeeping around each statement was a third of a
	// row's cost. wmu guards both.
	dstmt driver.StmtExecContext
	args  []driver.NamedValue
}

const sqliteInsertCall = `INSERT INTO calls (id, session_id, seq, tool, arguments, content, error, fidelity, rung,
 downgraded, ms, requestor, state_hash, created_at, fault) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func (p *sqliteCalls) prepared(ctx context.Context) (*sql.Stmt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stmt != nil {
		return p.stmt, nil
	}
	var prep interface {
		PrepareContext(context.Context, string) (*sql.Stmt, error)
	} = p.db.DB
	if n := p.db.DB.Stats().MaxOpenConnections; n != 1 {
		if n > 1 {
			p.resize(n + 1) // the rest of the process keeps as many connections as it was given
			p.grown = true
		}
		conn, err := p.db.DB.Conn(ctx)
		if err != nil {
			_ = p.release()
			return nil, fmt.Errorf("the journal's connection: %w", err)
		}
		p.conn, prep = conn, conn
	}
	st, err := prep.PrepareContext(ctx, sqliteInsertCall)
	if err != nil {
		_ = p.release()
		return nil, fmt.Errorf("prepare the calls insert: %w", err)
	}
	p.stmt = st
	return p.stmt, nil
}

// release closes the statement and returns the connection to the pool. p.mu is held.
func (p *sqliteCalls) release() error {
	var err error
	if p.stmt != nil {
		err = p.stmt.Close()
		p.stmt = nil
	}
	if p.dstmt != nil && p.conn != nil {
		dst := p.dstmt
		err = errors.Join(err, p.conn.Raw(func(any) error { return dst.(driver.Stmt).Close() }))
	}
	p.dstmt = nil
	if p.conn != nil {
		err = errors.Join(err, p.conn.Close())
		p.conn = nil
	}
	if p.grown {
		p.resize(p.db.DB.Stats().MaxOpenConnections - 1)
		p.grown = false
	}
	return err
}

// resize sets the pool's open and idle connection limits to n.
func (p *sqliteCalls) resize(n int) {
	p.db.DB.SetMaxOpenConns(n)
	p.db.DB.SetMaxIdleConns(n)
}

// failed drops the journal's connection after a batch failed, so a connection that went bad is not kept: the next
// batch takes another.
func (p *sqliteCalls) failed() {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.release()
}

// insert writes calls: a single call with the prepared statement alone (its own transaction), more in one
// transaction (Writer's Direct mode: sqliteCalls opens it, saving BEGIN and COMMIT for a lone call).
func (p *sqliteCalls) insert(ctx context.Context, _ bun.IDB, calls []schema.Call) error {
	if len(calls) == 0 {
		return nil
	}
	st, err := p.prepared(ctx)
	if err != nil {
		return err
	}
	if err := p.write(ctx, st, calls); err != nil {
		p.failed()
		return err
	}
	return nil
}

func (p *sqliteCalls) write(ctx context.Context, st *sql.Stmt, calls []schema.Call) error {
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	if conn != nil {
		// A lone call too: on this connection it would otherwise land inside another batch's transaction.
		p.wmu.Lock()
		defer p.wmu.Unlock()
		if len(calls) == 1 {
			return p.exec(ctx, st, calls, 0)
		}
		return p.writeOn(ctx, conn, calls)
	}
	if len(calls) == 1 {
		return p.exec(ctx, st, calls, 0)
	}
	tx, err := p.db.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("insert %d calls: begin: %w", len(calls), err)
	}
	txst := tx.StmtContext(ctx, st) // reuses st's statement on the transaction's connection once prepared there
	for i := range calls {
		if err := p.exec(ctx, txst, calls, i); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("insert %d calls: commit: %w", len(calls), err)
	}
	return nil
}

// writeOn writes calls in one transaction on the journal's own connection. The transaction begins IMMEDIATE, as
// every transaction of the pool does (schema.Open), so it holds the write lock once begun: its rows wait for no
// lock, and run without the batch's deadline (whose watch the driver would set up for every row), which BEGIN and
// COMMIT keep.
func (p *sqliteCalls) writeOn(ctx context.Context, conn *sql.Conn, calls []schema.Call) error {
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("insert %d calls: begin: %w", len(calls), err)
	}
	if err := conn.Raw(func(dc any) error { return p.rows(dc, calls) }); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return fmt.Errorf("insert %d calls: commit: %w", len(calls), err)
	}
	return nil
}

// rows inserts calls through the driver connection dc (the journal's own), with the values exec binds.
func (p *sqliteCalls) rows(dc any, calls []schema.Call) error {
	ctx := context.Background()
	if p.dstmt == nil {
		pc, ok := dc.(driver.ConnPrepareContext)
		if !ok {
			return fmt.Errorf("insert %d calls: the SQLite driver's connection (%T) does not prepare statements", len(calls), dc)
		}
		st, err := pc.PrepareContext(ctx, sqliteInsertCall)
		if err != nil {
			return fmt.Errorf("prepare the calls insert: %w", err)
		}
		ex, ok := st.(driver.StmtExecContext)
		if !ok {
			_ = st.Close()
			return fmt.Errorf("insert %d calls: the SQLite driver's statement (%T) does not execute with a context", len(calls), st)
		}
		p.dstmt = ex
	}
	for i := range calls {
		vals, err := rowValues(calls, i)
		if err != nil {
			return err
		}
		p.args = p.args[:0]
		for k, v := range vals {
			p.args = append(p.args, driver.NamedValue{Ordinal: k + 1, Value: v})
		}
		if _, err := p.dstmt.ExecContext(ctx, p.args); err != nil {
			return fmt.Errorf("insert %d calls: calls[%d]: %w", len(calls), i, err)
		}
	}
	clear(p.args) // no row's strings kept until the next batch
	return nil
}

// rowValues are the values of calls[i]'s row, in sqliteInsertCall's order, as bun writes them.
func rowValues(calls []schema.Call, i int) ([15]driver.Value, error) {
	c := &calls[i]
	if len(c.Arguments) == 0 {
		return [15]driver.Value{}, fmt.Errorf("insert %d calls: calls[%d].arguments is empty", len(calls), i)
	}
	return [15]driver.Value{c.ID, c.SessionID, c.Seq, c.Tool, string(c.Arguments), c.Content, bit(c.Error), c.Fidelity,
		c.Rung, bit(c.Downgraded), c.Ms, c.Requestor, c.StateHash, c.CreatedAt.UTC().Format(schema.TimeLayout),
		nullText(c.Fault)}, nil
}

func (p *sqliteCalls) exec(ctx context.Context, st *sql.Stmt, calls []schema.Call, i int) error {
	vals, err := rowValues(calls, i)
	if err != nil {
		return err
	}
	var args [15]any
	for k, v := range vals {
		args[k] = v
	}
	if _, err := st.ExecContext(ctx, args[:]...); err != nil {
		return fmt.Errorf("insert %d calls: calls[%d]: %w", len(calls), i, err)
	}
	return nil
}

func (p *sqliteCalls) close() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.release()
}

// nullText is a JSON column's value: NULL when empty, as bun writes a nil json.RawMessage.
func nullText(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func bit(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// The linger doppel's processes give their calls journal on SQLite (on PostgreSQL, whose commits wait on the server,
// batches grow on their own and the linger only added idle time): once batches reach DefaultLingerFrom records (load: at
// 1,000 calls/s they hold one), a batch waits for the requests that are running to reach the journal, in steps of
// DefaultLingerStep while records keep coming, DefaultLinger at most. `doppel dev` at its peak, 64 sessions on 2
// cores, in runs taken in turn: one wait of 200 µs gave 17-18 calls a commit instead of 8-9, and 131-151 µs of
// server CPU a call instead of 140-161 (waits of 100 and 400 µs did as well); steps of 50 µs, ending at the first
// that brought nothing, then gave 12,310 calls/s on average over 7 runs against 11,440 for the single wait (the
// machine less idle while the leader waited). At 1,000 calls/s the median call is unchanged (440-450 µs, against
// 460-490 without a linger).
const (
	DefaultLinger     = 200 * time.Microsecond
	DefaultLingerStep = 50 * time.Microsecond
	DefaultLingerFrom = 4
)

// CallOptions tune a calls journal; zero values take Writer's defaults.
type CallOptions struct {
	MaxBatch int
	Linger   time.Duration
	// LingerFrom and LingerStep are Options'.
	LingerFrom    int
	LingerStep    time.Duration
	Workers       int
	CommitTimeout time.Duration
	// NoYield is Options.NoYield.
	NoYield bool
	// OnCommit is Options.OnCommit.
	OnCommit func(n int, d time.Duration, err error)
}

// NewCalls returns a group-commit Writer of transcript entries into db's calls table: on SQLite a transaction
// of prepared single-row INSERTs per batch (sqliteCalls), elsewhere one multi-row INSERT (InsertCalls).
func NewCalls(db bun.IDB, o CallOptions) (*Writer[schema.Call], error) {
	opts := Options[schema.Call]{
		DB:            db,
		Insert:        InsertCalls,
		Direct:        true, // InsertCalls is one multi-row INSERT
		MaxBatch:      o.MaxBatch,
		Linger:        o.Linger,
		LingerFrom:    o.LingerFrom,
		LingerStep:    o.LingerStep,
		Workers:       o.Workers,
		CommitTimeout: o.CommitTimeout,
		OnCommit:      o.OnCommit,
		NoYield:       o.NoYield,
	}
	if bdb, ok := db.(*bun.DB); ok && bdb.Dialect().Name() == dialect.SQLite {
		p := &sqliteCalls{db: bdb}
		opts.Insert, opts.OnClose = p.insert, p.close
	}
	return New(opts)
}
