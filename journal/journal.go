// Package journal durably records session calls with group commit: many callers, one transaction per batch.
package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/uptrace/bun"
)

// ErrClosed is returned by Submit after Close has begun.
var ErrClosed = errors.New("journal: closed")

// InsertFunc writes one batch inside the transaction the journal opened for it.
type InsertFunc[T any] func(ctx context.Context, db bun.IDB, batch []T) error

// Options configure a Writer.
type Options[T any] struct {
	// DB is where batches commit; each batch runs in its own transaction (DB.RunInTx).
	DB bun.IDB
	// Insert writes a batch inside that transaction.
	Insert InsertFunc[T]
	// Direct runs Insert on DB itself instead of inside a transaction the Writer opens: for an Insert
	// that is one statement (its own transaction, saving the BEGIN and COMMIT round trips) or that opens
	// its own transaction (e.g. store.AppendCalls).
	Direct bool
	// MaxBatch closes a batch at this many records (default 256).
	MaxBatch int
	// Linger is how long a batch waits for more records after the queue runs empty. 0 (the default)
	// commits as soon as nothing more is queued: batches then grow on their own while a commit is in
	// flight, which gives the lowest latency at low load and full batches under load.
	Linger time.Duration
	// Workers is how many batches may commit at once (default 1; keep 1 on SQLite, a single writer).
	Workers int
	// CommitTimeout bounds one batch's transaction (default 10s).
	CommitTimeout time.Duration
	// Queue is the submit queue's capacity (default 4×MaxBatch).
	Queue int
}

// Writer group-commits records. Submit blocks until the record's batch has committed (or failed: every
// waiter of a failed batch gets the error). It is safe for concurrent use.
type Writer[T any] struct {
	o      Options[T]
	in     chan *waiter[T]
	mu     sync.RWMutex // guards closed against sends on in
	closed bool
	wg     sync.WaitGroup

	batches, items, failed atomic.Int64
	maxSeen                atomic.Int64
}

type waiter[T any] struct {
	item T
	done chan error
}

// New starts a Writer's committers.
func New[T any](o Options[T]) (*Writer[T], error) {
	if o.DB == nil {
		return nil, errors.New("journal: Options.DB is nil")
	}
	if o.Insert == nil {
		return nil, errors.New("journal: Options.Insert is nil")
	}
	if o.MaxBatch < 0 || o.Linger < 0 || o.Workers < 0 || o.CommitTimeout < 0 || o.Queue < 0 {
		return nil, errors.New("journal: negative option")
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 256
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
	if o.CommitTimeout == 0 {
		o.CommitTimeout = 10 * time.Second
	}
	if o.Queue == 0 {
		o.Queue = 4 * o.MaxBatch
	}
	w := &Writer[T]{o: o, in: make(chan *waiter[T], o.Queue)}
	w.wg.Add(o.Workers)
	for range o.Workers {
		go w.run()
	}
	return w, nil
}

// Submit queues item and waits until it is durably committed. If ctx ends first, Submit returns ctx's
// error; the record may still commit with its batch.
func (w *Writer[T]) Submit(ctx context.Context, item T) error {
	wt := &waiter[T]{item: item, done: make(chan error, 1)}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return ErrClosed
	}
	select {
	case w.in <- wt:
	case <-ctx.Done():
		w.mu.RUnlock()
		return ctx.Err()
	}
	w.mu.RUnlock()
	select {
	case err := <-wt.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops taking records, commits everything already queued, and waits for the committers.
func (w *Writer[T]) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.in)
	w.mu.Unlock()
	w.wg.Wait()
	return nil
}

func (w *Writer[T]) run() {
	defer w.wg.Done()
	batch := make([]*waiter[T], 0, w.o.MaxBatch)
	items := make([]T, 0, w.o.MaxBatch)
	var timer *time.Timer
	for {
		// After Close, receives still yield every queued record before reporting the channel closed,
		// so this loop drains the queue in full batches and then returns.
		first, ok := <-w.in
		if !ok {
			return
		}
		batch = append(batch[:0], first)
		w.fill(&batch, &timer)
		items = items[:0]
		for _, wt := range batch {
			items = append(items, wt.item)
		}
		err := w.commit(items)
		for _, wt := range batch {
			wt.done <- err
		}
		clear(items) // drop references to committed records
		clear(batch)
	}
}

// fill adds queued records to batch until it is full, the queue is empty (Linger 0), Linger has passed
// since the queue ran empty, or the queue is closed and drained.
func (w *Writer[T]) fill(batch *[]*waiter[T], timer **time.Timer) {
	for len(*batch) < w.o.MaxBatch {
		select {
		case wt, ok := <-w.in:
			if !ok {
				return
			}
			*batch = append(*batch, wt)
			continue
		default:
		}
		if w.o.Linger == 0 {
			return
		}
		if *timer == nil {
			*timer = time.NewTimer(w.o.Linger)
		} else {
			(*timer).Reset(w.o.Linger)
		}
		for len(*batch) < w.o.MaxBatch {
			select {
			case wt, ok := <-w.in:
				if !ok {
					(*timer).Stop()
					return
				}
				*batch = append(*batch, wt)
				continue
			case <-(*timer).C:
				return
			}
		}
		(*timer).Stop()
		return
	}
}

func (w *Writer[T]) commit(items []T) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.o.CommitTimeout)
	defer cancel()
	var err error
	if w.o.Direct {
		err = w.o.Insert(ctx, w.o.DB, items)
	} else {
		err = w.o.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			return w.o.Insert(ctx, tx, items)
		})
	}
	w.batches.Add(1)
	w.items.Add(int64(len(items)))
	for {
		m := w.maxSeen.Load()
		if int64(len(items)) <= m || w.maxSeen.CompareAndSwap(m, int64(len(items))) {
			break
		}
	}
	if err != nil {
		w.failed.Add(1)
		return fmt.Errorf("journal: commit batch of %d: %w", len(items), err)
	}
	return nil
}

// Stats counts what a Writer has committed.
type Stats struct {
	Batches  int64 // transactions run
	Items    int64 // records in them
	Failed   int64 // transactions that failed
	MaxBatch int64 // largest batch seen
}

// Stats returns the Writer's counters.
func (w *Writer[T]) Stats() Stats {
	return Stats{Batches: w.batches.Load(), Items: w.items.Load(), Failed: w.failed.Load(), MaxBatch: w.maxSeen.Load()}
}
