// Package cli holds the client side of doppel's commands: collect, and every verb of GET /api/registry as
// `doppel <group> <verb>` over tRPC (verbs.go).
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/collector"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/ingest/tracefile"
)

// Defaults of CollectOptions.
const (
	DefaultConcurrency      = 2
	DefaultProgressTerminal = 250 * time.Millisecond
	DefaultProgressLog      = 5 * time.Second
	cliUserAgent            = "doppel-cli/1"
)

// CollectOptions configure Collect. Endpoint, Key and Files are required.
type CollectOptions struct {
	// Endpoint is doppel's base URL or the full collect URL (see collector.CollectURL).
	Endpoint string
	// Key is the workspace key.
	Key string
	// Files are read in order; "-" is standard input. Each file is one of tracefile's layouts, streamed (not
	// loaded whole) by tracefile.Reader, as uploads are read by the server:
	//   - a collect body, {"project": …, "traces": [...]};
	//   - a JSON array of traces;
	//   - traces one after another: JSONL (one per line) or concatenated JSON objects.
	// The format is told by the first byte and, for an object, its first field name. Each trace is in any format
	// collect accepts (ingest.Formats: chat messages, OpenAI Responses items, Anthropic Messages), named by its
	// "format" field or detected; chat traces are re-encoded, the others sent as given, tools included.
	Files []string
	// Project names the project of files that do not name one (arrays, JSONL); when set it also
	// replaces the project a collect body names.
	Project string
	// BatchSize is the most traces one POST carries (default 50).
	BatchSize int
	// MaxBatchBytes is the most encoded trace bytes one POST carries (default 4 MiB).
	MaxBatchBytes int
	// Concurrency is how many POSTs are in flight at once (default 2).
	Concurrency int
	// Retries, Backoff and HTTPClient are as in collector.Options (default 2 retries).
	Retries    int
	Backoff    func(retry int) time.Duration
	HTTPClient *http.Client
	// SkipInvalid skips traces that break the collect format (reporting each on Out) instead of
	// stopping at the first.
	SkipInvalid bool
	// Out receives the progress line and the summary; nil means none.
	Out io.Writer
	// ProgressEvery is how often the progress line is written (default 250 ms when Out is a
	// terminal, where the line is rewritten in place, else 5 s, one line each time).
	ProgressEvery time.Duration
	// Stdin is read for "-" (default os.Stdin).
	Stdin io.Reader
}

// CollectResult sums up a Collect run.
type CollectResult struct {
	Files int
	// Traces counts traces the server acknowledged: Accepted new ones plus Duplicates it had.
	Traces, Accepted, Duplicates int64
	// Skipped counts invalid traces skipped (SkipInvalid).
	Skipped int64
	// Bytes counts the acknowledged traces' encoded bytes.
	Bytes   int64
	Batches int64
	// Envs are the environment slugs the server answered, sorted.
	Envs    []string
	Elapsed time.Duration
}

// Collect streams trace files to the collect endpoint in batches, several POSTs in flight, with a
// progress line. It stops at the first trace that breaks the format (unless SkipInvalid) or the
// first batch the server refuses after retries; batches acknowledged before stay stored, and
// running it again is safe: the server counts a trace id once per environment.
func Collect(ctx context.Context, opts CollectOptions) (CollectResult, error) {
	r, err := newRun(opts)
	if err != nil {
		return CollectResult{}, err
	}
	return r.run(ctx)
}

type batch struct {
	project string
	traces  [][]byte
	bytes   int
	first   string // label of its first trace, for errors
	last    string
}

type collectRun struct {
	opts   CollectOptions
	client *collector.Client
	out    io.Writer
	tty    bool
	start  time.Time

	cur     batch
	ids     map[string]bool // trace ids in cur
	jobs    chan *batch
	errOnce sync.Once
	err     error
	cancel  context.CancelFunc

	mu                                                    sync.Mutex // guards envs and writes to out
	envs                                                  map[string]bool
	traces, accepted, duplicates, skipped, bytes, batches atomic.Int64
}

func newRun(opts CollectOptions) (*collectRun, error) {
	u, err := collector.CollectURL(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	if opts.Key == "" {
		return nil, errors.New("collect: a workspace key is required")
	}
	if len(opts.Files) == 0 {
		return nil, errors.New("collect: name at least one file")
	}
	if opts.Project != "" && ingest.Slug(opts.Project) == "" {
		return nil, fmt.Errorf("collect: project %q must hold at least one ASCII letter or digit", opts.Project)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = collector.DefaultBatchSize
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = collector.DefaultMaxBatchBytes
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	switch {
	case opts.Retries == 0:
		opts.Retries = collector.DefaultRetries
	case opts.Retries < 0:
		opts.Retries = 0
	}
	if opts.Stdin == nil {
		opts.Stdin = os.Stdin
	}
	r := &collectRun{
		opts: opts,
		client: &collector.Client{URL: u, Key: opts.Key, Retries: opts.Retries, Backoff: opts.Backoff,
			HTTP: opts.HTTPClient, UserAgent: cliUserAgent},
		out:  opts.Out,
		ids:  map[string]bool{},
		envs: map[string]bool{},
	}
	if r.out == nil {
		r.out = io.Discard
	}
	if f, ok := r.out.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			r.tty = true
		}
	}
	if r.opts.ProgressEvery <= 0 {
		r.opts.ProgressEvery = DefaultProgressLog
		if r.tty {
			r.opts.ProgressEvery = DefaultProgressTerminal
		}
	}
	return r, nil
}

func (r *collectRun) run(ctx context.Context) (CollectResult, error) {
	ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	r.start = time.Now()
	r.jobs = make(chan *batch, r.opts.Concurrency)
	var workers sync.WaitGroup
	for range r.opts.Concurrency {
		workers.Go(func() { r.work(ctx) })
	}
	stopProgress := make(chan struct{})
	var progress sync.WaitGroup
	progress.Go(func() { r.progress(stopProgress) })

	files := 0
	var readErr error
	for _, name := range r.opts.Files {
		if readErr = r.file(ctx, name); readErr != nil {
			break
		}
		files++
	}
	// Whatever was read before an error is sent too: a run stores every valid trace up to where it stopped.
	if ferr := r.flush(ctx); readErr == nil {
		readErr = ferr
	}
	close(r.jobs)
	workers.Wait()
	close(stopProgress)
	progress.Wait()

	res := r.result(files)
	r.line(true)
	// A refused batch stops the reader too: it is then the root cause.
	if r.err != nil {
		return res, r.err
	}
	return res, readErr
}

func (r *collectRun) result(files int) CollectResult {
	r.mu.Lock()
	envs := make([]string, 0, len(r.envs))
	for e := range r.envs {
		envs = append(envs, e)
	}
	r.mu.Unlock()
	slices.Sort(envs)
	return CollectResult{
		Files: files, Traces: r.traces.Load(), Accepted: r.accepted.Load(), Duplicates: r.duplicates.Load(),
		Skipped: r.skipped.Load(), Bytes: r.bytes.Load(), Batches: r.batches.Load(), Envs: envs,
		Elapsed: time.Since(r.start),
	}
}

// fail records the first error and stops the run.
func (r *collectRun) fail(err error) {
	r.errOnce.Do(func() {
		r.err = err
		r.cancel()
	})
}

func (r *collectRun) work(ctx context.Context) {
	for b := range r.jobs {
		if ctx.Err() != nil {
			continue
		}
		body := ingest.AppendBody(make([]byte, 0, b.bytes+len(b.traces)+64+len(b.project)), b.project, b.traces)
		resp, _, err := r.client.Post(ctx, body)
		if err != nil {
			r.fail(fmt.Errorf("collect: batch of %d traces (%s … %s): %w", len(b.traces), b.first, b.last, err))
			continue
		}
		r.batches.Add(1)
		r.traces.Add(int64(len(b.traces)))
		r.accepted.Add(int64(resp.Accepted))
		r.duplicates.Add(int64(resp.Duplicates))
		r.bytes.Add(int64(b.bytes))
		if resp.Env != "" {
			r.mu.Lock()
			r.envs[resp.Env] = true
			r.mu.Unlock()
		}
	}
}

// add puts one encoded trace into the current batch, sending the batch first when the trace
// cannot join it (another project, a full batch, its id already in the batch).
func (r *collectRun) add(ctx context.Context, project, id string, enc []byte, label string) error {
	c := &r.cur
	if len(c.traces) > 0 && (c.project != project || len(c.traces) >= r.opts.BatchSize ||
		c.bytes+len(enc) > r.opts.MaxBatchBytes || r.ids[id]) {
		if err := r.flush(ctx); err != nil {
			return err
		}
	}
	if len(c.traces) == 0 {
		c.project, c.first = project, label
	}
	c.traces = append(c.traces, enc)
	c.bytes += len(enc)
	c.last = label
	r.ids[id] = true
	return nil
}

func (r *collectRun) flush(ctx context.Context) error {
	if len(r.cur.traces) == 0 {
		return nil
	}
	b := r.cur
	r.cur = batch{}
	clear(r.ids)
	select {
	case r.jobs <- &b:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *collectRun) file(ctx context.Context, name string) error {
	var src io.Reader
	if name == "-" {
		src = struct{ io.Reader }{r.opts.Stdin} // read once: a project after the traces must be passed
	} else {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("collect: %w", err)
		}
		defer f.Close()
		src = f
	}
	project := r.opts.Project
	rd, err := tracefile.NewReader(src, tracefile.Options{Name: name, FindProject: project == ""})
	if errors.Is(err, tracefile.ErrProjectLater) {
		return fmt.Errorf("collect: %s: %w; pass the project explicitly", name, err)
	}
	if err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	if project == "" {
		switch rd.Layout() {
		case tracefile.Array:
			return fmt.Errorf("collect: %s is an array of traces and names no project: pass one", name)
		case tracefile.Stream:
			return fmt.Errorf("collect: %s holds bare traces (JSON lines) and names no project: pass one", name)
		}
		if project = rd.Project(); project == "" {
			return fmt.Errorf("collect: %s: the body names no project; pass one", name)
		}
	}
	for {
		t, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("collect: %s: %w", name, err)
		}
		if err := r.trace(ctx, project, t.Raw, name+": "+t.Label); err != nil {
			return err
		}
	}
}

func (r *collectRun) trace(ctx context.Context, project string, raw []byte, label string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, tools, format, err := ingest.DecodeAnyTrace(raw)
	if err != nil {
		if r.opts.SkipInvalid {
			r.skipped.Add(1)
			r.mu.Lock()
			if r.tty {
				fmt.Fprint(r.out, "\r\033[K")
			}
			fmt.Fprintf(r.out, "skipped %s: %v\n", label, err)
			r.mu.Unlock()
			return nil
		}
		return fmt.Errorf("collect: %s: %w", label, err)
	}
	if format == ingest.FormatChat && len(tools) == 0 {
		return r.add(ctx, project, t.ID, ingest.AppendTrace(nil, t), label)
	}
	// Another format, or tools: sent as given, for the server to map and to keep the tools.
	var enc bytes.Buffer
	if err := json.Compact(&enc, raw); err != nil {
		return fmt.Errorf("collect: %s: %w", label, err)
	}
	return r.add(ctx, project, t.ID, enc.Bytes(), label)
}

func (r *collectRun) progress(stop <-chan struct{}) {
	t := time.NewTicker(r.opts.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.line(false)
		}
	}
}

// line writes the progress line; final ends it.
func (r *collectRun) line(final bool) {
	el := time.Since(r.start).Seconds()
	n, by := r.traces.Load(), r.bytes.Load()
	rate, mbps := 0.0, 0.0
	if el > 0 {
		rate, mbps = float64(n)/el, float64(by)/el/1e6
	}
	msg := fmt.Sprintf("collect: %d traces (%d new, %d duplicate", n, r.accepted.Load(), r.duplicates.Load())
	if s := r.skipped.Load(); s > 0 {
		msg += fmt.Sprintf(", %d skipped", s)
	}
	msg += fmt.Sprintf("), %.1f MB, %.0f traces/s, %.1f MB/s", float64(by)/1e6, rate, mbps)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.tty && final:
		fmt.Fprintf(r.out, "\r\033[K%s\n", msg)
	case r.tty:
		fmt.Fprintf(r.out, "\r\033[K%s", msg)
	default:
		fmt.Fprintln(r.out, msg)
	}
}
