package twin

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// JournalEntry is one committed call of a session's journal.
type JournalEntry struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args"`
	// Content and Rung are the answer the call gave; a simulated answer is reused as-is.
	Content   string `json:"content"`
	Rung      string `json:"rung"`
	StateHash string `json:"state_hash"`
	// Injected is set for a call an injected fault answered (an error or a timeout): it never reached the world,
	// so a rebuild passes over it.
	Injected bool `json:"injected,omitempty"`
}

// Rebuild remakes a session from its spec and journal, replaying each call; it
// fails with ErrDiverged when a state hash differs from the journal's.
func (rt *Runtime) Rebuild(ctx context.Context, spec SessionSpec, journal []JournalEntry) (*Session, Receipts, error) {
	s, rc, err := rt.Open(spec)
	if err != nil {
		return nil, rc, err
	}
	for i, j := range journal {
		if j.Injected {
			if h := s.StateHash(); j.StateHash != "" && h != j.StateHash {
				return nil, rc, fmt.Errorf("%w: journal[%d] (%s, injected fault): state %s, journal says %s", ErrDiverged, i, j.Tool, h, j.StateHash)
			}
			continue
		}
		t := rt.tools[j.Tool]
		if t == nil {
			return nil, rc, fmt.Errorf("%w: journal[%d]: %w: %q", ErrDiverged, i, ErrUnknownTool, j.Tool)
		}
		av, err := jsonvalue.Parse(j.Args)
		if err != nil {
			return nil, rc, fmt.Errorf("%w: journal[%d].args: %w", ErrDiverged, i, err)
		}
		ao, ok := av.(*jsonvalue.Object)
		if !ok {
			return nil, rc, fmt.Errorf("%w: journal[%d].args: %w", ErrDiverged, i, ErrBadArguments)
		}
		var sim *string
		if j.Rung == RungSimulate {
			c := j.Content
			sim = &c
		}
		s.mu.Lock()
		var res Result
		if p := t.args.problem(t, j.Args, ao); p != "" {
			res = s.argsError(t, p)
		} else {
			res, err = s.call(ctx, t, ao, sim)
		}
		s.mu.Unlock()
		if err != nil {
			return nil, rc, fmt.Errorf("%w: journal[%d]: %w", ErrDiverged, i, err)
		}
		if j.StateHash != "" && res.StateHash != j.StateHash {
			return nil, rc, fmt.Errorf("%w: journal[%d] (%s): state %s, journal says %s", ErrDiverged, i, j.Tool, res.StateHash, j.StateHash)
		}
	}
	return s, rc, nil
}
