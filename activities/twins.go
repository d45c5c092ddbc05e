package activities

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// Application error types of the twin activities. All but ErrTypeTwinNotReady are not retryable: retrying cannot
// fix them, and a wake must report them at once.
const (
	// ErrTypeEngineUnreachable: the Docker engine does not answer (the API answers 503).
	ErrTypeEngineUnreachable = twinstate.EngineUnreachable
	// ErrTypeImageMissing: the twin image is not in the engine.
	ErrTypeImageMissing = "TwinImageMissing"
	// ErrTypeTwinBundle: the bundle cannot be read, or the twin serves another.
	ErrTypeTwinBundle = "TwinBundle"
	// ErrTypeForeignHandle: the handle was made by another driver (twin.driver changed across a restart).
	ErrTypeForeignHandle = "TwinForeignHandle"
	// ErrTypeTwinNotReady: the twin did not become ready (it exited while loading, or timed out).
	ErrTypeTwinNotReady = "TwinNotReady"
)

// StartTwinInput names the twin StartTwin starts.
type StartTwinInput struct {
	EnvID string
	Build twinstate.Build
}

// TwinHealth is what InspectTwin found: the driver's state and, for a ready twin, its idle time and sessions.
type TwinHealth struct {
	State    driver.State
	Detail   string
	IdleFor  time.Duration
	Sessions int
}

// TwinEventInput is a twin event to record: its type (events.TwinReady, events.TwinStopped), environment,
// build and twin.
type TwinEventInput struct {
	Type     string
	EnvID    string
	BuildID  string
	HandleID string
}

// ReapTwinsInput asks to remove an environment's twins other than Keep (handle IDs). Twins younger than Grace are
// left alone: a start may still be returning their handle.
type ReapTwinsInput struct {
	EnvID string
	Keep  []string
	Grace time.Duration
}

// Twins runs twins for the TwinWorkflow through a driver.
type Twins struct {
	Driver driver.Driver
	// HTTP is the client of twin RPC probes; nil means rpc.NewHTTPClient().
	HTTP *http.Client
	// Events records twin.ready and twin.stopped (nil: none).
	Events *EventLog

	once sync.Once
	hc   *http.Client
}

func (a *Twins) rpc(h driver.Handle) *rpc.Client {
	a.once.Do(func() {
		a.hc = a.HTTP
		if a.hc == nil {
			a.hc = rpc.NewHTTPClient()
		}
	})
	return rpc.NewClient(h.Addr, a.hc)
}

// StartTwin starts a twin for the build and returns its handle once it is ready.
// It heartbeats while the twin boots, so a worker that dies meanwhile is noticed within the heartbeat timeout.
func (a *Twins) StartTwin(ctx context.Context, in StartTwinInput) (driver.Handle, error) {
	beat := startBeat(ctx, 2*time.Second, nil)
	defer beat.stop()
	h, err := a.Driver.Start(ctx, driver.Spec{EnvID: in.EnvID, BuildID: in.Build.BuildID, BundleKey: in.Build.BundleKey,
		BundleHash: in.Build.BundleHash})
	if err != nil {
		return driver.Handle{}, twinError("start twin of "+in.EnvID+" build "+in.Build.BuildID, err)
	}
	return h, nil
}

// InspectTwin reports the twin's state; a ready twin also reports how long it has been idle and its sessions.
func (a *Twins) InspectTwin(ctx context.Context, h driver.Handle) (TwinHealth, error) {
	st, err := a.Driver.Inspect(ctx, h)
	if err != nil {
		return TwinHealth{}, twinError("inspect twin "+h.ID, err)
	}
	out := TwinHealth{State: st.State, Detail: st.Detail}
	if st.State != driver.StateReady {
		return out, nil
	}
	in, err := a.rpc(h).Info(ctx, false)
	if err != nil {
		// It answered ready a moment ago; report what the probe saw now.
		return TwinHealth{State: driver.StateUnhealthy, Detail: err.Error()}, nil
	}
	out.IdleFor = time.Duration(in.IdleMS) * time.Millisecond
	out.Sessions = in.Sessions
	return out, nil
}

// StopTwin stops the twin; a twin already gone is not an error.
func (a *Twins) StopTwin(ctx context.Context, h driver.Handle) error {
	if err := a.Driver.Stop(ctx, h); err != nil {
		return twinError("stop twin "+h.ID, err)
	}
	return nil
}

// RecordTwinEvent records a twin's event, once per twin (a retry records nothing more), and starts its deliveries.
func (a *Twins) RecordTwinEvent(ctx context.Context, in TwinEventInput) error {
	if !events.Known(in.Type) || !strings.HasPrefix(in.Type, "twin.") {
		return temporal.NewNonRetryableApplicationError("not a twin event: "+in.Type, ErrTypeBadInput, nil)
	}
	return a.Events.EmitEnv(ctx, in.EnvID, in.Type, in.Type+":"+in.HandleID, func(env *schema.Environment) any {
		return events.TwinData{EnvID: env.ID, Env: env.Slug, BuildID: in.BuildID, TwinID: in.HandleID}
	})
}

// ReapTwins removes the environment's twins that are not in Keep (and older than Grace), when the driver can
// reconcile; it returns the removed handles.
func (a *Twins) ReapTwins(ctx context.Context, in ReapTwinsInput) ([]driver.Handle, error) {
	r, ok := a.Driver.(driver.Reconciler)
	if !ok {
		return nil, nil
	}
	keep := make(map[string]bool, len(in.Keep))
	for _, id := range in.Keep {
		keep[id] = true
	}
	removed, err := r.Reconcile(ctx, func(h driver.Handle) bool { return h.EnvID != in.EnvID || keep[h.ID] }, in.Grace)
	if err != nil {
		return removed, twinError("reap twins of "+in.EnvID, err)
	}
	return removed, nil
}

// twinError turns a driver error into an application error of the type the workflow tells apart.
func twinError(what string, err error) error {
	msg := fmt.Sprintf("%s: %v", what, err)
	switch {
	case errors.Is(err, driver.ErrEngineUnreachable):
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeEngineUnreachable, err)
	case errors.Is(err, driver.ErrImageMissing):
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeImageMissing, err)
	case errors.Is(err, driver.ErrBundle):
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeTwinBundle, err)
	case errors.Is(err, driver.ErrForeignHandle):
		// Retrying cannot help: the handle belongs to a driver this worker does not run.
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeForeignHandle, err)
	case errors.Is(err, driver.ErrNotReady):
		return temporal.NewApplicationErrorWithCause(msg, ErrTypeTwinNotReady, err)
	}
	var bad *driver.SpecError
	if errors.As(err, &bad) {
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeBadInput, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
