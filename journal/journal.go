// Package journal durably records session calls with group commit: many callers, one transaction per batch.
package journal

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	// its own transaction.
	Direct bool
	// MaxBatch closes a batch at this many records (default 256).
	MaxBatch int
	// Linger is how long a batch that is not full waits, once, for more records before it commits. 0 (the
	// default) commits what is queued at once: batches then grow on their own while a commit is in flight,
	// which gives the lowest latency at low load and full batches under load.
	Linger time.Duration
	// LingerFrom makes Linger wait only after a batch of at least this many records (0: after any batch). Batches
	// that grow on their own mean load: the wait then lets the requests that are running reach Submit and join the
	// batch, while a lone record at low load still commits at once.
	LingerFrom int
	// LingerStep, when set, cuts the Linger into waits of this long, and the batch commits after the first that
	// brought no record: once the running requests are in, the CPU goes back to work instead of idling out the
	// Linger. 0: one wait of Linger.
	LingerStep time.Duration
	// NoYield takes a batch at once, without first letting the goroutines that are ready to run reach Submit
	// (see Writer): for comparing the two.
	NoYield bool
	// Workers is how many batches may commit at once (default 1; keep 1 on SQLite, a single writer).
	Workers int
	// CommitTimeout bounds one batch's transaction (default 10s).
	CommitTimeout time.Duration
	// Queue is how many records may wait at once (default 4×MaxBatch); Submit waits for room beyond it.
	Queue int
	// OnClose, if set, runs once Close has committed everything (e.g. to close a prepared statement).
	OnClose func() error
	// OnCommit, if set, is told each batch's size, commit time and error (e.g. for metrics); it must be quick.
	OnCommit func(n int, d time.Duration, err error)
}

// Writer group-commits records. Submit blocks until the record's batch has committed (or failed: every
// waiter of a failed batch gets the error). It is safe for concurrent use.
//
// There is no committer goroutine to hand records to. A Submit that finds fewer than Workers batches
// committing leads: it takes what is queued (its own record included) and commits it. When the Submit's
// context cannot end (context.WithoutCancel, Background) it commits on its own goroutine, which at low load
// saves two goroutine hand-offs per record; otherwise a goroutine commits for it, so the Submit can return
// when its context ends. Once a leader's own record has committed, what queued behind it is committed by a
// goroutine, and the leader's caller goes on.
type Writer[T any] struct {
	o       Options[T]
	mu      sync.RWMutex // guards queue, leaders and closed
	queue   []*waiter[T]
	leaders int
	closed  bool
	slots   chan struct{}  // one per record from Submit until its batch ends: the Queue bound
	wg      sync.WaitGroup // one per leader

	batches, items, failed atomic.Int64
	maxSeen                atomic.Int64
	last                   atomic.Int64 // size of the batch committed last

	sleep func(time.Duration) // time.Sleep; tests replace it to see and time the linger
}

type waiter[T any] struct {
	item T
	err  error
	done chan struct{} // closed once err is set
}

// New returns a Writer.
func New[T any](o Options[T]) (*Writer[T], error) {
	if o.DB == nil {
		return nil, errors.New("journal: Options.DB is nil")
	}
	if o.Insert == nil {
		return nil, errors.New("journal: Options.Insert is nil")
	}
	if o.MaxBatch < 0 || o.Linger < 0 || o.LingerFrom < 0 || o.LingerStep < 0 || o.Workers < 0 || o.CommitTimeout < 0 || o.Queue < 0 {
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
	return &Writer[T]{o: o, slots: make(chan struct{}, o.Queue), sleep: time.Sleep}, nil
}

// Submit queues item and waits until it is durably committed. If ctx ends first, Submit returns ctx's
// error; the record may still commit with its batch.
func (w *Writer[T]) Submit(ctx context.Context, item T) error {
	select {
	case w.slots <- struct{}{}:
	default:
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	wt := &waiter[T]{item: item, done: make(chan struct{})}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.slots
		return ErrClosed
	}
	w.queue = append(w.queue, wt)
	lead := w.leaders < w.o.Workers
	if lead {
		w.leaders++
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if lead {
		if ctx.Done() == nil {
			w.lead(wt)
		} else {
			go w.lead(nil)
		}
	}
	select {
	case <-wt.done:
		return wt.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops taking records, commits everything already queued, and waits for the commits to end.
func (w *Writer[T]) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
	if w.o.OnClose != nil {
		return w.o.OnClose()
	}
	return nil
}

// lead commits queued batches. With self set it returns once self's record has committed, leaving what is
// still queued to a goroutine that goes on leading; it ends its leadership when the queue is empty.
func (w *Writer[T]) lead(self *waiter[T]) {
	selfDone := false
	for {
		if self != nil && !selfDone {
			select {
			case <-self.done: // committed by another leader (Workers > 1)
				selfDone = true
			default:
			}
		}
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.leaders--
			w.mu.Unlock()
			w.wg.Done()
			return
		}
		if selfDone {
			w.mu.Unlock()
			go w.lead(nil) // the leadership (and its wg count) passes on
			return
		}
		if len(w.queue) < w.o.MaxBatch && !w.o.NoYield {
			// Let the goroutines that are ready to run (under load: requests about to submit) reach Submit before
			// the batch is taken. With nothing else runnable this returns at once; otherwise the batch waits for
			// them (BenchmarkJournalRate at 1,000/s alone: p50 about 25 µs more). At peak it turns batches of one
			// record into batches of many, and a commit's WAL writes are paid once per batch rather than once per
			// call (doppel dev at peak: 11-15 calls a batch instead of 1.7, 15-27% less server CPU per call). Yielding
			// only when records arrived during the last commit kept batches near 2 and the cost per call high.
			w.mu.Unlock()
			runtime.Gosched()
			w.mu.Lock()
		}
		batch := w.take(nil)
		w.mu.Unlock()
		if len(batch) == 0 {
			continue // another leader took the queue while this one yielded
		}
		if w.o.Linger > 0 && len(batch) < w.o.MaxBatch && w.last.Load() >= int64(w.o.LingerFrom) {
			batch = w.linger(batch)
		}
		items := make([]T, len(batch))
		for i, wt := range batch {
			items[i] = wt.item
		}
		err := w.commit(items)
		for _, wt := range batch {
			wt.err = err
			close(wt.done)
			<-w.slots
			if wt == self {
				selfDone = true
			}
		}
	}
}

// linger waits for more records to join batch: Linger at most, in LingerSteps, until a step brings none.
func (w *Writer[T]) linger(batch []*waiter[T]) []*waiter[T] {
	step := w.o.LingerStep
	if step <= 0 || step > w.o.Linger {
		step = w.o.Linger
	}
	for waited := time.Duration(0); waited < w.o.Linger && len(batch) < w.o.MaxBatch; waited += step {
		w.sleep(step)
		w.mu.Lock()
		n := len(batch)
		batch = w.take(batch)
		w.mu.Unlock()
		if len(batch) == n {
			break
		}
	}
	return batch
}

// take moves queued records onto batch, up to MaxBatch. w.mu is held.
func (w *Writer[T]) take(batch []*waiter[T]) []*waiter[T] {
	n := min(len(w.queue), w.o.MaxBatch-len(batch))
	batch = append(batch, w.queue[:n]...)
	rest := copy(w.queue, w.queue[n:])
	clear(w.queue[rest:])
	w.queue = w.queue[:rest]
	return batch
}

func (w *Writer[T]) commit(items []T) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.o.CommitTimeout)
	defer cancel()
	began := time.Now()
	var err error
	if w.o.Direct {
		err = w.o.Insert(ctx, w.o.DB, items)
	} else {
		err = w.o.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			return w.o.Insert(ctx, tx, items)
		})
	}
	if w.o.OnCommit != nil {
		w.o.OnCommit(len(items), time.Since(began), err)
	}
	w.batches.Add(1)
	w.items.Add(int64(len(items)))
	w.last.Store(int64(len(items)))
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
