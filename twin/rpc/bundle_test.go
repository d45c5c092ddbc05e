package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
)

func bankBundle(t testing.TB) []byte {
	t.Helper()
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestTwinRuntimeOverRPC(t *testing.T) {
	ctx := context.Background()
	data := bankBundle(t)
	path := filepath.Join(t.TempDir(), "bundle.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rt, err := BundleFile(path, twin.RuntimeOptions{})(ctx)
	if err != nil {
		t.Fatalf("BundleFile: %v", err)
	}
	if rt.BundleHash() != twin.HashBytes(data) {
		t.Fatalf("BundleHash = %s, want %s", rt.BundleHash(), twin.HashBytes(data))
	}
	srv := NewServer(ServerOptions{})
	srv.SetRuntime(rt)
	hs := httptest.NewServer(srv)
	defer hs.Close()
	c := NewClient(hs.URL, nil)

	spec := SessionSpec{Seed: 3}
	open, err := c.Open(ctx, OpenRequest{ID: "ses_a", Spec: spec})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !strings.HasPrefix(open.Receipts.WorldHash, "sha256:") || open.StateHash != open.Receipts.WorldHash {
		t.Fatalf("Open = %+v", open)
	}
	var journal []JournalEntry
	for _, call := range []struct{ tool, args string }{
		{"deposit", `{"id":"a1","amount":5}`},
		{"get_account", `{"id":"zz"}`},
		{"deposit", `{"id":"a2","amount":7}`},
	} {
		res, err := c.Call(ctx, "ses_a", CallRequest{Tool: call.tool, Arguments: json.RawMessage(call.args)})
		if err != nil {
			t.Fatalf("Call %s: %v", call.tool, err)
		}
		if res.Fidelity != twin.FidelityExecuted || res.Rung != twin.RungProvided {
			t.Fatalf("Call %s = %+v, want A_executed from the provided rung", call.tool, res)
		}
		journal = append(journal, JournalEntry{Tool: call.tool, Arguments: json.RawMessage(call.args), Content: res.Content,
			Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung, StateHash: res.StateHash})
	}
	if !journal[1].Error || journal[0].StateHash == open.StateHash || journal[2].StateHash == journal[0].StateHash {
		t.Fatalf("journal = %+v: want a tool error on the unknown account and a new state after each deposit", journal)
	}
	res, err := c.Call(ctx, "ses_a", CallRequest{Tool: "get_account", Arguments: json.RawMessage(`{"id":"a1"}`)})
	if err != nil || !strings.Contains(res.Content, "15") {
		t.Fatalf("get_account a1 after a deposit of 5 = %+v, %v", res, err)
	}

	// Another session starts from the base world.
	other, err := c.Open(ctx, OpenRequest{ID: "ses_b", Spec: spec})
	if err != nil || other.StateHash != open.StateHash {
		t.Fatalf("second session = %+v, %v; want the same world hash %s", other, err, open.StateHash)
	}

	// A rebuild on another runtime (as after a twin restart) reaches the same state.
	rt2, err := BundleBytes(data, twin.RuntimeOptions{})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv2 := NewServer(ServerOptions{})
	srv2.SetRuntime(rt2)
	hs2 := httptest.NewServer(srv2)
	defer hs2.Close()
	c2 := NewClient(hs2.URL, nil)
	rebuilt, err := c2.Open(ctx, OpenRequest{ID: "ses_a", Spec: spec, Journal: journal})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if rebuilt.StateHash != journal[2].StateHash {
		t.Fatalf("rebuilt state %s, journal's last %s", rebuilt.StateHash, journal[2].StateHash)
	}
	bad := append([]JournalEntry(nil), journal...)
	bad[0].Arguments = json.RawMessage(`{"id":"a1","amount":6}`)
	if _, err := c2.Open(ctx, OpenRequest{ID: "ses_x", Spec: spec, Journal: bad}); !errors.Is(err, ErrDiverged) {
		t.Fatalf("rebuild of an altered journal: %v, want ErrDiverged", err)
	}

	// The twin's own errors map to the RPC's.
	if _, err := c.Call(ctx, "ses_a", CallRequest{Tool: "transfer", Arguments: json.RawMessage(`{}`)}); !errors.Is(err, ErrUnknownTool) || !strings.Contains(err.Error(), "transfer") {
		t.Fatalf("unknown tool: %v", err)
	}
	if _, err := c.Open(ctx, OpenRequest{ID: "ses_c", Spec: SessionSpec{Clock: "yesterday"}}); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("bad clock: %v, want ErrBadSpec naming clock", err)
	}
	if _, err := c.Open(ctx, OpenRequest{ID: "ses_c", Spec: SessionSpec{Scenario: "nope"}}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("unknown scenario: %v, want ErrBadSpec", err)
	}
}

func TestBundleLoadErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := BundleFile(filepath.Join(t.TempDir(), "missing.json"), twin.RuntimeOptions{})(ctx); err == nil {
		t.Fatal("BundleFile of a missing file: nil error")
	}
	if _, err := BundleBytes([]byte(`{"format": 999}`), twin.RuntimeOptions{})(ctx); !errors.Is(err, twin.ErrBadBundle) {
		t.Fatalf("BundleBytes of a bad bundle: %v, want twin.ErrBadBundle", err)
	}
}
