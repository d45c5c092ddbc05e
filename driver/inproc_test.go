package driver

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

func loadTwin(_ context.Context, data []byte) (rpc.Runtime, error) {
	return rpc.NewTwinRuntime(data, twin.RuntimeOptions{})
}

func TestInproc(t *testing.T) {
	ctx := context.Background()
	if _, err := NewInproc(InprocOptions{}); err == nil {
		t.Fatal("NewInproc without Load: nil error")
	}
	d, err := NewInproc(InprocOptions{Load: loadTwin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAll(t, d) })
	h, err := d.Start(ctx, bankSpec("env_i"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if st := mustInspect(t, d, h); st.State != StateReady {
		t.Fatalf("Inspect = %+v", st)
	}
	c := rpc.NewClient(h.Addr, nil)
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	s := &session{id: "s"}
	if res := s.call(t, c, "get_account", `{"id":"a1"}`); !strings.Contains(res.Content, "10") {
		t.Fatalf("get_account = %+v", res)
	}
	if hs, _ := d.List(ctx); len(hs) != 1 || hs[0].ID != h.ID {
		t.Fatalf("List = %+v", hs)
	}
	// This process reaches the twin's sessions directly through the driver: the same session, no HTTP.
	direct := rpc.Dial(h.Addr, nil, d)
	if !direct.Local() {
		t.Fatalf("Dial(%s) through the driver: not local", h.Addr)
	}
	if res := s.call(t, direct, "get_account", `{"id":"a1"}`); !strings.Contains(res.Content, "10") || res.Calls != 2 {
		t.Fatalf("direct get_account = %+v, want the session's second call", res)
	}
	if _, ok := d.Local("http://127.0.0.1:1"); ok {
		t.Fatal("Local of an address the driver does not serve: found")
	}
	if err := d.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Local(h.Addr); ok {
		t.Fatal("Local after Stop: still found")
	}
	if _, err := direct.Call(ctx, "s", rpc.CallRequest{Tool: "get_account", Arguments: []byte(`{"id":"a1"}`)}); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("direct call after Stop: %v, want ErrUnreachable", err)
	}
	if st := mustInspect(t, d, h); st.State != StateGone {
		t.Fatalf("Inspect after Stop = %+v", st)
	}
	if err := c.Ready(ctx); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("Ready after Stop: %v", err)
	}

	garbage := Spec{EnvID: "e", BuildID: "b", BundlePath: bankPath, BundleHash: "sha256:wrong"}
	if _, err := d.Start(ctx, garbage); !errors.Is(err, ErrBundle) {
		t.Fatalf("Start with a wrong hash: %v, want ErrBundle", err)
	}
	bad, err := NewInproc(InprocOptions{Load: func(context.Context, []byte) (rpc.Runtime, error) {
		return nil, errors.New("cannot load")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Start(ctx, bankSpec("e")); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "cannot load") {
		t.Fatalf("Start with a failing load: %v", err)
	}
	if hs, _ := d.List(ctx); len(hs) != 0 {
		t.Fatalf("List after failures = %+v", hs)
	}
}
