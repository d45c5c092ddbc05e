package activities

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
	"github.com/doppel-dev/doppel/twinstate"
)

// fileBlobs reads blobs from files under a directory.
type fileBlobs string

func (d fileBlobs) Get(_ context.Context, key string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(key)))
}

// bankBlobs stores the bank bundle under key "bundles/bank" and returns the store and the build naming it.
func bankBlobs(t *testing.T) (fileBlobs, twinstate.Build) {
	t.Helper()
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bundles"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundles", "bank"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return fileBlobs(dir), twinstate.Build{BuildID: "bld_1", BundleKey: "bundles/bank", BundleHash: twin.HashBytes(data)}
}

func newActivityEnv(a *Twins) *testsuite.TestActivityEnvironment {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(a)
	return env
}

func TestTwinActivities(t *testing.T) {
	blobs, build := bankBlobs(t)
	d, err := driver.NewInproc(driver.InprocOptions{Blobs: blobs, Load: func(_ context.Context, data []byte) (rpc.Runtime, error) {
		return rpc.NewTwinRuntime(data, twin.RuntimeOptions{})
	}})
	if err != nil {
		t.Fatal(err)
	}
	a := &Twins{Driver: d}
	env := newActivityEnv(a)

	v, err := env.ExecuteActivity(a.StartTwin, StartTwinInput{EnvID: "env_1", Build: build})
	if err != nil {
		t.Fatalf("StartTwin: %v", err)
	}
	var h driver.Handle
	if err := v.Get(&h); err != nil {
		t.Fatal(err)
	}
	if h.EnvID != "env_1" || h.BuildID != "bld_1" || h.Addr == "" {
		t.Fatalf("handle = %+v", h)
	}

	c := rpc.NewClient(h.Addr, nil)
	if _, err := c.Open(context.Background(), rpc.OpenRequest{ID: "s1"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	health := inspect(t, env, a, h)
	if health.State != driver.StateReady || health.Sessions != 1 || health.IdleFor < 30*time.Millisecond {
		t.Fatalf("InspectTwin = %+v, want ready, 1 session, idle >= 30ms", health)
	}

	if _, err := env.ExecuteActivity(a.StopTwin, h); err != nil {
		t.Fatalf("StopTwin: %v", err)
	}
	if health := inspect(t, env, a, h); health.State != driver.StateGone {
		t.Fatalf("InspectTwin after StopTwin = %+v, want gone", health)
	}
	if _, err := env.ExecuteActivity(a.StopTwin, h); err != nil {
		t.Fatalf("second StopTwin: %v", err)
	}
	// The in-process driver cannot reconcile: reaping does nothing.
	if v, err := env.ExecuteActivity(a.ReapTwins, ReapTwinsInput{EnvID: "env_1"}); err != nil {
		t.Fatalf("ReapTwins: %v", err)
	} else if removed := mustHandles(t, v.Get); len(removed) != 0 {
		t.Fatalf("ReapTwins removed %+v", removed)
	}
}

func inspect(t *testing.T, env *testsuite.TestActivityEnvironment, a *Twins, h driver.Handle) TwinHealth {
	t.Helper()
	v, err := env.ExecuteActivity(a.InspectTwin, h)
	if err != nil {
		t.Fatalf("InspectTwin: %v", err)
	}
	var out TwinHealth
	if err := v.Get(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustHandles(t *testing.T, get func(any) error) []driver.Handle {
	t.Helper()
	var hs []driver.Handle
	if err := get(&hs); err != nil {
		t.Fatal(err)
	}
	return hs
}

// Driver failures become application errors the workflow tells apart; those retrying cannot fix are not retryable.
func TestStartTwinErrors(t *testing.T) {
	blobs, build := bankBlobs(t)
	d, err := driver.NewInproc(driver.InprocOptions{Blobs: blobs, Load: func(_ context.Context, data []byte) (rpc.Runtime, error) {
		return rpc.NewTwinRuntime(data, twin.RuntimeOptions{})
	}})
	if err != nil {
		t.Fatal(err)
	}
	a := &Twins{Driver: d}
	env := newActivityEnv(a)
	tests := []struct {
		name      string
		in        StartTwinInput
		errType   string
		retryable bool
	}{
		{"missing bundle", StartTwinInput{EnvID: "e", Build: twinstate.Build{BuildID: "b", BundleKey: "bundles/none"}}, ErrTypeTwinBundle, false},
		{"wrong hash", StartTwinInput{EnvID: "e", Build: twinstate.Build{BuildID: "b", BundleKey: build.BundleKey, BundleHash: "sha256:00"}}, ErrTypeTwinBundle, false},
		{"no env", StartTwinInput{Build: build}, ErrTypeBadInput, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := env.ExecuteActivity(a.StartTwin, tt.in)
			var appErr *temporal.ApplicationError
			if !errors.As(err, &appErr) || appErr.Type() != tt.errType || appErr.NonRetryable() == tt.retryable {
				t.Fatalf("StartTwin: %v; want application error %s (retryable %v)", err, tt.errType, tt.retryable)
			}
		})
	}

	broken, err := driver.NewInproc(driver.InprocOptions{Blobs: blobs, Load: func(context.Context, []byte) (rpc.Runtime, error) {
		return nil, errors.New("out of memory")
	}})
	if err != nil {
		t.Fatal(err)
	}
	b := &Twins{Driver: broken}
	_, err = newActivityEnv(b).ExecuteActivity(b.StartTwin, StartTwinInput{EnvID: "e", Build: build})
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != ErrTypeTwinNotReady || appErr.NonRetryable() {
		t.Fatalf("StartTwin of a twin that fails to load: %v; want a retryable %s", err, ErrTypeTwinNotReady)
	}
}

// TestStopForeignTwin: stopping a handle another driver made (twin.driver changed across a restart) fails at once,
// not retryable (issue 13 defect 10: it was retried five times, delaying the first open by 16 s).
func TestStopForeignTwin(t *testing.T) {
	d, err := driver.NewProcess(driver.ProcessOptions{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a := &Twins{Driver: d}
	_, err = newActivityEnv(a).ExecuteActivity(a.StopTwin, driver.Handle{Driver: driver.DockerDriverName, ID: "c0ffee", EnvID: "e"})
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != ErrTypeForeignHandle || !appErr.NonRetryable() {
		t.Fatalf("StopTwin of a docker handle on the process driver: %v; want a non-retryable %s", err, ErrTypeForeignHandle)
	}
}

// ReapTwins removes the environment's twins nobody holds, through a driver that can reconcile (child processes of
// a real twin binary), and leaves other environments' twins alone.
func TestReapTwins(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "twin")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/doppel-dev/doppel/driver/internal/twinmain")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the twin binary: %v\n%s", err, out)
	}
	blobs, build := bankBlobs(t)
	d, err := driver.NewProcess(driver.ProcessOptions{Binary: bin, StateDir: t.TempDir(), Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		hs, _ := d.List(ctx)
		for _, h := range hs {
			_ = d.Stop(ctx, h)
		}
	})
	start := func(env string) driver.Handle {
		h, err := d.Start(ctx, driver.Spec{EnvID: env, BuildID: build.BuildID, BundleKey: build.BundleKey})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	held, orphan, other := start("env_1"), start("env_1"), start("env_2")

	a := &Twins{Driver: d}
	env := newActivityEnv(a)
	v, err := env.ExecuteActivity(a.ReapTwins, ReapTwinsInput{EnvID: "env_1", Keep: []string{held.ID}})
	if err != nil {
		t.Fatal(err)
	}
	removed := mustHandles(t, v.Get)
	if len(removed) != 1 || removed[0].ID != orphan.ID {
		t.Fatalf("ReapTwins removed %+v, want only %s", removed, orphan.ID)
	}
	for _, h := range []driver.Handle{held, other} {
		if st, _ := d.Inspect(ctx, h); st.State != driver.StateReady {
			t.Fatalf("twin %s (%s) after reaping: %+v", h.ID, h.EnvID, st)
		}
	}
	// Grace keeps young twins.
	v, err = env.ExecuteActivity(a.ReapTwins, ReapTwinsInput{EnvID: "env_1", Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if removed := mustHandles(t, v.Get); len(removed) != 0 {
		t.Fatalf("ReapTwins within grace removed %+v", removed)
	}
}
