// Package driver starts, inspects, stops and lists twins: as Docker containers, child processes, or in this process.
package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// Driver runs twins. Start returns once the twin answers ready (or fails and leaves nothing running). Stop is
// idempotent: stopping a twin that is gone succeeds. List returns the twins this driver's owner runs, alive ones
// only. A Handle is plain data: it survives a restart of the caller, and a new Driver with the same options can
// Inspect and Stop twins an earlier one started.
type Driver interface {
	Start(ctx context.Context, spec Spec) (Handle, error)
	Inspect(ctx context.Context, h Handle) (Status, error)
	Stop(ctx context.Context, h Handle) error
	List(ctx context.Context) ([]Handle, error)
}

// Reconciler is the optional ability to remove twins nobody owns: every twin of this driver's owner that keep
// rejects is stopped and removed, as is anything a dead twin left behind. Twins younger than grace are kept (a
// Start may still be returning their handle). It returns the twins it removed.
type Reconciler interface {
	Reconcile(ctx context.Context, keep func(Handle) bool, grace time.Duration) ([]Handle, error)
}

// Spec names the twin to start: its environment and build, and where its bundle is.
type Spec struct {
	EnvID   string `json:"env_id"`
	BuildID string `json:"build_id"`
	// BundleKey is the bundle's key in the blob store the driver was given; or BundlePath a local file. One of the two.
	BundleKey  string `json:"bundle_key,omitempty"`
	BundlePath string `json:"bundle_path,omitempty"`
	// BundleHash, when set, is checked against the hash the ready twin reports; a mismatch fails Start.
	BundleHash string `json:"bundle_hash,omitempty"`
}

// SpecError is a Spec with a bad field.
type SpecError struct {
	Field   string
	Problem string
}

func (e *SpecError) Error() string { return "driver: spec " + e.Field + ": " + e.Problem }

// Validate reports the first bad field of s as a *SpecError.
func (s Spec) Validate() error {
	switch {
	case s.EnvID == "":
		return &SpecError{"env_id", "required"}
	case s.BuildID == "":
		return &SpecError{"build_id", "required"}
	case s.BundleKey == "" && s.BundlePath == "":
		return &SpecError{"bundle_key or bundle_path", "one is required"}
	case s.BundleKey != "" && s.BundlePath != "":
		return &SpecError{"bundle_key and bundle_path", "give only one"}
	}
	return nil
}

// Handle identifies a started twin (twinstate's, so the TwinWorkflow keeps handles without importing drivers).
// Addr is the base URL of its RPC (rpc.NewClient(h.Addr, …)).
type Handle = twinstate.Handle

// State is what Inspect found (twinstate.Health).
type State = twinstate.Health

// States of a twin.
const (
	StateStarting  = twinstate.Starting
	StateReady     = twinstate.Healthy
	StateUnhealthy = twinstate.Unhealthy
	StateExited    = twinstate.Exited
	StateGone      = twinstate.Gone
)

// Status is a twin's state as Inspect found it.
type Status struct {
	State  State  `json:"state"`
	Detail string `json:"detail,omitempty"`
}

// Running reports whether the twin's process or container is alive, ready or not.
func (s Status) Running() bool {
	return s.State == StateStarting || s.State == StateReady || s.State == StateUnhealthy
}

// foreignHandle is what a driver's Inspect reports of a handle another driver made (the deployment's twin.driver
// changed since): gone, as far as this driver can reach, so its owner starts the twin again under this driver.
func foreignHandle(h Handle, driver string) Status {
	return Status{State: StateGone, Detail: fmt.Sprintf("twin %s was started by the %s driver; this worker runs the %s driver", h.ID, h.Driver, driver)}
}

// BlobGetter reads a bundle from the blob store (blob.Store has it).
type BlobGetter interface {
	Get(ctx context.Context, key string) (io.ReadCloser, error)
}

// Errors drivers wrap.
var (
	// ErrEngineUnreachable: the Docker engine does not answer.
	ErrEngineUnreachable = errors.New("driver: docker engine unreachable")
	// ErrImageMissing: the twin image is not in the engine.
	ErrImageMissing = errors.New("driver: twin image missing")
	// ErrNotReady: the twin did not become ready (it exited, or the ready timeout passed).
	ErrNotReady = errors.New("driver: twin did not become ready")
	// ErrBundle: the bundle could not be read.
	ErrBundle = errors.New("driver: bundle unavailable")
	// ErrForeignHandle: the handle was made by another driver (twin.driver changed); this one cannot act on it.
	ErrForeignHandle = errors.New("driver: handle of another driver")
)

// DefaultReadyTimeout bounds how long Start waits for a twin to answer ready.
const DefaultReadyTimeout = 2 * time.Minute

// readBundle returns the bundle's bytes.
func readBundle(ctx context.Context, spec Spec, blobs BlobGetter) ([]byte, error) {
	if spec.BundlePath != "" {
		b, err := os.ReadFile(spec.BundlePath)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBundle, err)
		}
		return b, nil
	}
	if blobs == nil {
		return nil, fmt.Errorf("%w: bundle_key %q given but the driver has no blob store", ErrBundle, spec.BundleKey)
	}
	rc, err := blobs.Get(ctx, spec.BundleKey)
	if err != nil {
		return nil, fmt.Errorf("%w: get %s: %w", ErrBundle, spec.BundleKey, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrBundle, spec.BundleKey, err)
	}
	return b, nil
}

// waitReady polls the twin at addr until it answers ready. died, when not nil, reports the twin's end early (its
// error says how). It fails with ErrNotReady.
func waitReady(ctx context.Context, hc *http.Client, addr string, timeout time.Duration, died func() error) error {
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := rpc.NewClient(addr, hc)
	delay := 2 * time.Millisecond
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := c.Ready(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		if died != nil {
			if derr := died(); derr != nil {
				return fmt.Errorf("%w: %w", ErrNotReady, derr)
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %s within %v: last probe: %w", ErrNotReady, addr, timeout, err)
		case <-t.C:
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// newProbeClient returns the HTTP client of readiness probes: no keep-alive, so probing leaves no idle connections
// to twins that are later stopped, and a short dial timeout.
func newProbeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DialContext:       (&net.Dialer{Timeout: time.Second}).DialContext,
		DisableKeepAlives: true,
	}}
}

// inspectReady turns a readiness probe of a running twin into its state.
func inspectReady(ctx context.Context, hc *http.Client, addr string) Status {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := rpc.NewClient(addr, hc).Ready(pctx)
	switch {
	case err == nil:
		return Status{State: StateReady}
	case errors.Is(err, rpc.ErrNotReady):
		return Status{State: StateStarting, Detail: "loading its bundle"}
	default:
		return Status{State: StateUnhealthy, Detail: err.Error()}
	}
}

// checkBundle verifies the ready twin serves the expected bundle.
func checkBundle(ctx context.Context, hc *http.Client, addr, want string) error {
	if want == "" {
		return nil
	}
	in, err := rpc.NewClient(addr, hc).Info(ctx, false)
	if err != nil {
		return fmt.Errorf("driver: check bundle hash: %w", err)
	}
	if in.BundleHash != want {
		return fmt.Errorf("%w: twin serves bundle %s, spec wants %s", ErrBundle, in.BundleHash, want)
	}
	return nil
}

// nameSafe maps s to the characters container names and file names allow.
func nameSafe(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			b.WriteRune(c)
		case c >= 'A' && c <= 'Z':
			b.WriteRune(c + 'a' - 'A')
		default:
			b.WriteByte('-')
		}
	}
	out := b.String()
	if len(out) > 40 {
		out = out[:40]
	}
	return out
}
