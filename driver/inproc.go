package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/doppel-dev/doppel/internal/osmem"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// InprocDriverName is Handle.Driver of twins run inside this process.
const InprocDriverName = "inproc"

// InprocOptions configures the in-process driver.
type InprocOptions struct {
	// Load builds the runtime of a bundle (e.g. rpc.BundleBytes). Required.
	Load func(ctx context.Context, bundle []byte) (rpc.Runtime, error)
	// Blobs resolves Spec.BundleKey.
	Blobs BlobGetter
	Owner string
	// ReadyTimeout bounds Start's wait for ready (zero: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	Logger       *slog.Logger
	// Memory, when set, is told each time a twin drops a session's world, so mass closes give the memory back to
	// the OS (rate-limited; one Returner for the whole process).
	Memory *osmem.Returner
}

// Inproc runs each twin as a twin/rpc server on a loopback port of this process: the same RPC as a real twin,
// without a process per twin. Callers in this process reach its twins' sessions directly, without HTTP
// (rpc.Dial with the driver as its Locals). Its twins end with the process; handles do not survive a
// restart. They share the process's memory: twin.memory_bytes does not bound them.
type Inproc struct {
	opts  InprocOptions
	probe *http.Client

	mu    sync.Mutex
	twins map[string]*inprocTwin
}

type inprocTwin struct {
	h      Handle
	srv    *rpc.Server
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

var (
	_ Driver     = (*Inproc)(nil)
	_ rpc.Locals = (*Inproc)(nil)
)

// NewInproc returns an in-process driver.
func NewInproc(opts InprocOptions) (*Inproc, error) {
	if opts.Load == nil {
		return nil, errors.New("driver: inproc: Load is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Inproc{opts: opts, probe: newProbeClient(), twins: map[string]*inprocTwin{}}, nil
}

// Start serves the bundle on a loopback port and waits until it is ready.
func (d *Inproc) Start(ctx context.Context, spec Spec) (Handle, error) {
	if err := spec.Validate(); err != nil {
		return Handle{}, err
	}
	data, err := readBundle(ctx, spec, d.opts.Blobs)
	if err != nil {
		return Handle{}, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &inprocTwin{cancel: cancel, done: make(chan struct{}),
		srv: rpc.NewServer(rpc.ServerOptions{Logger: d.opts.Logger, Memory: d.opts.Memory})}
	listening := make(chan string, 1)
	go func() {
		t.err = rpc.Serve(sctx, rpc.ServeOptions{
			Server:   t.srv,
			Listen:   "127.0.0.1:0",
			Load:     func(ctx context.Context) (rpc.Runtime, error) { return d.opts.Load(ctx, data) },
			OnListen: func(addr string) { listening <- addr },
			Logger:   d.opts.Logger,
		})
		if t.err == nil {
			t.err = errors.New("stopped")
		}
		close(t.done)
	}()
	var addr string
	select {
	case addr = <-listening:
	case <-t.done:
		cancel()
		return Handle{}, fmt.Errorf("%w: %w", ErrNotReady, t.err)
	}
	t.h = Handle{Driver: InprocDriverName, ID: "inproc-" + nameSafe(spec.EnvID) + "-" + randomHex(6), EnvID: spec.EnvID,
		BuildID: spec.BuildID, Owner: d.opts.Owner, Addr: "http://" + addr, StartedAt: time.Now().UTC()}
	died := func() error {
		select {
		case <-t.done:
			return t.err
		default:
			return nil
		}
	}
	if err := waitReady(ctx, d.probe, t.h.Addr, d.opts.ReadyTimeout, died); err != nil {
		cancel()
		<-t.done
		return Handle{}, err
	}
	if err := checkBundle(ctx, d.probe, t.h.Addr, spec.BundleHash); err != nil {
		cancel()
		<-t.done
		return Handle{}, err
	}
	d.mu.Lock()
	d.twins[t.h.ID] = t
	d.mu.Unlock()
	return t.h, nil
}

// Inspect reports the twin's state.
func (d *Inproc) Inspect(ctx context.Context, h Handle) (Status, error) {
	d.mu.Lock()
	t := d.twins[h.ID]
	d.mu.Unlock()
	if t == nil {
		return Status{State: StateGone, Detail: "no in-process twin " + h.ID}, nil
	}
	select {
	case <-t.done:
		return Status{State: StateExited, Detail: t.err.Error()}, nil
	default:
	}
	return inspectReady(ctx, d.probe, t.h.Addr), nil
}

// Local returns the server of the running twin at baseURL (a Handle's Addr), for direct calls from this process.
func (d *Inproc) Local(baseURL string) (*rpc.Server, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.twins {
		if t.h.Addr == baseURL {
			select {
			case <-t.done:
				return nil, false
			default:
				return t.srv, true
			}
		}
	}
	return nil, false
}

// Stop shuts the twin's server down.
func (d *Inproc) Stop(ctx context.Context, h Handle) error {
	d.mu.Lock()
	t := d.twins[h.ID]
	delete(d.twins, h.ID)
	d.mu.Unlock()
	if t == nil {
		return nil
	}
	t.cancel()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("driver: inproc: stop %s: %w", h.ID, ctx.Err())
	}
}

// List returns the running twins, oldest first.
func (d *Inproc) List(ctx context.Context) ([]Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Handle, 0, len(d.twins))
	for _, t := range d.twins {
		select {
		case <-t.done:
			continue
		default:
			out = append(out, t.h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}
