package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

func newProcess(t testing.TB, stateDir string) *Process {
	t.Helper()
	d, err := NewProcess(ProcessOptions{Binary: twinBinary, StateDir: stateDir, Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func stopAll(t testing.TB, d Driver) {
	t.Helper()
	hs, err := d.List(context.Background())
	if err != nil {
		t.Errorf("List: %v", err)
	}
	for _, h := range hs {
		if err := d.Stop(context.Background(), h); err != nil {
			t.Errorf("Stop %s: %v", h.ID, err)
		}
	}
}

func TestProcessLifecycle(t *testing.T) {
	ctx := context.Background()
	d := newProcess(t, t.TempDir())
	t.Cleanup(func() { stopAll(t, d) })

	h, err := d.Start(ctx, bankSpec("env_1"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if h.Driver != ProcessDriverName || h.PID == 0 || !strings.HasPrefix(h.Addr, "http://127.0.0.1:") || h.EnvID != "env_1" {
		t.Fatalf("handle = %+v", h)
	}
	if st := mustInspect(t, d, h); st.State != StateReady {
		t.Fatalf("Inspect after Start = %+v, want ready", st)
	}
	if hs, _ := d.List(ctx); len(hs) != 1 || hs[0].ID != h.ID || hs[0].Addr != h.Addr {
		t.Fatalf("List = %+v, want the one twin", hs)
	}

	c := rpc.NewClient(h.Addr, nil)
	in, err := c.Info(ctx, false)
	if err != nil || in.BundleHash != twin.HashBytes(bankData) {
		t.Fatalf("Info = %+v, %v", in, err)
	}
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s1"}); err != nil {
		t.Fatal(err)
	}
	s := &session{id: "s1"}
	if res := s.call(t, c, "deposit", `{"id":"a1","amount":1}`); !strings.Contains(res.Content, "11") {
		t.Fatalf("deposit = %+v", res)
	}

	if err := d.Stop(ctx, h); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st := mustInspect(t, d, h); st.State != StateGone && st.State != StateExited {
		t.Fatalf("Inspect after Stop = %+v", st)
	}
	if alive(h.PID, "") {
		t.Fatalf("pid %d still alive after Stop", h.PID)
	}
	if hs, _ := d.List(ctx); len(hs) != 0 {
		t.Fatalf("List after Stop = %+v", hs)
	}
	if err := d.Stop(ctx, h); err != nil {
		t.Fatalf("second Stop: %v, want nil", err)
	}
	if err := c.Ready(ctx); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("Ready after Stop: %v, want ErrUnreachable", err)
	}
}

// kill -9 of the twin mid-session: the next call fails as unreachable, a restarted twin does not know the session,
// and the session rebuilt from its journal has the state_hash it had before the kill.
func TestProcessKillRebuild(t *testing.T) {
	ctx := context.Background()
	d := newProcess(t, t.TempDir())
	t.Cleanup(func() { stopAll(t, d) })
	spec := bankSpec("env_k")

	h, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := rpc.NewClient(h.Addr, nil)
	s := &session{id: "ses_k", spec: rpc.SessionSpec{Seed: 42, Clock: "2025-03-01T12:00:00Z"}}
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec}); err != nil {
		t.Fatal(err)
	}
	s.call(t, c, "deposit", `{"id":"a1","amount":5}`)
	s.call(t, c, "get_account", `{"id":"nope"}`)
	s.call(t, c, "deposit", `{"id":"a2","amount":3}`)
	before, err := c.Session(ctx, s.id)
	if err != nil {
		t.Fatal(err)
	}

	if err := syscall.Kill(h.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, s.id, rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)})
	if !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("call after kill -9: %v, want ErrUnreachable", err)
	}
	waitState(t, d, h, StateExited)

	h2, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := d.Stop(ctx, h); err != nil { // clears the dead twin's record
		t.Fatal(err)
	}
	c2 := rpc.NewClient(h2.Addr, nil)
	if _, err := c2.Call(ctx, s.id, rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)}); !errors.Is(err, rpc.ErrUnknownSession) {
		t.Fatalf("call on the restarted twin: %v, want ErrUnknownSession", err)
	}
	rebuilt, err := c2.Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec, Journal: s.journal})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if rebuilt.StateHash != before.StateHash || rebuilt.Calls != before.Calls {
		t.Fatalf("rebuilt %s after %d calls, before the kill %s after %d", rebuilt.StateHash, rebuilt.Calls, before.StateHash, before.Calls)
	}
	if res := s.call(t, c2, "get_account", `{"id":"a1"}`); !strings.Contains(res.Content, "15") {
		t.Fatalf("get_account after rebuild = %+v, want balance 15", res)
	}
}

func waitState(t testing.TB, d Driver, h Handle, want State) {
	t.Helper()
	for i := 0; ; i++ {
		st := mustInspect(t, d, h)
		if st.State == want {
			return
		}
		if i > 400 {
			t.Fatalf("state %+v, want %s", st, want)
		}
		sleep(5)
	}
}

// A worker that crashes leaves its twins running; a new driver over the same state dir finds them, and its
// reconciler stops those nobody owns and clears the records of dead ones.
func TestProcessReconcileAfterCrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	crashed := newProcess(t, dir)
	a, err := crashed.Start(ctx, bankSpec("env_a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := crashed.Start(ctx, bankSpec("env_b"))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := crashed.Start(ctx, bankSpec("env_dead"))
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(dead.PID, syscall.SIGKILL)
	waitState(t, crashed, dead, StateExited)

	d := newProcess(t, dir) // the restarted worker
	t.Cleanup(func() { stopAll(t, d) })
	hs, err := d.List(ctx)
	if err != nil || len(hs) != 2 {
		t.Fatalf("List after restart = %+v, %v; want env_a and env_b", hs, err)
	}
	if st := mustInspect(t, d, a); st.State != StateReady {
		t.Fatalf("Inspect of an adopted twin = %+v", st)
	}
	removed, err := d.Reconcile(ctx, func(h Handle) bool { return h.EnvID == "env_b" }, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, h := range removed {
		ids[h.ID] = true
	}
	if len(removed) != 2 || !ids[a.ID] || !ids[dead.ID] {
		t.Fatalf("Reconcile removed %+v, want env_a's and the dead twin's", removed)
	}
	waitGone(t, a.PID)
	if !alive(b.PID, "") {
		t.Fatal("Reconcile stopped the kept twin")
	}
	if _, err := os.Stat(filepath.Join(dir, "twins", dead.ID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead twin's record is still there: %v", err)
	}
	// Grace keeps young twins.
	removed, err = d.Reconcile(ctx, func(Handle) bool { return false }, 1e12)
	if err != nil || len(removed) != 0 {
		t.Fatalf("Reconcile within grace removed %+v, %v", removed, err)
	}
}

func sleep(ms int) { time.Sleep(time.Duration(ms) * time.Millisecond) }

func waitGone(t testing.TB, pid int) {
	t.Helper()
	for i := 0; alive(pid, ""); i++ {
		if i > 400 {
			t.Fatalf("pid %d still alive", pid)
		}
		sleep(5)
	}
}

func TestProcessStartFailures(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d := newProcess(t, dir)
	t.Cleanup(func() { stopAll(t, d) })
	garbage := filepath.Join(t.TempDir(), "garbage.json")
	if err := os.WriteFile(garbage, []byte(`{"format": 999}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec Spec
		want error
		text string
	}{
		{"no env", Spec{BuildID: "b", BundlePath: bankPath}, nil, "env_id"},
		{"no bundle", Spec{EnvID: "e", BuildID: "b"}, nil, "bundle_key or bundle_path"},
		{"both bundles", Spec{EnvID: "e", BuildID: "b", BundlePath: bankPath, BundleKey: "k"}, nil, "only one"},
		{"missing file", Spec{EnvID: "e", BuildID: "b", BundlePath: filepath.Join(dir, "nope")}, ErrBundle, "nope"},
		{"key without store", Spec{EnvID: "e", BuildID: "b", BundleKey: "bundles/x"}, ErrBundle, "no blob store"},
		{"bad bundle", Spec{EnvID: "e", BuildID: "b", BundlePath: garbage}, ErrNotReady, "format"},
		{"hash mismatch", Spec{EnvID: "e", BuildID: "b", BundlePath: bankPath, BundleHash: "sha256:00"}, ErrBundle, "sha256:00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Start(ctx, tt.spec)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Start: %v; want %v mentioning %q", err, tt.want, tt.text)
			}
			if hs, _ := d.List(ctx); len(hs) != 0 {
				t.Fatalf("a failed Start left twins: %+v", hs)
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, "twins")); len(ents) != 0 {
				t.Fatalf("a failed Start left files: %v", ents)
			}
		})
	}
}

func TestProcessBundleFromBlobs(t *testing.T) {
	ctx := context.Background()
	blobs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(blobs, "bundles"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blobs, "bundles", "bank"), bankData, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := NewProcess(ProcessOptions{Binary: twinBinary, StateDir: t.TempDir(), Blobs: dirBlobs(blobs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAll(t, d) })
	spec := Spec{EnvID: "env_blob", BuildID: "b", BundleKey: "bundles/bank", BundleHash: twin.HashBytes(bankData)}
	h, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start from a blob key: %v", err)
	}
	// The fetched bundle is cached: a second twin starts with the blob gone.
	if err := os.Remove(filepath.Join(blobs, "bundles", "bank")); err != nil {
		t.Fatal(err)
	}
	h2, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("second Start from the cache: %v", err)
	}
	if h.Addr == h2.Addr {
		t.Fatal("two twins share an address")
	}
	if _, err := d.Start(ctx, Spec{EnvID: "e", BuildID: "b", BundleKey: "bundles/missing"}); !errors.Is(err, ErrBundle) {
		t.Fatalf("Start from a missing key: %v, want ErrBundle", err)
	}
}

// kill -9 mid-session on the real tau-retail bundle: a recorded conversation's calls (reads and writes through the
// synthesized handlers) are rebuilt in a fresh twin process to the same state_hash.
func TestProcessKillRebuildTauRetail(t *testing.T) {
	ctx := context.Background()
	spec := benchSpec(t, "env_tau")
	d := newProcess(t, t.TempDir())
	t.Cleanup(func() { stopAll(t, d) })
	h, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := rpc.NewClient(h.Addr, nil)
	s := &session{id: "ses_tau", spec: rpc.SessionSpec{Seed: 1234}}
	open, err := c.Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for _, call := range tauRetail.session {
		res := s.call(t, c, call.Tool, call.RawArgs)
		if len(s.journal) > 1 && res.StateHash != s.journal[len(s.journal)-2].StateHash || len(s.journal) == 1 && res.StateHash != open.StateHash {
			changed++
		}
	}
	if changed == 0 {
		t.Fatalf("none of the %d recorded calls changed the world; the test would prove nothing", len(s.journal))
	}
	before := s.lastHash()
	if err := syscall.Kill(h.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitState(t, d, h, StateExited)
	h2, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt, err := rpc.NewClient(h2.Addr, nil).Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec, Journal: s.journal})
	if err != nil {
		t.Fatalf("rebuild of %d calls: %v", len(s.journal), err)
	}
	if rebuilt.StateHash != before {
		t.Fatalf("rebuilt state %s, before the kill %s", rebuilt.StateHash, before)
	}
	t.Logf("%d calls (%d changed the world) rebuilt to %s", len(s.journal), changed, before)
}

// A handle another driver made (twin.driver changed between runs) is gone as far as this driver can tell, so the
// TwinWorkflow holding it starts the twin again instead of keeping a handle it can never inspect.
func TestInspectForeignHandle(t *testing.T) {
	h := Handle{Driver: InprocDriverName, ID: "inproc-env-1", Addr: "http://127.0.0.1:1"}
	st, err := newProcess(t, t.TempDir()).Inspect(context.Background(), h)
	if err != nil || st.State != StateGone || !strings.Contains(st.Detail, "inproc driver") {
		t.Fatalf("process Inspect of an inproc handle = %+v, %v; want gone, naming the other driver", st, err)
	}
	d, err := NewInproc(InprocOptions{Load: loadTwin})
	if err != nil {
		t.Fatal(err)
	}
	h.Driver, h.ID = ProcessDriverName, "p-1"
	if st, err := d.Inspect(context.Background(), h); err != nil || st.State != StateGone {
		t.Fatalf("inproc Inspect of a process handle = %+v, %v; want gone", st, err)
	}
}
