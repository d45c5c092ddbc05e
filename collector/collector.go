// Package collector batches an agent's traces and posts them to doppel's collect endpoint (spec §8 defaults).
package collector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/trace"
)

// Defaults of Options.
const (
	DefaultBatchSize     = 50
	DefaultFlushInterval = 2 * time.Second
	DefaultMaxBatchBytes = 4 << 20
	DefaultMaxQueue      = 10000
)

// Errors Add answers.
var (
	ErrClosed    = errors.New("collector: closed")
	ErrQueueFull = errors.New("collector: queue full, trace dropped")
)

// Options configure a Collector. Only Endpoint, Key and Project are required.
type Options struct {
	// Endpoint is doppel's base URL (http://localhost:8080) or the full collect URL.
	Endpoint string
	// Key is the workspace key (mk_live_…).
	Key string
	// Project names the agent; its traces become the environment with the project's slug.
	Project string
	// BatchSize is the most traces one POST carries (default 50).
	BatchSize int
	// MaxBatchBytes is the most encoded trace bytes one POST carries (default 4 MiB); a batch holds
	// at least one trace whatever its size.
	MaxBatchBytes int
	// FlushInterval is how often buffered traces are sent even when no batch is full (default 2 s).
	FlushInterval time.Duration
	// Retries is how often a failed POST is tried again before its traces are dropped
	// (default 2; negative means none). See Client for what is retried.
	Retries int
	// Backoff gives the wait before retry n; nil means DefaultBackoff.
	Backoff func(retry int) time.Duration
	// HTTPClient sends the POSTs; nil means a client with a 30 s timeout.
	HTTPClient *http.Client
	// MaxQueue is the most traces held unsent; Add drops (and counts) traces beyond it (default 10,000).
	MaxQueue int
	// UserAgent and Header go with every POST (User-Agent defaults to DefaultUserAgent); the server
	// reads X-Doppel-Framework and X-Doppel-Language headers as the agent's framework and language.
	UserAgent string
	Header    http.Header
	// OnDrop, when set, is called (from the sending goroutine) with the number of traces dropped
	// and why.
	OnDrop func(n int, err error)
}

// Stats count what a Collector did. Traces are counted, not batches, except Retried.
type Stats struct {
	// Sent counts traces the server acknowledged: Accepted new ones plus Duplicates it already had.
	Sent, Accepted, Duplicates int64
	// Dropped counts traces given up: queue full, a permanent rejection, retries exhausted, or
	// still unsent when Close's context ended.
	Dropped int64
	// Invalid counts traces Add refused because they break the collect format.
	Invalid int64
	// Retried counts POSTs sent again after a failure.
	Retried int64
	// Batches counts acknowledged POSTs.
	Batches int64
}

// Collector buffers traces and posts them in batches from one background goroutine.
// Its methods are safe for concurrent use.
type Collector struct {
	opts   Options
	client *Client

	mu     sync.Mutex
	queue  [][]byte // encoded traces, oldest first
	closed bool

	kick   chan struct{}
	flush  chan chan error
	stop   chan struct{}
	done   chan struct{}
	ctx    context.Context // ends when Close gives up: in-flight posts and waits abort
	cancel context.CancelFunc

	closeOnce                                                      sync.Once
	sent, accepted, duplicates, dropped, invalid, retried, batches atomic.Int64
}

// New checks opts, fills defaults and starts the sending goroutine; Close stops it.
func New(opts Options) (*Collector, error) {
	u, err := CollectURL(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	if opts.Key == "" {
		return nil, errors.New("collector: Key is required")
	}
	if ingest.Slug(opts.Project) == "" {
		return nil, fmt.Errorf("collector: Project %q must hold at least one ASCII letter or digit", opts.Project)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	switch {
	case opts.Retries == 0:
		opts.Retries = DefaultRetries
	case opts.Retries < 0:
		opts.Retries = 0
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = DefaultMaxQueue
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{
		opts: opts,
		client: &Client{URL: u, Key: opts.Key, Retries: opts.Retries, Backoff: opts.Backoff,
			HTTP: opts.HTTPClient, UserAgent: opts.UserAgent, Header: opts.Header},
		kick:   make(chan struct{}, 1),
		flush:  make(chan chan error),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
	go c.run()
	return c, nil
}

// Add queues a trace. It answers an *ingest.Error when the trace breaks the collect format (so one
// bad trace never costs a whole batch), ErrQueueFull when MaxQueue traces wait already, and
// ErrClosed after Close. The trace is encoded at once: the caller may reuse it.
func (c *Collector) Add(t trace.Trace) error {
	if err := ingest.ValidateTrace(&t); err != nil {
		c.invalid.Add(1)
		return err
	}
	return c.enqueue(ingest.AppendTrace(nil, &t))
}

// enqueue queues an encoded trace.
func (c *Collector) enqueue(enc []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if len(c.queue) >= c.opts.MaxQueue {
		c.dropped.Add(1)
		return ErrQueueFull
	}
	c.queue = append(c.queue, enc)
	if len(c.queue) >= c.opts.BatchSize {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// AddRaw queues a trace given as JSON in any format collect accepts (ingest.Formats): the chat format, the OpenAI
// Responses API's items ({id, instructions, input, output, tools}) or Anthropic Messages ({id, system, messages,
// tools}), its format named in a "format" field or detected. It is checked as the server will map it
// (ingest.DecodeAnyTrace: an *ingest.Error when it breaks the format) and sent as given, tools and all; the server
// maps it to the chat format and joins its tools to the build inputs. ErrQueueFull and ErrClosed are as for Add.
func (c *Collector) AddRaw(raw json.RawMessage) error {
	if _, _, _, err := ingest.DecodeAnyTrace(raw); err != nil {
		c.invalid.Add(1)
		return err
	}
	var enc bytes.Buffer
	if err := json.Compact(&enc, raw); err != nil { // DecodeAnyTrace read it as JSON: this cannot fail
		c.invalid.Add(1)
		return err
	}
	return c.enqueue(enc.Bytes())
}

// Flush sends every trace queued before it and waits until each is acknowledged or dropped.
// It answers the last send error when traces were dropped, or ctx's error if ctx ends first.
func (c *Collector) Flush(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case c.flush <- reply:
	case <-c.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops taking traces, sends what is queued and stops the goroutine. When ctx ends first,
// in-flight and queued traces are dropped (and counted) and ctx's error is answered.
// Close may be called more than once.
func (c *Collector) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.stop)
	})
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		c.cancel()
		<-c.done
		return ctx.Err()
	}
}

// Stats answers the counters so far.
func (c *Collector) Stats() Stats {
	return Stats{
		Sent: c.sent.Load(), Accepted: c.accepted.Load(), Duplicates: c.duplicates.Load(),
		Dropped: c.dropped.Load(), Invalid: c.invalid.Load(), Retried: c.retried.Load(), Batches: c.batches.Load(),
	}
}

func (c *Collector) run() {
	defer close(c.done)
	defer c.cancel()
	tick := time.NewTicker(c.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.kick:
			c.send(true)
		case <-tick.C:
			c.send(false)
		case reply := <-c.flush:
			reply <- c.send(false)
		case <-c.stop:
			c.send(false)
			return
		}
	}
}

// send posts queued traces in batches: only full batches when fullOnly, else all of them.
// It answers the last error of a batch that was dropped.
func (c *Collector) send(fullOnly bool) error {
	var last error
	for {
		batch := c.take(fullOnly)
		if batch == nil {
			return last
		}
		if err := c.post(batch); err != nil {
			last = err
		}
	}
}

// take removes the next batch from the queue, or answers nil.
func (c *Collector) take(fullOnly bool) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 || fullOnly && len(c.queue) < c.opts.BatchSize {
		return nil
	}
	n, size := 0, 0
	for n < len(c.queue) && n < c.opts.BatchSize {
		if n > 0 && size+len(c.queue[n]) > c.opts.MaxBatchBytes {
			break
		}
		size += len(c.queue[n])
		n++
	}
	batch := c.queue[:n:n]
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return batch
}

func (c *Collector) post(batch [][]byte) error {
	if err := c.ctx.Err(); err != nil {
		c.drop(len(batch), fmt.Errorf("collector: closing: %w", err))
		return err
	}
	body := ingest.AppendBody(nil, c.opts.Project, batch)
	resp, retries, err := c.client.Post(c.ctx, body)
	c.retried.Add(int64(retries))
	if err != nil {
		c.drop(len(batch), err)
		return err
	}
	c.batches.Add(1)
	c.sent.Add(int64(len(batch)))
	c.accepted.Add(int64(resp.Accepted))
	c.duplicates.Add(int64(resp.Duplicates))
	return nil
}

func (c *Collector) drop(n int, err error) {
	c.dropped.Add(int64(n))
	if c.opts.OnDrop != nil {
		c.opts.OnDrop(n, err)
	}
}
