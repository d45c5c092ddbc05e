package rpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// counterRuntime is a transport-test stand-in for the twin runtime: each session world is one integer, started at
// the seed. Tools: "add" {"by": int} adds, "get" {} reads, "fail" {} answers a tool error. It exists only to test the
// RPC's transport; the real runtime is twin.Runtime (see bundle.go).
type counterRuntime struct{ hash string }

type counterSession struct{ v int64 }

func (r counterRuntime) BundleHash() string { return r.hash }

func (r counterRuntime) Open(spec SessionSpec) (Session, Receipts, error) {
	if spec.Seed < 0 {
		return nil, Receipts{}, fmt.Errorf("%w: seed: must be >= 0", ErrBadSpec)
	}
	s := &counterSession{v: spec.Seed}
	return s, Receipts{Seed: spec.Seed, WorldHash: s.StateHash(), SeedInstructions: spec.SeedInstructions}, nil
}

func (r counterRuntime) Rebuild(ctx context.Context, spec SessionSpec, journal []JournalEntry) (Session, Receipts, error) {
	sess, rec, err := r.Open(spec)
	if err != nil {
		return nil, Receipts{}, err
	}
	for i, e := range journal {
		res, err := sess.Call(ctx, e.Tool, e.Arguments)
		if err != nil {
			return nil, Receipts{}, fmt.Errorf("replay journal[%d]: %w", i, err)
		}
		if res.StateHash != e.StateHash {
			return nil, Receipts{}, fmt.Errorf("%w: journal[%d] state_hash %s, replay %s", ErrDiverged, i, e.StateHash, res.StateHash)
		}
	}
	return sess, rec, nil
}

func (s *counterSession) Close() {}

func (s *counterSession) StateHash() string {
	sum := sha256.Sum256([]byte(fmt.Sprint(s.v)))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *counterSession) Call(_ context.Context, tool string, args json.RawMessage) (CallResult, error) {
	res := CallResult{Fidelity: "B_twin", Rung: "twin"}
	switch tool {
	case "add":
		var a struct {
			By *int64 `json:"by"`
		}
		if err := json.Unmarshal(args, &a); err != nil || a.By == nil {
			return CallResult{}, fmt.Errorf("%w: add: by: required integer", ErrBadArguments)
		}
		s.v += *a.By
		res.Content = fmt.Sprint(s.v)
	case "get":
		res.Content = fmt.Sprint(s.v)
	case "fail":
		res.Content, res.Error = "Error: nothing to fail", true
	case "panic": // a runtime bug halfway through a write
		s.v++
		panic("counter: boom")
	default:
		return CallResult{}, fmt.Errorf("%w: %q", ErrUnknownTool, tool)
	}
	res.StateHash = s.StateHash()
	return res, nil
}
