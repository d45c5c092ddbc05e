// Package cli holds the client side of doppel's commands: collect, and every verb of GET /api/registry as
// `doppel <group> <verb>` over tRPC (verbs.go).
package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/collector"
	"github.com/doppel-dev/doppel/ingest"
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
	// Files are read in order; "-" is standard input. Each file is one of:
	//   - a collect body, {"project": …, "traces": [...]} (the traces are streamed, not loaded whole);
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

// errProjectLater reports a collect body whose project comes after its traces.
var errProjectLater = errors.New("the project field comes after the traces")

func (r *collectRun) file(ctx context.Context, name string) error {
	var src io.Reader
	var seeker io.ReadSeeker
	if name == "-" {
		src = r.opts.Stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("collect: %w", err)
		}
		defer f.Close()
		src, seeker = f, f
	}
	br := bufio.NewReaderSize(src, 1<<20)
	kind, err := sniff(br, name)
	if err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	switch kind {
	case kindArray:
		return r.array(ctx, name, br)
	case kindStream:
		return r.stream(ctx, name, br)
	}
	project := r.opts.Project
	err = r.body(ctx, name, br, project)
	if !errors.Is(err, errProjectLater) {
		return err
	}
	if seeker == nil {
		return fmt.Errorf("collect: %s: %w; pass the project explicitly", name, err)
	}
	// Find the project first, then read the file again.
	if _, err := seeker.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	if project, err = findProject(bufio.NewReaderSize(seeker, 1<<20)); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	if _, err := seeker.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	br.Reset(seeker)
	if _, err := sniff(br, name); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	return r.body(ctx, name, br, project)
}

const (
	kindBody = iota
	kindArray
	kindStream
)

// sniff tells a file's format from its first bytes (skipping a UTF-8 byte order mark).
func sniff(br *bufio.Reader, name string) (int, error) {
	if b, err := br.Peek(3); err == nil && string(b) == "\xef\xbb\xbf" {
		br.Discard(3)
	}
	for n := 64; ; n = min(n*4, br.Size()) {
		b, err := br.Peek(n)
		if rest := bytes.TrimLeft(b, " \t\r\n"); len(rest) > 0 {
			switch rest[0] {
			case '[':
				return kindArray, nil
			case '{':
				if ext := strings.ToLower(filepath.Ext(name)); ext == ".jsonl" || ext == ".ndjson" {
					return kindStream, nil
				}
				key, ok := firstKey(rest[1:])
				if ok && (key == "project" || key == "traces") {
					return kindBody, nil
				}
				if ok || err != nil || n == br.Size() {
					return kindStream, nil // the stream reader reports what is wrong, if anything
				}
				continue
			default:
				return 0, fmt.Errorf("not JSON: starts with %q (want a collect body, an array of traces or JSONL)", rest[0])
			}
		}
		if errors.Is(err, io.EOF) {
			return 0, errors.New("the file is empty")
		}
		if err != nil {
			return 0, err
		}
		if n == br.Size() {
			return 0, errors.New("no JSON value in the first megabyte")
		}
	}
}

// firstKey reads the first field name of an object from b (just after its '{').
func firstKey(b []byte) (string, bool) {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '"' {
		return "", len(b) > 0
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 {
		return "", false
	}
	return string(b[1 : 1+end]), true
}

// body streams a collect body's traces; the project given wins over the body's own.
func (r *collectRun) body(ctx context.Context, name string, br *bufio.Reader, project string) error {
	dec := json.NewDecoder(br)
	if err := expectDelim(dec, '{'); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("collect: %s: %w", name, err)
		}
		switch key, _ := tok.(string); key {
		case "project":
			var p string
			if err := dec.Decode(&p); err != nil {
				return fmt.Errorf("collect: %s: project: %w", name, err)
			}
			if project == "" {
				project = p
			}
		case "traces":
			if project == "" {
				return errProjectLater
			}
			if err := r.traceArray(ctx, name, dec, project, "traces"); err != nil {
				return err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return fmt.Errorf("collect: %s: %s: %w", name, key, err)
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return fmt.Errorf("collect: %s: %w", name, err)
	}
	if project == "" {
		return fmt.Errorf("collect: %s: the body names no project; pass one", name)
	}
	return nil
}

func (r *collectRun) array(ctx context.Context, name string, br *bufio.Reader) error {
	if r.opts.Project == "" {
		return fmt.Errorf("collect: %s is an array of traces and names no project: pass one", name)
	}
	dec := json.NewDecoder(br)
	return r.traceArray(ctx, name, dec, r.opts.Project, "")
}

// traceArray reads an array of traces from dec, starting at its '['.
func (r *collectRun) traceArray(ctx context.Context, name string, dec *json.Decoder, project, field string) error {
	if err := expectDelim(dec, '['); err != nil {
		return fmt.Errorf("collect: %s: %s: %w", name, field, err)
	}
	for i := 0; dec.More(); i++ {
		label := fmt.Sprintf("%s: %s[%d]", name, field, i)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("collect: %s: %w", label, err)
		}
		if err := r.trace(ctx, project, raw, label); err != nil {
			return err
		}
	}
	if err := expectDelim(dec, ']'); err != nil {
		return fmt.Errorf("collect: %s: %s: %w", name, field, err)
	}
	return nil
}

// stream reads traces given one after another (JSONL, or concatenated objects).
func (r *collectRun) stream(ctx context.Context, name string, br *bufio.Reader) error {
	if r.opts.Project == "" {
		return fmt.Errorf("collect: %s holds bare traces (JSON lines) and names no project: pass one", name)
	}
	dec := json.NewDecoder(br)
	for i := 1; ; i++ {
		at := dec.InputOffset()
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return nil
		}
		label := fmt.Sprintf("%s: trace #%d (byte %d)", name, i, at)
		if err != nil {
			return fmt.Errorf("collect: %s: %w", label, err)
		}
		if err := r.trace(ctx, r.opts.Project, raw, label); err != nil {
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

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, found %v", string(want), tok)
	}
	return nil
}

// findProject reads a collect body's top-level project field, stepping over other fields token by
// token so that a large traces array is not held in memory.
func findProject(br *bufio.Reader) (string, error) {
	dec := json.NewDecoder(br)
	if err := expectDelim(dec, '{'); err != nil {
		return "", err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		if tok == "project" {
			var p string
			if err := dec.Decode(&p); err != nil {
				return "", fmt.Errorf("project: %w", err)
			}
			return p, nil
		}
		if err := skipValue(dec); err != nil {
			return "", err
		}
	}
	return "", errors.New("the body names no project; pass one")
}

func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
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
