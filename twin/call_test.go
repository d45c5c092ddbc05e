package twin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/jsonvalue"
)

func TestLadder(t *testing.T) {
	rt := newBank(t, RuntimeOptions{MaxSteps: 10_000})
	tests := []struct {
		name, tool, args string
		content          string
		isErr            bool
		rung             string
		downgraded       bool
	}{
		{"twin read", "get_account", `{"id": "acc_01"}`, `{"id": "acc_01", "owner": "Ann", "status": "open", "balance": 100, "history": []}`, false, RungTwin, false},
		{"tool error is a result", "get_account", `{"id": "nope"}`, `Error: account nope not found`, true, RungTwin, false},
		{"lookup folds case", "find_owner", `{"owner": "ann"}`, `acc_01`, false, RungTwin, false},
		{"replay", "rates", `{"cur": "USD"}`, `{"cur": "USD", "rate": 1.0}`, false, RungReplay, false},
		{"infer substitutes", "rates", `{"cur": "GBP"}`, `{"cur": "GBP", "rate": 1.1}`, false, RungInfer, true},
		{"provided", "echo", `{"x": 3}`, `echo 3`, false, RungProvided, false},
		{"provided fails, twin answers", "broken", `{}`, `synthesized`, false, RungTwin, true},
		{"step limit, replay answers", "spin", `{}`, `spun`, false, RungReplay, true},
		{"twin declines, infer answers", "deposit", `{"id": "zzz", "amount": 1}`, "", false, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, rt, SessionSpec{})
			res, err := s.Call(context.Background(), tt.tool, json.RawMessage(tt.args))
			if tt.rung == "" {
				if !errors.Is(err, ErrNoAnswer) {
					t.Fatalf("Call = %+v, %v; want ErrNoAnswer (deposit has no recordings)", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Content != tt.content || res.Error != tt.isErr || res.Rung != tt.rung || res.Downgraded != tt.downgraded {
				t.Fatalf("Call = %+v\nwant content %q error %v rung %s downgraded %v", res, tt.content, tt.isErr, tt.rung, tt.downgraded)
			}
			if res.Fidelity != FidelityOf(tt.rung) {
				t.Fatalf("fidelity %s for rung %s", res.Fidelity, res.Rung)
			}
		})
	}
}

func TestCallErrors(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	if _, err := s.Call(ctx, "no_such_tool", json.RawMessage(`{}`)); !errors.Is(err, ErrUnknownTool) || !strings.Contains(err.Error(), "no_such_tool") {
		t.Fatalf("unknown tool: %v", err)
	}
	for _, bad := range []string{`[1]`, `"x"`, `null`, `{`, ``} {
		if _, err := s.Call(ctx, "get_account", json.RawMessage(bad)); !errors.Is(err, ErrBadArguments) {
			t.Errorf("args %q: %v, want ErrBadArguments", bad, err)
		}
	}
	if _, err := s.Call(ctx, "nowhere", json.RawMessage(`{}`)); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("no simulator: %v, want ErrNoAnswer", err)
	}
	s.Close()
	if _, err := s.Call(ctx, "get_account", json.RawMessage(`{"id": "acc_01"}`)); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed session: %v", err)
	}
}

func TestCallBudget(t *testing.T) {
	rt := newBank(t, RuntimeOptions{MaxSteps: 1 << 40, CallBudget: 20 * time.Millisecond})
	s := open(t, rt, SessionSpec{})
	start := time.Now()
	res, err := s.Call(context.Background(), "spin", json.RawMessage(`{}`))
	if err != nil || res.Rung != RungReplay || !strings.Contains(res.Note, "time budget") {
		t.Fatalf("spin = %+v, %v", res, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("budget of 20ms took %v", d)
	}
}

func TestPreferRecorded(t *testing.T) {
	b := bankBundle()
	row, _ := jsonvalue.ParseString(b.Tables[0].Rows[0].JSON)
	b.Answers = append(b.Answers, `Error: deposits paused`)
	b.Recordings = append(b.Recordings, Recording{Tool: "deposit", Args: `{"amount":1,"id":"acc_01"}`, Answer: len(b.Answers) - 1,
		Error: true, State: Fingerprint(row.(*jsonvalue.Object)), Trace: "t3"})
	b.Tools[1].PreferRecorded = true
	rt, err := NewRuntime(b, RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	res, err := s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`))
	if err != nil || res.Rung != RungReplay || res.Content != "Error: deposits paused" || !res.Error || res.Downgraded {
		t.Fatalf("recorded answer from the same state: %+v, %v", res, err)
	}
	// Other arguments (or another state) go to the handler.
	res, err = s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 2}`))
	if err != nil || res.Rung != RungTwin || !res.Changed {
		t.Fatalf("deposit of 2: %+v, %v", res, err)
	}
	res, err = s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`))
	if err != nil || res.Rung != RungTwin {
		t.Fatalf("deposit of 1 from a changed state: %+v, %v", res, err)
	}
}
