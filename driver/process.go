package driver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/doppel-dev/doppel/internal/atomicfile"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// ProcessDriverName is Handle.Driver of twins run as child processes.
const ProcessDriverName = "process"

// ProcessOptions configures the process driver.
type ProcessOptions struct {
	// Binary is the doppel binary to run as "BINARY twin --listen 127.0.0.1:0 --bundle FILE"; empty means this
	// executable.
	Binary string
	// StateDir holds one record and one log per twin (twins/) and fetched bundles (bundles/). Required. A driver
	// given the same StateDir after a restart finds, inspects, stops and reconciles the twins an earlier one started.
	StateDir string
	// Owner is recorded in handles.
	Owner string
	// Blobs resolves Spec.BundleKey.
	Blobs BlobGetter
	// Env is the twins' environment; nil means this process's.
	Env []string
	// ReadyTimeout bounds Start's wait for ready (zero: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL (zero: 3s).
	StopTimeout time.Duration
	Logger      *slog.Logger
}

// Process runs twins as child processes of the doppel binary's twin subcommand.
type Process struct {
	opts  ProcessOptions
	probe *http.Client
	log   *slog.Logger

	mu       sync.Mutex
	children map[string]*child
}

// child is a twin this driver instance started, reaped by its Wait goroutine.
type child struct {
	done chan struct{}
	err  error
}

// procRecord is a twin's record under StateDir/twins: what a later driver needs to find it again.
type procRecord struct {
	Handle Handle `json:"handle"`
	// StartTicks is the process's start time in clock ticks since boot (Linux /proc), telling it from a later
	// process that reuses its pid. Empty where /proc is not available.
	StartTicks string `json:"start_ticks,omitempty"`
}

var (
	_ Driver     = (*Process)(nil)
	_ Reconciler = (*Process)(nil)
)

// NewProcess returns a process driver, creating its state directories.
func NewProcess(opts ProcessOptions) (*Process, error) {
	if opts.StateDir == "" {
		return nil, errors.New("driver: process: StateDir is required")
	}
	if opts.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("driver: process: find this executable: %w", err)
		}
		opts.Binary = exe
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("driver: process: binary: %w", err)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 3 * time.Second
	}
	for _, d := range []string{"twins", "bundles"} {
		if err := os.MkdirAll(filepath.Join(opts.StateDir, d), 0o755); err != nil {
			return nil, fmt.Errorf("driver: process: state dir: %w", err)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Process{opts: opts, probe: newProbeClient(), log: log, children: map[string]*child{}}, nil
}

func (p *Process) recordPath(id string) string {
	return filepath.Join(p.opts.StateDir, "twins", id+".json")
}
func (p *Process) logPath(id string) string {
	return filepath.Join(p.opts.StateDir, "twins", id+".log")
}

// Start launches a twin and waits until it is ready.
func (p *Process) Start(ctx context.Context, spec Spec) (Handle, error) {
	if err := spec.Validate(); err != nil {
		return Handle{}, err
	}
	bundle, err := p.bundleFile(ctx, spec)
	if err != nil {
		return Handle{}, err
	}
	id := "twin-" + nameSafe(spec.EnvID) + "-" + randomHex(6)
	logf, err := os.OpenFile(p.logPath(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Handle{}, fmt.Errorf("driver: process: twin log: %w", err)
	}
	cmd := exec.Command(p.opts.Binary, "twin", "--listen", "127.0.0.1:0", "--bundle", bundle)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = p.opts.Env
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		_ = os.Remove(p.logPath(id))
		return Handle{}, fmt.Errorf("driver: process: start %s twin: %w", p.opts.Binary, err)
	}
	c := &child{done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		if c.err == nil {
			c.err = errors.New("exited with status 0")
		}
		close(c.done)
	}()
	p.mu.Lock()
	p.children[id] = c
	p.mu.Unlock()

	h := Handle{Driver: ProcessDriverName, ID: id, EnvID: spec.EnvID, BuildID: spec.BuildID, Owner: p.opts.Owner,
		PID: cmd.Process.Pid, StartedAt: time.Now().UTC()}
	rec := procRecord{Handle: h, StartTicks: procStartTicks(h.PID)}
	fail := func(err error) (Handle, error) {
		tail := p.logTail(id)
		_ = p.Stop(context.WithoutCancel(ctx), h)
		if tail != "" {
			err = fmt.Errorf("%w\ntwin log:\n%s", err, tail)
		}
		return Handle{}, err
	}
	if err := p.writeRecord(rec); err != nil {
		return fail(err)
	}
	died := func() error {
		select {
		case <-c.done:
			return fmt.Errorf("twin process %d %v", h.PID, c.err)
		default:
			return nil
		}
	}
	addr, err := p.awaitAddr(ctx, id, died)
	if err != nil {
		return fail(err)
	}
	h.Addr = "http://" + addr
	rec.Handle = h
	if err := p.writeRecord(rec); err != nil {
		return fail(err)
	}
	if err := waitReady(ctx, p.probe, h.Addr, p.opts.ReadyTimeout, died); err != nil {
		return fail(err)
	}
	if err := checkBundle(ctx, p.probe, h.Addr, spec.BundleHash); err != nil {
		return fail(err)
	}
	p.log.Info("twin started", "driver", ProcessDriverName, "id", id, "env", spec.EnvID, "build", spec.BuildID, "pid", h.PID, "addr", h.Addr)
	return h, nil
}

// bundleFile returns a local path of the spec's bundle, fetching it from the blob store into StateDir/bundles once.
func (p *Process) bundleFile(ctx context.Context, spec Spec) (string, error) {
	if spec.BundlePath != "" {
		abs, err := filepath.Abs(spec.BundlePath)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrBundle, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%w: %w", ErrBundle, err)
		}
		return abs, nil
	}
	sum := sha256.Sum256([]byte(spec.BundleKey))
	path := filepath.Join(p.opts.StateDir, "bundles", hex.EncodeToString(sum[:16])+".bundle")
	if _, err := os.Stat(path); err == nil {
		return path, nil // keys name immutable bundles
	}
	data, err := readBundle(ctx, spec, p.opts.Blobs)
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(path, data); err != nil {
		return "", fmt.Errorf("%w: cache %s: %w", ErrBundle, spec.BundleKey, err)
	}
	return path, nil
}

// awaitAddr reads the twin's log until its "listening on HOST:PORT" line appears.
func (p *Process) awaitAddr(ctx context.Context, id string, died func() error) (string, error) {
	timeout := p.opts.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := time.Millisecond
	for {
		if addr := scanAddr(p.logPath(id)); addr != "" {
			return addr, nil
		}
		if err := died(); err != nil {
			// It may have announced just before dying.
			if addr := scanAddr(p.logPath(id)); addr != "" {
				return addr, nil
			}
			return "", fmt.Errorf("%w: %w before announcing its address", ErrNotReady, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("%w: no %q line in the twin's output within %v", ErrNotReady, rpc.ListenPrefix, timeout)
		case <-t.C:
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

func scanAddr(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), rpc.ListenPrefix); ok {
			return strings.TrimSpace(a)
		}
	}
	return ""
}

// logTail returns the last lines of a twin's log, for error messages.
func (p *Process) logTail(id string) string {
	b, err := os.ReadFile(p.logPath(id))
	if err != nil {
		return ""
	}
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Inspect reports whether the twin's process lives and answers ready.
func (p *Process) Inspect(ctx context.Context, h Handle) (Status, error) {
	if h.Driver != ProcessDriverName {
		return foreignHandle(h, ProcessDriverName), nil
	}
	p.mu.Lock()
	c := p.children[h.ID]
	p.mu.Unlock()
	if c != nil {
		select {
		case <-c.done:
			return Status{State: StateExited, Detail: fmt.Sprintf("process %d %v", h.PID, c.err)}, nil
		default:
		}
	}
	rec, err := p.readRecord(h.ID)
	if errors.Is(err, os.ErrNotExist) {
		return Status{State: StateGone, Detail: "no record of twin " + h.ID}, nil
	}
	if err != nil {
		return Status{}, err
	}
	if !alive(rec.Handle.PID, rec.StartTicks) {
		return Status{State: StateExited, Detail: fmt.Sprintf("process %d is gone", rec.Handle.PID)}, nil
	}
	if rec.Handle.Addr == "" {
		return Status{State: StateStarting, Detail: "not listening yet"}, nil
	}
	return inspectReady(ctx, p.probe, rec.Handle.Addr), nil
}

// Stop ends the twin (SIGTERM, then SIGKILL after StopTimeout) and removes its record and log.
func (p *Process) Stop(ctx context.Context, h Handle) error {
	if h.Driver != ProcessDriverName {
		return fmt.Errorf("process: handle of driver %q: %w", h.Driver, ErrForeignHandle)
	}
	p.mu.Lock()
	c := p.children[h.ID]
	p.mu.Unlock()
	ticks := ""
	rec, err := p.readRecord(h.ID)
	switch {
	case err == nil:
		ticks = rec.StartTicks
		h.PID = rec.Handle.PID
	case c == nil:
		// No record and not our child: it was stopped already; never signal a pid we cannot vouch for.
		h.PID = 0
	}
	exited := func() bool {
		if c != nil {
			select {
			case <-c.done:
				return true
			default:
				return false
			}
		}
		return !alive(h.PID, ticks)
	}
	if h.PID > 0 && !exited() {
		_ = syscall.Kill(h.PID, syscall.SIGTERM)
		deadline := time.Now().Add(p.opts.StopTimeout)
		for !exited() && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		if !exited() {
			_ = syscall.Kill(h.PID, syscall.SIGKILL)
			for i := 0; i < 200 && !exited(); i++ {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if !exited() {
			return fmt.Errorf("driver: process: twin %s (pid %d) survived SIGKILL", h.ID, h.PID)
		}
	}
	p.mu.Lock()
	delete(p.children, h.ID)
	p.mu.Unlock()
	for _, f := range []string{p.recordPath(h.ID), p.logPath(h.ID)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("driver: process: remove %s: %w", f, err)
		}
	}
	return nil
}

// List returns the twins recorded under StateDir whose process is alive.
func (p *Process) List(ctx context.Context) ([]Handle, error) {
	recs, err := p.records()
	if err != nil {
		return nil, err
	}
	var out []Handle
	for _, r := range recs {
		if alive(r.Handle.PID, r.StartTicks) {
			out = append(out, r.Handle)
		}
	}
	return out, nil
}

// Reconcile stops live twins keep rejects (older than grace) and clears the records of dead ones.
func (p *Process) Reconcile(ctx context.Context, keep func(Handle) bool, grace time.Duration) ([]Handle, error) {
	recs, err := p.records()
	if err != nil {
		return nil, err
	}
	var removed []Handle
	var errs []error
	for _, r := range recs {
		live := alive(r.Handle.PID, r.StartTicks)
		if live && ((keep != nil && keep(r.Handle)) || time.Since(r.Handle.StartedAt) < grace) {
			continue
		}
		if err := p.Stop(ctx, r.Handle); err != nil {
			errs = append(errs, err)
			continue
		}
		if live {
			p.log.Info("reaped twin", "driver", ProcessDriverName, "id", r.Handle.ID, "env", r.Handle.EnvID, "pid", r.Handle.PID)
		}
		removed = append(removed, r.Handle)
	}
	return removed, errors.Join(errs...)
}

func (p *Process) records() ([]procRecord, error) {
	ents, err := os.ReadDir(filepath.Join(p.opts.StateDir, "twins"))
	if err != nil {
		return nil, fmt.Errorf("driver: process: list twins: %w", err)
	}
	var out []procRecord
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(id, ".") {
			continue
		}
		r, err := p.readRecord(id)
		if errors.Is(err, os.ErrNotExist) {
			continue // stopped meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (p *Process) readRecord(id string) (procRecord, error) {
	b, err := os.ReadFile(p.recordPath(id))
	if err != nil {
		return procRecord{}, err
	}
	var r procRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return procRecord{}, fmt.Errorf("driver: process: record %s: %w", id, err)
	}
	return r, nil
}

func (p *Process) writeRecord(r procRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(p.recordPath(r.Handle.ID), b); err != nil {
		return fmt.Errorf("driver: process: record %s: %w", r.Handle.ID, err)
	}
	return nil
}

// alive reports whether pid is a live (not zombie) process started at ticks (when known).
func alive(pid int, ticks string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ticks == "" // no /proc: trust the signal
	}
	fields := statFields(stat)
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return false
	}
	return ticks == "" || fields[19] == ticks
}

// procStartTicks returns the start time of pid from /proc, or "".
func procStartTicks(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	if f := statFields(stat); len(f) >= 20 {
		return f[19]
	}
	return ""
}

// statFields splits /proc/PID/stat after the command name: field 3 (state) first, field 22 (starttime) at 19.
func statFields(stat []byte) []string {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
