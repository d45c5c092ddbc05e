package workflows

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
	"github.com/doppel-dev/doppel/twinstate"
)

// fleet stands in for the twin activities: it keeps the twins "started", answers inspections from their scripted
// state, and records starts and stops. Its clock is the test environment's.
type fleet struct {
	env *testsuite.TestWorkflowEnvironment

	mu       sync.Mutex
	n        int
	twins    map[string]*fakeTwin
	starts   []string // build ids
	stops    []string // handle ids
	events   []string // "type handle", as RecordTwinEvent was asked
	startErr error
	// inspectErr, when set, fails every inspection (an engine that does not answer).
	inspectErr  error
	inspections int
}

type fakeTwin struct {
	h        twinstate.Handle
	dead     bool
	lastUse  time.Time
	sessions int
}

func newFleet(env *testsuite.TestWorkflowEnvironment) *fleet {
	f := &fleet{env: env, twins: map[string]*fakeTwin{}}
	var a *activities.Twins
	env.OnActivity(a.StartTwin, mock.Anything, mock.Anything).Return(f.start)
	env.OnActivity(a.InspectTwin, mock.Anything, mock.Anything).Return(f.inspect)
	env.OnActivity(a.StopTwin, mock.Anything, mock.Anything).Return(f.stop)
	env.OnActivity(a.ReapTwins, mock.Anything, mock.Anything).Return(nil, nil)
	env.OnActivity(a.RecordTwinEvent, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.TwinEventInput) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.events = append(f.events, in.Type+" "+in.HandleID)
		return nil
	})
	return f
}

func (f *fleet) start(_ context.Context, in activities.StartTwinInput) (twinstate.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, in.Build.BuildID)
	if f.startErr != nil {
		return twinstate.Handle{}, f.startErr
	}
	f.n++
	h := twinstate.Handle{Driver: "fake", ID: fmt.Sprintf("twin-%d", f.n), EnvID: in.EnvID, BuildID: in.Build.BuildID,
		Addr: fmt.Sprintf("http://127.0.0.1:%d", 9000+f.n)}
	f.twins[h.ID] = &fakeTwin{h: h, lastUse: f.env.Now()}
	return h, nil
}

func (f *fleet) inspect(_ context.Context, h twinstate.Handle) (activities.TwinHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.twins[h.ID]
	f.inspections++
	switch {
	case f.inspectErr != nil:
		return activities.TwinHealth{}, f.inspectErr
	case t == nil:
		return activities.TwinHealth{State: twinstate.Gone, Detail: "no such twin"}, nil
	case t.dead:
		return activities.TwinHealth{State: twinstate.Exited, Detail: "killed"}, nil
	}
	return activities.TwinHealth{State: twinstate.Healthy, IdleFor: f.env.Now().Sub(t.lastUse), Sessions: t.sessions}, nil
}

func (f *fleet) stop(_ context.Context, h twinstate.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, h.ID)
	delete(f.twins, h.ID)
	return nil
}

// use marks the twin of build serving a request now, with sessions open.
func (f *fleet) use(build string, sessions int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.twins {
		if t.h.BuildID == build {
			t.lastUse, t.sessions = f.env.Now(), sessions
		}
	}
}

func (f *fleet) kill(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.twins[id]; t != nil {
		t.dead = true
	}
}

func (f *fleet) counts() (starts, stops int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.starts), len(f.stops)
}

func newTwinEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *fleet) {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Twin, workflow.RegisterOptions{Name: TwinWorkflowName})
	return env, newFleet(env)
}

var (
	build1 = twinstate.Build{BuildID: "bld_1", BundleKey: "bundles/1", BundleHash: "sha256:1"}
	build2 = twinstate.Build{BuildID: "bld_2", BundleKey: "bundles/2", BundleHash: "sha256:2"}
)

// wake sends a wake update at the current workflow time and records its answer in *got (or its error in *gotErr).
func wake(t *testing.T, env *testsuite.TestWorkflowEnvironment, id string, req WakeRequest, got *TwinStatus, gotErr *error) {
	env.UpdateWorkflow(WakeUpdate, id, &testsuite.TestUpdateCallback{
		OnAccept: func() {},
		OnReject: func(err error) {
			if gotErr != nil {
				*gotErr = err
				return
			}
			t.Errorf("wake %s rejected: %v", id, err)
		},
		OnComplete: func(v any, err error) {
			if err != nil {
				if gotErr != nil {
					*gotErr = err
					return
				}
				t.Errorf("wake %s failed: %v", id, err)
				return
			}
			*got = v.(TwinStatus)
		},
	}, req)
}

func queryStatus(t *testing.T, env *testsuite.TestWorkflowEnvironment) TwinStatus {
	t.Helper()
	v, err := env.QueryWorkflow(TwinStatusQuery)
	if err != nil {
		t.Fatalf("query status: %v", err)
	}
	var st TwinStatus
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A wake carrying another idle time changes the running workflow's (issue 13 defect 8: a twin.idle changed across
// a restart never took effect, so the twin never stopped on the new idle time).
func TestTwinWakeAdoptsIdle(t *testing.T) {
	env, f := newTwinEnv(t)
	var st TwinStatus
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Idle: 2 * time.Minute}, &st, nil) }, time.Second)
	env.RegisterDelayedCallback(func() { f.use(build1.BuildID, 1) }, 2*time.Second)
	// Started with 15 minutes idle; the wake asked for 2: unused since 2s, it is stopped by 4 minutes.
	env.RegisterDelayedCallback(func() {
		if got := queryStatus(t, env); got.State != twinstate.Stopped {
			t.Errorf("4 minutes after the last use with a 2-minute idle time: %s, want stopped", got.State)
		}
		env.SignalWorkflow(StopTwinSignal, nil)
	}, 4*time.Minute)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: 15 * time.Minute, HealthEvery: time.Minute})
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("workflow: completed=%v err=%v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
}

// stopped → booting → ready → (idle) → stopped, and a wake boots it again.
func TestTwinWakeIdleStop(t *testing.T) {
	env, f := newTwinEnv(t)
	var first, second, afterIdle TwinStatus
	var atBoot, atIdle TwinStatus
	env.RegisterDelayedCallback(func() {
		if st := queryStatus(t, env); st.State != twinstate.Stopped {
			t.Errorf("before any wake: %s, want stopped", st.State)
		}
		wake(t, env, "w1", WakeRequest{}, &first, nil)
	}, time.Second)
	env.RegisterDelayedCallback(func() {
		atBoot = queryStatus(t, env)
		wake(t, env, "w2", WakeRequest{}, &second, nil)
		f.use(build1.BuildID, 1)
	}, 2*time.Second)
	env.RegisterDelayedCallback(func() { f.use(build1.BuildID, 1) }, 4*time.Minute)
	// Last use at 4m, idle 5m: stopped by the check at or after 9m.
	env.RegisterDelayedCallback(func() { atIdle = queryStatus(t, env) }, 8*time.Minute+30*time.Second)
	env.RegisterDelayedCallback(func() {
		if st := queryStatus(t, env); st.State != twinstate.Stopped {
			t.Errorf("after 5 idle minutes: %+v, want stopped", st)
		}
		wake(t, env, "w3", WakeRequest{Wait: true}, &afterIdle, nil)
	}, 10*time.Minute)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, 11*time.Minute)

	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: 5 * time.Minute, HealthEvery: time.Minute})
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("workflow: completed=%v err=%v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	if first.State != twinstate.Booting || first.Addr != "" {
		t.Errorf("first wake = %+v, want booting (202)", first)
	}
	if atBoot.State != twinstate.Ready || atBoot.Addr == "" || second.State != twinstate.Ready || second.Addr != atBoot.Addr {
		t.Errorf("after boot: query %+v, wake %+v; want ready (200) at one address", atBoot, second)
	}
	if atIdle.State != twinstate.Ready {
		t.Errorf("4.5 minutes after the last use: %s, want ready", atIdle.State)
	}
	if afterIdle.State != twinstate.Ready || afterIdle.Addr == "" || afterIdle.Addr == second.Addr {
		t.Errorf("wake after idle stop = %+v, want a new ready twin", afterIdle)
	}
	if len(afterIdle.Twins) != 1 || afterIdle.Twins[0].Boots != 2 {
		t.Errorf("twins = %+v, want one slot booted twice", afterIdle.Twins)
	}
	starts, stops := f.counts()
	if starts != 2 || stops != 2 {
		t.Errorf("starts %d, stops %d; want 2 and 2 (idle stop, then the stop signal)", starts, stops)
	}
	// Each twin's life is told: ready when it booted, stopped when it was stopped, in that order.
	f.mu.Lock()
	got := append([]string(nil), f.events...)
	f.mu.Unlock()
	want := []string{"twin.ready " + f.stops[0], "twin.stopped " + f.stops[0], "twin.ready " + f.stops[1], "twin.stopped " + f.stops[1]}
	if !slices.Equal(got, want) {
		t.Errorf("twin events %q, want %q", got, want)
	}
}

// A twin that dies is restarted by the health check; one a caller reports unreachable is checked and restarted at
// once, and the caller's wait answers with the new twin.
func TestTwinRestartsDeadTwin(t *testing.T) {
	env, f := newTwinEnv(t)
	var ready, afterSuspect TwinStatus
	var atCrash, afterCheck TwinStatus
	var suspectAnsweredAt time.Time
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &ready, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		f.use(build1.BuildID, 1)
		atCrash = queryStatus(t, env)
		f.kill(atCrash.Handle.ID)
	}, 30*time.Second)
	env.RegisterDelayedCallback(func() { afterCheck = queryStatus(t, env) }, 3*time.Minute)
	env.RegisterDelayedCallback(func() {
		f.use(build1.BuildID, 1)
		cur := queryStatus(t, env)
		f.kill(cur.Handle.ID)
		env.UpdateWorkflow(WakeUpdate, "w2", &testsuite.TestUpdateCallback{
			OnAccept: func() {}, OnReject: func(err error) { t.Errorf("rejected: %v", err) },
			OnComplete: func(v any, err error) {
				if err != nil {
					t.Errorf("wake: %v", err)
					return
				}
				afterSuspect, suspectAnsweredAt = v.(TwinStatus), env.Now()
			},
		}, WakeRequest{Wait: true, Suspect: cur.Handle.ID})
	}, 3*time.Minute+10*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, 4*time.Minute)

	start := env.Now()
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: time.Hour, HealthEvery: time.Minute})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if ready.State != twinstate.Ready || atCrash.Addr != ready.Addr {
		t.Fatalf("ready = %+v, at crash %+v", ready, atCrash)
	}
	if afterCheck.State != twinstate.Ready || afterCheck.Addr == ready.Addr || len(afterCheck.Twins) != 1 ||
		!strings.Contains(afterCheck.Twins[0].LastExit, "exited") || afterCheck.Twins[0].Restarts != 1 {
		t.Errorf("after the health check: %+v, want a new ready twin with the crash reported", afterCheck)
	}
	if afterSuspect.State != twinstate.Ready || afterSuspect.Addr == afterCheck.Addr {
		t.Errorf("wake with the dead twin as suspect = %+v, want a new ready twin", afterSuspect)
	}
	if took := suspectAnsweredAt.Sub(start.Add(3*time.Minute + 10*time.Second)); took > 5*time.Second {
		t.Errorf("the suspect wake answered %v after it was sent, want at once (not at the next health check)", took)
	}
	if starts, _ := f.counts(); starts != 3 {
		t.Errorf("%d starts, want 3 (boot and two restarts)", starts)
	}
}

// A new build boots its twin at once when the environment is awake and becomes active; the old build's twin keeps
// its sessions until it has none, then stops; a session of the old build can wake it again.
func TestTwinNewBuild(t *testing.T) {
	env, f := newTwinEnv(t)
	var afterBuild, oldWoken TwinStatus
	var afterDrain TwinStatus
	env.RegisterDelayedCallback(func() {
		var st TwinStatus
		wake(t, env, "w1", WakeRequest{Wait: true}, &st, nil)
	}, time.Second)
	env.RegisterDelayedCallback(func() {
		f.use(build1.BuildID, 2)
		env.SignalWorkflow(NewBuildSignal, build2)
	}, 10*time.Second)
	env.RegisterDelayedCallback(func() {
		afterBuild = queryStatus(t, env)
		f.use(build1.BuildID, 0) // its sessions closed
		f.use(build2.BuildID, 1)
	}, 20*time.Second)
	env.RegisterDelayedCallback(func() {
		afterDrain = queryStatus(t, env)
		wake(t, env, "w2", WakeRequest{Build: build1, Wait: true}, &oldWoken, nil)
	}, 3*time.Minute)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, 4*time.Minute)

	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: time.Hour, HealthEvery: time.Minute})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if afterBuild.Active != build2 || afterBuild.Build != build2 || afterBuild.State != twinstate.Ready {
		t.Fatalf("after the new build: %+v, want build 2 active and ready", afterBuild)
	}
	if len(afterBuild.Twins) != 2 || afterBuild.Twins[0].State != twinstate.Ready {
		t.Fatalf("after the new build the old twin must still serve its sessions: %+v", afterBuild.Twins)
	}
	if len(afterDrain.Twins) != 1 || afterDrain.Twins[0].Build != build2 {
		t.Fatalf("after the old twin's sessions closed: %+v, want only build 2's twin", afterDrain.Twins)
	}
	if oldWoken.Build != build1 || oldWoken.State != twinstate.Ready || oldWoken.Active != build2 {
		t.Fatalf("waking the old build = %+v, want its twin ready and build 2 still active", oldWoken)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := "bld_1,bld_2,bld_1"; strings.Join(f.starts, ",") != want {
		t.Errorf("starts = %v, want %s", f.starts, want)
	}
}

// A boot that fails for good (engine unreachable) answers failed at once with its error type; the next wake tries
// again.
func TestTwinBootFailure(t *testing.T) {
	env, f := newTwinEnv(t)
	f.startErr = temporal.NewNonRetryableApplicationError("driver: docker engine unreachable (unix:///x)", activities.ErrTypeEngineUnreachable, nil)
	var failed, retried TwinStatus
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &failed, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		f.mu.Lock()
		f.startErr = nil
		f.mu.Unlock()
		wake(t, env, "w2", WakeRequest{Wait: true}, &retried, nil)
	}, time.Minute)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, 2*time.Minute)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if failed.State != twinstate.Failed || failed.ErrorType != activities.ErrTypeEngineUnreachable || !strings.Contains(failed.Error, "unreachable") {
		t.Fatalf("wake with the engine down = %+v", failed)
	}
	if retried.State != twinstate.Ready {
		t.Fatalf("wake after the engine came back = %+v", retried)
	}
	if starts, _ := f.counts(); starts != 2 {
		t.Errorf("%d starts, want 2 (a non-retryable failure is not retried)", starts)
	}
}

func TestTwinWakeValidation(t *testing.T) {
	env, _ := newTwinEnv(t)
	var noBuild, noKey error
	var unused TwinStatus
	env.RegisterDelayedCallback(func() {
		wake(t, env, "w1", WakeRequest{}, &unused, &noBuild)
		wake(t, env, "w2", WakeRequest{Build: twinstate.Build{BuildID: "bld_9"}}, &unused, &noKey)
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, time.Minute)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1"})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if noBuild == nil || !strings.Contains(noBuild.Error(), "no active build") {
		t.Errorf("wake with no build: %v", noBuild)
	}
	if noKey == nil || !strings.Contains(noKey.Error(), "BundleKey") {
		t.Errorf("wake naming a build without its bundle: %v", noKey)
	}
}

// A long-running twin workflow continues as new at rest, carrying its ready twin.
func TestTwinContinuesAsNew(t *testing.T) {
	env, _ := newTwinEnv(t)
	env.RegisterDelayedCallback(func() {
		var st TwinStatus
		wake(t, env, "w1", WakeRequest{Wait: true}, &st, nil)
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.SetContinueAsNewSuggested(true) }, time.Minute)
	in := TwinInput{EnvID: "env_1", Active: build1, Idle: time.Hour, HealthEvery: 10 * time.Second}
	env.ExecuteWorkflow(TwinWorkflowName, in)
	err := env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	if !errors.As(err, &can) {
		t.Fatalf("workflow ended with %v, want continue-as-new", err)
	}
	var next TwinInput
	if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
		t.Fatal(err)
	}
	if len(next.Twins) != 1 || next.Twins[0].State != twinstate.Ready || next.Twins[0].Handle == nil || next.Active != build1 || next.HealthEvery != 10*time.Second {
		t.Fatalf("carried input = %+v", next)
	}
}

// The workflow with the real activities and an in-process driver: a wake boots a real twin that serves a session,
// and the stop signal stops it.
func TestTwinWithRealActivities(t *testing.T) {
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bank"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := driver.NewInproc(driver.InprocOptions{
		Blobs: dirBlobs(dir),
		Load: func(_ context.Context, b []byte) (rpc.Runtime, error) {
			return rpc.NewTwinRuntime(b, twin.RuntimeOptions{})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Twin, workflow.RegisterOptions{Name: TwinWorkflowName})
	env.RegisterActivity(&activities.Twins{Driver: d})

	build := twinstate.Build{BuildID: "bld_1", BundleKey: "bank", BundleHash: twin.HashBytes(data)}
	var ready TwinStatus
	var callErr error
	var content string
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &ready, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		c := rpc.NewClient(ready.Addr, nil)
		ctx := context.Background()
		if _, callErr = c.Open(ctx, rpc.OpenRequest{ID: "s1"}); callErr != nil {
			return
		}
		var res rpc.CallResult
		res, callErr = c.Call(ctx, "s1", rpc.CallRequest{Tool: "deposit", Arguments: []byte(`{"id":"a1","amount":5}`)})
		content = res.Content
		env.SignalWorkflow(StopTwinSignal, nil)
	}, time.Minute)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_real", Active: build, Idle: time.Hour})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if ready.State != twinstate.Ready || ready.Addr == "" {
		t.Fatalf("wake = %+v", ready)
	}
	if callErr != nil || !strings.Contains(content, "15") {
		t.Fatalf("call on the woken twin: %q, %v", content, callErr)
	}
	if hs, _ := d.List(context.Background()); len(hs) != 0 {
		t.Fatalf("twins left after the stop signal: %+v", hs)
	}
}

type dirBlobs string

func (d dirBlobs) Get(_ context.Context, key string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), key))
}

// kill -9 of a twin mid-session, end to end through the workflow with the real activities and the process driver:
// the caller finds the twin unreachable, wakes the workflow naming it as suspect, gets a restarted twin, rebuilds
// the session from its journal to the pre-kill state_hash, and the next call succeeds.
func TestTwinKillRestartRebuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "twin")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/doppel-dev/doppel/driver/internal/twinmain")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the twin binary: %v\n%s", err, out)
	}
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bank"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := driver.NewProcess(driver.ProcessOptions{Binary: bin, StateDir: t.TempDir(), Blobs: dirBlobs(dir)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hs, _ := d.List(context.Background())
		for _, h := range hs {
			_ = d.Stop(context.Background(), h)
		}
	})
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Twin, workflow.RegisterOptions{Name: TwinWorkflowName})
	env.RegisterActivity(&activities.Twins{Driver: d})

	ctx := context.Background()
	build := twinstate.Build{BuildID: "bld_1", BundleKey: "bank", BundleHash: twin.HashBytes(data)}
	spec := rpc.SessionSpec{Seed: 5}
	var first, restarted TwinStatus
	var journal []rpc.JournalEntry
	var beforeKill, rebuiltHash, afterContent string
	var killErr, rebuildErr error
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &first, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		c := rpc.NewClient(first.Addr, nil)
		if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s1", Spec: spec}); err != nil {
			t.Errorf("open: %v", err)
			return
		}
		for _, args := range []string{`{"id":"a1","amount":5}`, `{"id":"a2","amount":2}`} {
			res, err := c.Call(ctx, "s1", rpc.CallRequest{Tool: "deposit", Arguments: []byte(args)})
			if err != nil {
				t.Errorf("call: %v", err)
				return
			}
			journal = append(journal, rpc.JournalEntry{Tool: "deposit", Arguments: []byte(args), Content: res.Content,
				Rung: res.Rung, Fidelity: res.Fidelity, StateHash: res.StateHash})
			beforeKill = res.StateHash
		}
		if err := syscall.Kill(first.Handle.PID, syscall.SIGKILL); err != nil {
			t.Errorf("kill: %v", err)
			return
		}
		for i := 0; i < 200; i++ { // until the kernel has torn the listener down
			if _, killErr = c.Call(ctx, "s1", rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)}); killErr != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		env.UpdateWorkflow(WakeUpdate, "w2", &testsuite.TestUpdateCallback{
			OnAccept: func() {}, OnReject: func(err error) { t.Errorf("wake rejected: %v", err) },
			OnComplete: func(v any, err error) {
				if err != nil {
					t.Errorf("wake: %v", err)
					return
				}
				restarted = v.(TwinStatus)
				c2 := rpc.NewClient(restarted.Addr, nil)
				if _, err := c2.Call(ctx, "s1", rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)}); !errors.Is(err, rpc.ErrUnknownSession) {
					t.Errorf("call on the restarted twin before the rebuild: %v, want ErrUnknownSession", err)
				}
				var open rpc.OpenResponse
				open, rebuildErr = c2.Open(ctx, rpc.OpenRequest{ID: "s1", Spec: spec, Journal: journal})
				rebuiltHash = open.StateHash
				if res, err := c2.Call(ctx, "s1", rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)}); err == nil {
					afterContent = res.Content
				}
				env.SignalWorkflow(StopTwinSignal, nil)
			},
		}, WakeRequest{Wait: true, Suspect: first.Handle.ID})
	}, time.Minute)

	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_kill", Active: build, Idle: time.Hour, HealthEvery: time.Hour})
	if env.GetWorkflowError() != nil {
		t.Fatal(env.GetWorkflowError())
	}
	if !errors.Is(killErr, rpc.ErrUnreachable) {
		t.Fatalf("call after kill -9: %v, want ErrUnreachable", killErr)
	}
	if restarted.State != twinstate.Ready || restarted.Handle == nil || restarted.Handle.PID == first.Handle.PID || restarted.Twins[0].Restarts != 1 {
		t.Fatalf("after the suspect wake: %+v", restarted)
	}
	if rebuildErr != nil || rebuiltHash != beforeKill {
		t.Fatalf("rebuilt state %s (%v), before the kill %s", rebuiltHash, rebuildErr, beforeKill)
	}
	if !strings.Contains(afterContent, "15") {
		t.Fatalf("call after the rebuild = %q, want balance 15", afterContent)
	}
}

// A wake (without Wait) naming a dead ready twin as its suspect answers after the inspection: booting, not the
// stale ready (issue 21: a wake kept answering 200 ready after the twin's container was removed). The next wake
// finds a new twin ready.
func TestTwinSuspectWakeAnswersBooting(t *testing.T) {
	env, f := newTwinEnv(t)
	var ready, suspect, after TwinStatus
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &ready, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		f.kill(ready.Handle.ID)
		wake(t, env, "w2", WakeRequest{Suspect: ready.Handle.ID}, &suspect, nil)
	}, 10*time.Second)
	env.RegisterDelayedCallback(func() { wake(t, env, "w3", WakeRequest{}, &after, nil) }, 20*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, 30*time.Second)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: time.Hour, HealthEvery: time.Hour})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if ready.State != twinstate.Ready || ready.Handle == nil {
		t.Fatalf("first wake = %+v, want ready", ready)
	}
	if suspect.State != twinstate.Booting || suspect.Handle != nil {
		t.Errorf("suspect wake of the dead twin = %+v, want booting", suspect)
	}
	if after.State != twinstate.Ready || after.Handle == nil || after.Handle.ID == ready.Handle.ID {
		t.Errorf("next wake = %+v, want a new ready twin", after)
	}
	if starts, _ := f.counts(); starts != 2 {
		t.Errorf("%d starts, want 2 (boot and restart)", starts)
	}
}

// With the engine unreachable, the first suspect wake answers after the (failed) inspection, ready with the engine
// error; a second answers at once rather than after another failed inspection, so callers can answer 503 at once.
func TestTwinSuspectWakeEngineDown(t *testing.T) {
	env, f := newTwinEnv(t)
	var ready, first, second TwinStatus
	inspectedAt := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.inspections
	}
	sentAt, answeredAt := -1, -1
	env.RegisterDelayedCallback(func() { wake(t, env, "w1", WakeRequest{Wait: true}, &ready, nil) }, time.Second)
	env.RegisterDelayedCallback(func() {
		f.mu.Lock()
		f.inspectErr = temporal.NewNonRetryableApplicationError("engine down", activities.ErrTypeEngineUnreachable, nil)
		f.mu.Unlock()
		wake(t, env, "w2", WakeRequest{Suspect: ready.Handle.ID}, &first, nil)
	}, 10*time.Second)
	env.RegisterDelayedCallback(func() {
		sentAt = inspectedAt()
		env.UpdateWorkflow(WakeUpdate, "w3", &testsuite.TestUpdateCallback{
			OnAccept: func() {}, OnReject: func(err error) { t.Errorf("rejected: %v", err) },
			OnComplete: func(v any, err error) {
				if err != nil {
					t.Errorf("wake: %v", err)
					return
				}
				second, answeredAt = v.(TwinStatus), inspectedAt()
			},
		}, WakeRequest{Suspect: ready.Handle.ID})
	}, 30*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(StopTwinSignal, nil) }, time.Minute)
	env.ExecuteWorkflow(TwinWorkflowName, TwinInput{EnvID: "env_1", Active: build1, Idle: time.Hour, HealthEvery: time.Hour})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	for _, st := range []TwinStatus{first, second} {
		if st.State != twinstate.Ready || st.ErrorType != activities.ErrTypeEngineUnreachable || st.Handle == nil || st.Handle.ID != ready.Handle.ID {
			t.Errorf("suspect wake with the engine down = %+v, want the same ready twin with the engine error", st)
		}
	}
	if sentAt < 1 || answeredAt != sentAt {
		t.Errorf("the second suspect wake answered after %d inspections, sent after %d: want at once, before another", answeredAt, sentAt)
	}
}
