package toolplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/doppel-dev/doppel/faults"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// errorAnswers lists each tool's distinct recorded error answers, in recording order (every tool of the bundle is
// a key, with none for a tool that never failed in the recordings). Cached per build.
func (p *Plane) errorAnswers(buildID string, b *twin.Bundle) map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m, ok := p.errAnswers[buildID]; ok {
		return m
	}
	m := make(map[string][]string, len(b.Tools))
	for _, t := range b.Tools {
		m[t.Name] = nil
	}
	seen := map[string]bool{}
	for _, r := range b.Recordings {
		if !r.Error || r.Answer < 0 || r.Answer >= len(b.Answers) {
			continue
		}
		k := r.Tool + "\x00" + b.Answers[r.Answer]
		if !seen[k] {
			seen[k] = true
			m[r.Tool] = append(m[r.Tool], b.Answers[r.Answer])
		}
	}
	if len(p.errAnswers) > 64 {
		clear(p.errAnswers)
	}
	p.errAnswers[buildID] = m
	return m
}

// checkFaults validates a session's fault plan against its build's tools and recordings.
func (p *Plane) checkFaults(ctx context.Context, sp faults.Spec, build *schema.Build) error {
	b, err := p.bundles.Get(ctx, build)
	if err != nil {
		return err
	}
	counts := map[string]int{}
	for tool, as := range p.errorAnswers(build.ID, b) {
		counts[tool] = len(as)
	}
	if err := sp.Validate(counts); err != nil {
		if fe, ok := err.(*faults.FieldError); ok {
			return invalid("body.faults."+fe.Field, fe.Detail)
		}
		return err
	}
	return nil
}

// Fault labels a call an injected fault answered or delayed.
type Fault struct {
	Kind      string `json:"kind"`
	LatencyMs int64  `json:"latency_ms"`
}

// drawFault answers the fault a call draws from the session's plan, and the twin's part of it (nil when the call
// runs as usual): the same seed fails the same calls, in any process and after any restart.
func (p *Plane) drawFault(s *schema.Session, l *liveSession, b *twin.Bundle, tool string, call int64) (*Fault, *rpc.Inject, error) {
	if len(s.Faults) == 0 {
		return nil, nil, nil
	}
	if l.faults == nil {
		var sp faults.Spec
		if err := json.Unmarshal(s.Faults, &sp); err != nil {
			return nil, nil, fmt.Errorf("fault plan of session %s: %w", s.ID, err)
		}
		l.faults = sp
	}
	answers := p.errorAnswers(s.BuildID, b)[tool]
	f, ok := l.faults.Draw(s.Seed, call, tool, len(answers))
	if !ok {
		return nil, nil, nil
	}
	label := &Fault{Kind: f.Kind, LatencyMs: f.LatencyMs}
	switch f.Kind {
	case faults.KindError:
		return label, &rpc.Inject{Content: answers[f.Answer], Fidelity: twin.FidelityReplayed, Rung: twin.RungReplay}, nil
	case faults.KindTimeout:
		return label, &rpc.Inject{Content: fmt.Sprintf("Error: the request timed out after %d ms", f.LatencyMs),
			Fidelity: twin.FidelitySimulated, Rung: twin.RungSimulate}, nil
	}
	return label, nil, nil
}

// wait sleeps a fault's latency before the call is run (so a caller that gives up meanwhile leaves nothing applied).
func wait(ctx context.Context, f *Fault) error {
	if f == nil || f.LatencyMs <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(f.LatencyMs) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// injected reports whether a journaled fault label is one that answered instead of the tool (the call never
// reached the world).
func injected(label json.RawMessage) bool {
	if len(label) == 0 {
		return false
	}
	var f Fault
	return json.Unmarshal(label, &f) == nil && (f.Kind == faults.KindError || f.Kind == faults.KindTimeout)
}
