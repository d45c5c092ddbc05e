package twin

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
)

// fakeModel stands in for the model endpoint (an outside paid service): it answers
// from the request, and counts calls.
type fakeModel struct {
	mu    sync.Mutex
	calls int
	reply string
}

func (f *fakeModel) Simulate(_ context.Context, req SimRequest) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.reply, nil
}

func TestSimulate(t *testing.T) {
	sim := &fakeModel{reply: `{"ok": true}`}
	rt := newBank(t, RuntimeOptions{Simulator: sim})
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		res, err := s.Call(ctx, "nowhere", json.RawMessage(`{"q": 1}`))
		if err != nil || res.Rung != RungSimulate || res.Fidelity != FidelitySimulated || res.Content != `{"ok": true}` {
			t.Fatalf("simulate = %+v, %v", res, err)
		}
	}
	if sim.calls != 1 {
		t.Fatalf("simulator called %d times for the same state and arguments, want 1 (cached)", sim.calls)
	}
	// A write nothing else can answer is simulated, downgraded and changes nothing.
	h := s.StateHash()
	res, err := s.Call(ctx, "deposit", json.RawMessage(`{"id": "ghost", "amount": 1}`))
	if err != nil || res.Rung != RungSimulate || !res.Downgraded || res.Changed || s.StateHash() != h {
		t.Fatalf("simulated write = %+v, %v", res, err)
	}
	// A write bound to the model starts at simulate, and is still marked.
	res, err = s.Call(ctx, "wire_money", json.RawMessage(`{"to": "x"}`))
	if err != nil || !res.Downgraded || res.Changed {
		t.Fatalf("write bound to simulate = %+v, %v", res, err)
	}
	// An answer of the wrong type is rejected.
	sim.reply = `[1, 2]`
	if _, err := s.Call(ctx, "nowhere", json.RawMessage(`{"q": 2}`)); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("invalid simulated answer: %v, want ErrNoAnswer", err)
	}
}

// TestSimulatedToolWithoutModelFallsToRecordings: a tool bound to the model, with no model configured, is answered
// from the recordings — the same arguments' answer, else the nearest — labelled by that rung and downgraded
// (issue 13 defect 2: it answered nothing, "no simulator configured").
func TestSimulatedToolWithoutModelFallsToRecordings(t *testing.T) {
	b := bankBundle()
	for i := range b.Tools {
		if b.Tools[i].Name == "rates" {
			b.Tools[i].Rung = RungSimulate
		}
	}
	rt, err := NewRuntime(b, RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	res, err := s.Call(ctx, "rates", json.RawMessage(`{"cur": "USD"}`))
	if err != nil || res.Rung != RungReplay || res.Fidelity != FidelityReplayed || !res.Downgraded || res.Content != `{"cur": "USD", "rate": 1.0}` {
		t.Fatalf("recorded arguments = %+v, %v; want the replayed answer, downgraded", res, err)
	}
	res, err = s.Call(ctx, "rates", json.RawMessage(`{"cur": "GBP"}`))
	if err != nil || res.Rung != RungInfer || res.Fidelity != FidelityInferred || !res.Downgraded {
		t.Fatalf("unrecorded arguments = %+v, %v; want an inferred answer, downgraded", res, err)
	}
	// Nothing recorded and no model: still no answer, said so.
	if _, err := s.Call(ctx, "nowhere", json.RawMessage(`{"q": 1}`)); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("a tool nothing can answer: %v, want ErrNoAnswer", err)
	}
}
