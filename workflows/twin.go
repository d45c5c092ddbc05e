package workflows

import (
	"errors"
	"sort"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/twinstate"
)

// Registered name and message names of the twin workflow; never change them.
const (
	TwinWorkflowName = "doppel.Twin"
	// WakeUpdate (WakeRequest → TwinStatus) boots a build's twin if it is stopped and answers its state; with Wait
	// it answers once the twin is ready or failed.
	WakeUpdate = "wake"
	// TwinStatusQuery answers the TwinStatus of the active build.
	TwinStatusQuery = "status"
	// NewBuildSignal (twinstate.Build) makes a build the active one.
	NewBuildSignal = "build"
	// StopTwinSignal stops every twin of the environment and ends the workflow (the environment is deleted).
	StopTwinSignal = "stop"
)

// Defaults of TwinInput.
const (
	DefaultTwinIdle        = 15 * time.Minute
	DefaultTwinHealthEvery = time.Minute
	DefaultTwinReapEvery   = 10 * time.Minute
)

// Activity bounds of the twin workflow.
const (
	twinStartTimeout = 3 * time.Minute
	twinStopTimeout  = time.Minute
	// twinReapGrace keeps twins a start in flight may still be returning.
	twinReapGrace = twinStartTimeout + time.Minute
	// twinMaxHistory is the history length past which the workflow continues as new at rest.
	twinMaxHistory = 10_000
)

// TwinWorkflowID is the workflow id of an environment's twin workflow.
func TwinWorkflowID(envID string) string { return "twin/" + envID }

// TwinInput starts (or continues) an environment's twin workflow.
type TwinInput struct {
	EnvID string
	// Active is the environment's active build: new sessions open on its twin. Zero until the first build.
	Active twinstate.Build
	// Idle is how long a twin serves no session request before it stops (zero: DefaultTwinIdle).
	Idle time.Duration
	// HealthEvery is how often a ready twin is inspected (zero: DefaultTwinHealthEvery); a dead one is restarted.
	HealthEvery time.Duration
	// ReapEvery is how often twins of the environment that the workflow does not hold are removed (zero:
	// DefaultTwinReapEvery).
	ReapEvery time.Duration
	// Twins carries the twins across continue-as-new.
	Twins []TwinSlot
}

// TwinSlot is one build's twin.
type TwinSlot struct {
	Build  twinstate.Build
	State  string
	Handle *twinstate.Handle `json:",omitempty"`
	// Error and ErrorType say why the last boot or inspection failed (empty once it succeeds).
	Error     string `json:",omitempty"`
	ErrorType string `json:",omitempty"`
	// LastExit says why the twin was last restarted (it died or stopped answering); Restarts counts restarts.
	LastExit string `json:",omitempty"`
	Restarts int
	// Since is when the twin entered State (workflow time).
	Since time.Time
	// Boots counts successful boots: more than one means it was restarted.
	Boots int
	// Sessions is the number of sessions the twin held at its last inspection.
	Sessions int
}

// WakeRequest asks for a build's twin. A zero Build means the active build; a session of an older build names its
// own, so its twin is booted again if it stopped. Suspect is the handle ID of a twin the caller could not reach:
// it is inspected at once and restarted if dead, and the wake answers after that inspection (booting when it was
// dead). Wait answers only once the twin is ready or failed.
type WakeRequest struct {
	Build   twinstate.Build
	Wait    bool
	Suspect string
	// Idle, when set, is the caller's configured idle time: the workflow adopts it, so a twin.idle changed across a
	// restart takes effect on a TwinWorkflow that was already running (it kept the idle time it started with).
	Idle time.Duration `json:",omitempty"`
}

// TwinStatus is the state of one build's twin (the woken one, or the active one for the query).
type TwinStatus struct {
	EnvID string
	Build twinstate.Build
	State string
	// Addr is the twin RPC's base URL when State is ready.
	Addr      string
	Handle    *twinstate.Handle `json:",omitempty"`
	Error     string            `json:",omitempty"`
	ErrorType string            `json:",omitempty"`
	Active    twinstate.Build
	// Twins lists every build's twin the workflow holds, by build id.
	Twins []TwinSlot
}

// Twin runs one environment's twins: stopped → booting → ready → (idle) → stopped, per build. A wake boots a
// stopped twin; a ready twin is inspected every HealthEvery and restarted when it died; a twin idle for Idle is
// stopped.
//
// A new build (NewBuildSignal) becomes the active build: new sessions open on its twin, which boots at once if the
// environment's twin was running. Open sessions are not moved — a session's world is a function of its bundle, so
// it stays on the twin of the build it opened on. That twin keeps serving them and stops once it holds no session
// (or is idle); a later call of such a session wakes its build's twin again and the session is rebuilt from its
// journal.
func Twin(ctx workflow.Context, in TwinInput) error {
	w := &twinWF{in: in}
	if w.in.Idle <= 0 {
		w.in.Idle = DefaultTwinIdle
	}
	if w.in.HealthEvery <= 0 {
		w.in.HealthEvery = DefaultTwinHealthEvery
	}
	if w.in.ReapEvery <= 0 {
		w.in.ReapEvery = DefaultTwinReapEvery
	}
	if err := workflow.SetQueryHandler(ctx, TwinStatusQuery, func() (TwinStatus, error) {
		return w.status(w.in.Active), nil
	}); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, WakeUpdate, w.wake,
		workflow.UpdateHandlerOptions{Validator: w.validateWake}); err != nil {
		return err
	}
	for _, s := range in.Twins {
		w.add(ctx, &slot{TwinSlot: s})
	}
	if !w.in.Active.IsZero() {
		w.slotFor(ctx, w.in.Active)
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		ch := workflow.GetSignalChannel(ctx, NewBuildSignal)
		for {
			var b twinstate.Build
			ch.Receive(ctx, &b)
			w.newBuild(ctx, b)
		}
	})
	workflow.Go(ctx, func(ctx workflow.Context) {
		workflow.GetSignalChannel(ctx, StopTwinSignal).Receive(ctx, nil)
		w.stopping = true
	})
	return w.run(ctx)
}

type twinWF struct {
	in       TwinInput
	slots    []*slot // by build id
	stopping bool
}

// slot is a build's twin and its lifecycle coroutine's flags.
type slot struct {
	TwinSlot
	idleFor time.Duration
	wanted  bool // a wake asks for it
	suspect bool // a caller could not reach it
	busy    bool // a start or stop is in flight
	done    bool // its coroutine ended
}

func (w *twinWF) run(ctx workflow.Context) error {
	end := func() bool { return w.stopping || w.continueAsNew(ctx) }
	for {
		if w.awake() {
			// Some twin runs: reap what no slot holds every ReapEvery.
			ok, err := workflow.AwaitWithTimeout(ctx, w.in.ReapEvery, end)
			if err != nil {
				return err
			}
			if !ok {
				w.reap(ctx)
				continue
			}
		} else {
			// Nothing runs: no timers until a twin starts.
			if err := workflow.Await(ctx, func() bool { return end() || w.awake() }); err != nil {
				return err
			}
			if !end() {
				continue
			}
		}
		if w.stopping {
			if err := workflow.Await(ctx, w.allDone); err != nil {
				return err
			}
			return nil
		}
		next := w.in
		next.Twins = nil
		for _, s := range w.slots {
			next.Twins = append(next.Twins, s.TwinSlot)
		}
		return workflow.NewContinueAsNewError(ctx, TwinWorkflowName, next)
	}
}

// continueAsNew reports whether the history is long and the workflow is at rest: no start or stop in flight, no
// twin booting, no wake waiting.
func (w *twinWF) continueAsNew(ctx workflow.Context) bool {
	info := workflow.GetInfo(ctx)
	if !info.GetContinueAsNewSuggested() && info.GetCurrentHistoryLength() < twinMaxHistory {
		return false
	}
	for _, s := range w.slots {
		if s.busy || s.State == twinstate.Booting || s.suspect {
			return false
		}
	}
	return workflow.AllHandlersFinished(ctx)
}

// awake reports whether some twin runs or is starting.
func (w *twinWF) awake() bool {
	for _, s := range w.slots {
		if s.Handle != nil || s.busy || s.State == twinstate.Booting {
			return true
		}
	}
	return false
}

func (w *twinWF) allDone() bool {
	for _, s := range w.slots {
		if !s.done {
			return false
		}
	}
	return true
}

func (w *twinWF) isActive(s *slot) bool { return s.Build.BuildID == w.in.Active.BuildID }

func (w *twinWF) find(buildID string) *slot {
	for _, s := range w.slots {
		if s.Build.BuildID == buildID {
			return s
		}
	}
	return nil
}

// slotFor returns the build's slot, adding a stopped one if there is none.
func (w *twinWF) slotFor(ctx workflow.Context, b twinstate.Build) *slot {
	if s := w.find(b.BuildID); s != nil {
		return s
	}
	s := &slot{TwinSlot: TwinSlot{Build: b, State: twinstate.Stopped, Since: workflow.Now(ctx)}}
	w.add(ctx, s)
	return s
}

func (w *twinWF) add(ctx workflow.Context, s *slot) {
	w.slots = append(w.slots, s)
	sort.SliceStable(w.slots, func(i, j int) bool { return w.slots[i].Build.BuildID < w.slots[j].Build.BuildID })
	workflow.Go(ctx, func(ctx workflow.Context) { w.lifecycle(ctx, s) })
}

func (w *twinWF) remove(s *slot) {
	for i, x := range w.slots {
		if x == s {
			w.slots = append(w.slots[:i], w.slots[i+1:]...)
			return
		}
	}
}

func (s *slot) set(ctx workflow.Context, state string) {
	if s.State != state {
		s.State = state
		s.Since = workflow.Now(ctx)
	}
}

func (w *twinWF) validateWake(ctx workflow.Context, req WakeRequest) error {
	if w.stopping {
		return errors.New("the environment's twins are stopping")
	}
	if req.Build.IsZero() {
		if w.in.Active.IsZero() {
			return errors.New("build: the environment has no active build yet")
		}
		return nil
	}
	if req.Build.BundleKey == "" {
		return errors.New("build.BundleKey: required with build.BuildID")
	}
	return nil
}

// wake boots the build's twin if it is stopped or failed, and answers its state (once ready or failed with Wait).
func (w *twinWF) wake(ctx workflow.Context, req WakeRequest) (TwinStatus, error) {
	if req.Idle > 0 {
		w.in.Idle = req.Idle
	}
	b := req.Build
	if b.IsZero() {
		b = w.in.Active
	}
	s := w.slotFor(ctx, b)
	switch s.State {
	case twinstate.Stopped, twinstate.Failed:
		s.wanted = true
		s.set(ctx, twinstate.Booting)
	case twinstate.Ready:
		if req.Suspect != "" && s.Handle != nil && s.Handle.ID == req.Suspect {
			s.suspect = true
			// The watch inspects it at once; answer what it found (booting when it died), not the stale ready —
			// unless the last inspection found the engine unreachable: it cannot answer better now, and callers
			// answer 503 at once rather than after another failed inspection. Histories from before this answered
			// at once.
			if !req.Wait && s.ErrorType != activities.ErrTypeEngineUnreachable &&
				workflow.GetVersion(ctx, "wake-inspects-suspect", workflow.DefaultVersion, 1) >= 1 {
				if err := workflow.Await(ctx, func() bool { return !s.suspect || w.stopping }); err != nil {
					return TwinStatus{}, err
				}
			}
		}
	}
	if req.Wait {
		if err := workflow.Await(ctx, func() bool {
			return !s.suspect && (s.State == twinstate.Ready || s.State == twinstate.Failed) || w.stopping
		}); err != nil {
			return TwinStatus{}, err
		}
	}
	return w.statusOf(s), nil
}

func (w *twinWF) newBuild(ctx workflow.Context, b twinstate.Build) {
	if b.IsZero() || b.BuildID == w.in.Active.BuildID || w.stopping {
		return
	}
	awake := false
	for _, s := range w.slots {
		awake = awake || s.State == twinstate.Ready || s.State == twinstate.Booting
	}
	w.in.Active = b
	w.tagBuild(ctx, b)
	s := w.slotFor(ctx, b)
	if awake && (s.State == twinstate.Stopped || s.State == twinstate.Failed) {
		s.wanted = true
		s.set(ctx, twinstate.Booting)
	}
}

// tagBuild makes the new active build the workflow's DoppelBuild, when it carries doppel's search attributes.
// Workflows started before the attributes existed carry none (and their histories no upsert).
func (w *twinWF) tagBuild(ctx workflow.Context, b twinstate.Build) {
	if !workflow.GetTypedSearchAttributes(ctx).ContainsKey(EnvAttr) {
		return
	}
	if workflow.GetVersion(ctx, "twin-build-attribute", workflow.DefaultVersion, 1) < 1 {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, BuildAttr.ValueSet(b.BuildID)); err != nil {
		workflow.GetLogger(ctx).Warn("tag the twin workflow with its new build", "build", b.BuildID, "error", err)
	}
}

// status answers the state of build b's twin (stopped when the workflow holds none).
func (w *twinWF) status(b twinstate.Build) TwinStatus {
	if s := w.find(b.BuildID); s != nil {
		return w.statusOf(s)
	}
	return w.statusOf(&slot{TwinSlot: TwinSlot{Build: b, State: twinstate.Stopped}})
}

// statusOf answers s's state; s may have been dropped from the workflow meanwhile (a failed old build).
func (w *twinWF) statusOf(s *slot) TwinStatus {
	st := TwinStatus{EnvID: w.in.EnvID, Build: s.Build, State: s.State, Error: s.Error, ErrorType: s.ErrorType,
		Active: w.in.Active}
	if s.State == twinstate.Ready && s.Handle != nil {
		h := *s.Handle
		st.Handle, st.Addr = &h, h.Addr
	}
	for _, x := range w.slots {
		t := x.TwinSlot
		if t.Handle != nil {
			h := *t.Handle
			t.Handle = &h
		}
		st.Twins = append(st.Twins, t)
	}
	return st
}

// lifecycle is a slot's coroutine: it boots, watches and stops the build's twin until the slot is dropped or the
// workflow stops.
func (w *twinWF) lifecycle(ctx workflow.Context, s *slot) {
	defer func() { s.done = true }()
	for !w.stopping {
		switch s.State {
		case twinstate.Stopped, twinstate.Failed:
			if !s.wanted && !w.isActive(s) {
				w.remove(s)
				return
			}
			_ = workflow.Await(ctx, func() bool { return s.wanted || w.stopping || !w.isActive(s) })
			if s.wanted && !w.stopping {
				s.set(ctx, twinstate.Booting)
			}
		case twinstate.Booting:
			w.boot(ctx, s)
		case twinstate.Ready:
			w.watch(ctx, s)
		default:
			s.set(ctx, twinstate.Stopped)
		}
	}
	if s.Handle != nil {
		w.stop(ctx, s)
	}
	s.set(ctx, twinstate.Stopped)
}

func (w *twinWF) boot(ctx workflow.Context, s *slot) {
	var a *activities.Twins
	if s.Handle != nil { // the dead twin this boot replaces
		w.stop(ctx, s)
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: twinStartTimeout,
		HeartbeatTimeout:    15 * time.Second,
		Summary:             "start twin of " + s.Build.BuildID,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second,
			MaximumAttempts: 3,
			NonRetryableErrorTypes: []string{activities.ErrTypeEngineUnreachable, activities.ErrTypeImageMissing,
				activities.ErrTypeTwinBundle, activities.ErrTypeBadInput},
		},
	})
	var h twinstate.Handle
	s.busy = true
	err := workflow.ExecuteActivity(actx, a.StartTwin, activities.StartTwinInput{EnvID: w.in.EnvID, Build: s.Build}).Get(ctx, &h)
	s.busy = false
	s.wanted = false
	if err != nil {
		s.Error, s.ErrorType = errorText(err)
		s.set(ctx, twinstate.Failed)
		return
	}
	s.Handle = &h
	s.Error, s.ErrorType = "", ""
	s.Boots++
	s.idleFor = 0
	s.set(ctx, twinstate.Ready)
	w.event(ctx, events.TwinReady, s.Build.BuildID, h.ID)
}

// event records a twin event (twin.ready, twin.stopped). Histories from before events exist skip it; a failure
// to record is logged and does not hold the twin's life.
func (w *twinWF) event(ctx workflow.Context, typ, buildID, handleID string) {
	if workflow.GetVersion(ctx, "twin-events", workflow.DefaultVersion, 1) < 1 {
		return
	}
	var a *activities.Twins
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout:    30 * time.Second,
		ScheduleToCloseTimeout: 10 * time.Minute,
		Summary:                typ + " " + handleID,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second, NonRetryableErrorTypes: []string{activities.ErrTypeBadInput}},
	})
	in := activities.TwinEventInput{Type: typ, EnvID: w.in.EnvID, BuildID: buildID, HandleID: handleID}
	if err := workflow.ExecuteActivity(actx, a.RecordTwinEvent, in).Get(ctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("record twin event failed", "type", typ, "handle", handleID, "error", err)
	}
}

// watch inspects a ready twin every HealthEvery (sooner when its idle time is nearly up, at once when a caller
// suspects it): a twin that died is restarted; an idle one, or an old build's with no session left, is stopped.
func (w *twinWF) watch(ctx workflow.Context, s *slot) {
	var a *activities.Twins
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 15 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 2},
	})
	unhealthy := 0
	for s.State == twinstate.Ready && !w.stopping {
		wait := w.in.HealthEvery
		if left := w.in.Idle - s.idleFor; left < wait {
			wait = max(left, time.Second)
		}
		if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return s.suspect || w.stopping }); err != nil || w.stopping {
			return
		}
		var hh activities.TwinHealth
		if err := workflow.ExecuteLocalActivity(lctx, a.InspectTwin, *s.Handle).Get(ctx, &hh); err != nil {
			// The engine may be down: keep the handle, report, look again next time.
			s.Error, s.ErrorType = errorText(err)
			s.suspect = false
			continue
		}
		switch hh.State {
		case twinstate.Healthy:
			unhealthy = 0
			s.idleFor, s.Sessions = hh.IdleFor, hh.Sessions
			s.Error, s.ErrorType = "", ""
			if hh.IdleFor >= w.in.Idle || (!w.isActive(s) && hh.Sessions == 0) {
				w.stop(ctx, s)
				s.set(ctx, twinstate.Stopped)
			}
		case twinstate.Starting, twinstate.Unhealthy:
			unhealthy++
			if unhealthy >= 2 || s.suspect {
				s.LastExit = "unresponsive: " + hh.Detail
				s.Restarts++
				s.set(ctx, twinstate.Booting)
			}
		default: // exited or gone
			s.LastExit = string(hh.State) + ": " + hh.Detail
			s.Restarts++
			s.set(ctx, twinstate.Booting)
		}
		s.suspect = false
	}
}

func (w *twinWF) stop(ctx workflow.Context, s *slot) {
	var a *activities.Twins
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: twinStopTimeout,
		Summary:             "stop twin of " + s.Build.BuildID,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumAttempts: 5},
	})
	s.busy = true
	err := workflow.ExecuteActivity(actx, a.StopTwin, *s.Handle).Get(ctx, nil)
	s.busy = false
	h := s.Handle
	s.Handle = nil
	if err != nil {
		// The twin may live on; the reaper removes it once no slot holds it.
		workflow.GetLogger(ctx).Warn("stop twin failed", "handle", h.ID, "error", err)
		return
	}
	w.event(ctx, events.TwinStopped, s.Build.BuildID, h.ID)
}

// reap removes the environment's twins that no slot holds (left by a start whose answer was lost, or by a crashed
// worker).
func (w *twinWF) reap(ctx workflow.Context) {
	var a *activities.Twins
	in := activities.ReapTwinsInput{EnvID: w.in.EnvID, Grace: twinReapGrace}
	for _, s := range w.slots {
		if s.Handle != nil {
			in.Keep = append(in.Keep, s.Handle.ID)
		}
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		Summary:             "reap twins of " + w.in.EnvID,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 2},
	})
	if err := workflow.ExecuteActivity(actx, a.ReapTwins, in).Get(ctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("reap twins failed", "env", w.in.EnvID, "error", err)
	}
}

// errorText returns an activity error's message and application error type.
func errorText(err error) (string, string) {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Message(), appErr.Type()
	}
	return err.Error(), ""
}
