package infer

import (
	"context"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/twin"
)

// Reproduction fidelity: can the twin reproduce a production conversation it never saw? Each held-out trace is
// replayed in a session opened from its own calls before its first write (the world that conversation saw, as a
// user would open it: twin.SessionSpec.Trace), and scored on every call from that write on — the writes and the
// reads after them — against the recorded answers. The first write is the first call of a tool the build from every
// trace calls a write, so every fold cuts a trace at the same call. State-changing calls are those write calls:
// how many of them the twin answered as production did is the measure EnvSimBench scores simulators by.

// ReproductionReport scores reproduction fidelity over the held-out traces, overall and per tool.
type ReproductionReport struct {
	// Traces counts the traces replayed (those with a write); Calls the calls scored, from each one's first write on.
	Traces        int     `json:"traces"`
	Calls         int     `json:"calls"`
	Agree         int     `json:"agree"`
	AgreementPct  float64 `json:"agreement_pct"`
	ShapeAgree    int     `json:"shape_agree"`
	ShapeAgreePct float64 `json:"shape_agree_pct"`
	ErrorAgree    int     `json:"error_agree"`
	ErrorAgreePct float64 `json:"error_agree_pct"`
	// StateChanging counts the scored calls of write tools, and StateChangingAgree those answered exactly as
	// production did.
	StateChanging         int              `json:"state_changing"`
	StateChangingAgree    int              `json:"state_changing_agree"`
	StateChangingAgreePct float64          `json:"state_changing_agree_pct"`
	Tools                 []ReproToolCheck `json:"tools"`
}

// ReproToolCheck is one tool's line of the reproduction report.
type ReproToolCheck struct {
	Name          string  `json:"name"`
	Write         bool    `json:"write,omitempty"`
	Calls         int     `json:"calls"`
	Agree         int     `json:"agree"`
	AgreementPct  float64 `json:"agreement_pct"`
	ShapeAgree    int     `json:"shape_agree"`
	ShapeAgreePct float64 `json:"shape_agree_pct"`
	ErrorAgree    int     `json:"error_agree"`
	ErrorAgreePct float64 `json:"error_agree_pct"`
	// Misses are the first few calls whose answer differed from the recorded one.
	Misses []CheckMiss `json:"misses,omitempty"`
}

// reproduction collects the reproduction replays of a self-check's folds: results[i] are trace i's scored calls.
type reproduction struct {
	writes map[string]bool // the write tools of the build from every trace
	// results are written by folds running concurrently, each only its own traces'.
	results [][]CheckedCall
}

func newReproduction(full *twin.Bundle, n int) *reproduction {
	rp := &reproduction{writes: map[string]bool{}, results: make([][]CheckedCall, n)}
	for _, t := range full.Tools {
		if t.Kind == twin.KindWrite {
			rp.writes[t.Name] = true
		}
	}
	return rp
}

// firstWrite is the index of pt's first call of a write tool (len(pt.calls) when it writes nothing).
func (rp *reproduction) firstWrite(pt *ptrace) int {
	for j, c := range pt.calls {
		if c.args != nil && rp.writes[c.tool] {
			return j
		}
	}
	return len(pt.calls)
}

// replay opens a session of rt from trace i's calls before its first write and scores its calls from that write on.
func (rp *reproduction) replay(ctx context.Context, rt *twin.Runtime, i int, pt *ptrace, maps map[string]twin.MapPaths) error {
	w := rp.firstWrite(pt)
	if w == len(pt.calls) {
		return nil
	}
	spec := &twin.TraceSpec{ID: pt.id}
	for _, c := range pt.calls[:w] {
		if c.answer && c.args != nil {
			spec.Calls = append(spec.Calls, twin.TraceCall{Tool: c.tool, Args: []byte(c.canon), Answer: c.text})
		}
	}
	s, _, err := rt.Open(twin.SessionSpec{Trace: spec})
	if err != nil {
		return err
	}
	var out []CheckedCall
	for _, c := range pt.calls[w:] {
		if c.args == nil {
			continue
		}
		r := CheckedCall{Tool: c.tool, Scored: c.answer, Write: rp.writes[c.tool]}
		res, err := s.Call(ctx, c.tool, []byte(c.canon))
		if err := score(&r, res, err, pt, c, maps); err != nil {
			return err
		}
		out = append(out, r)
	}
	rp.results[i] = out
	return nil
}

// report sums the replays, overall and per tool (most calls first).
func (rp *reproduction) report() *ReproductionReport {
	rep := &ReproductionReport{}
	tools := map[string]*ReproToolCheck{}
	for _, rs := range rp.results {
		if len(rs) > 0 {
			rep.Traces++
		}
		for _, r := range rs {
			if !r.Scored {
				continue
			}
			tc := tools[r.Tool]
			if tc == nil {
				tc = &ReproToolCheck{Name: r.Tool, Write: r.Write}
				tools[r.Tool] = tc
			}
			tc.Calls++
			rep.Calls++
			if r.Write {
				rep.StateChanging++
			}
			if r.Shape {
				tc.ShapeAgree++
				rep.ShapeAgree++
			}
			if r.ErrAgree {
				tc.ErrorAgree++
				rep.ErrorAgree++
			}
			if r.Agree {
				tc.Agree++
				rep.Agree++
				if r.Write {
					rep.StateChangingAgree++
				}
			} else if len(tc.Misses) < maxCheckMisses {
				tc.Misses = append(tc.Misses, r.Miss)
			}
		}
	}
	if rep.Calls > 0 {
		rep.AgreementPct, rep.ShapeAgreePct, rep.ErrorAgreePct = pct(rep.Agree, rep.Calls), pct(rep.ShapeAgree, rep.Calls), pct(rep.ErrorAgree, rep.Calls)
	}
	if rep.StateChanging > 0 {
		rep.StateChangingAgreePct = pct(rep.StateChangingAgree, rep.StateChanging)
	}
	for _, n := range sortedKeys(tools) {
		tc := tools[n]
		tc.AgreementPct, tc.ShapeAgreePct, tc.ErrorAgreePct = pct(tc.Agree, tc.Calls), pct(tc.ShapeAgree, tc.Calls), pct(tc.ErrorAgree, tc.Calls)
		rep.Tools = append(rep.Tools, *tc)
	}
	sort.SliceStable(rep.Tools, func(i, j int) bool { return rep.Tools[i].Calls > rep.Tools[j].Calls })
	return rep
}

// Headline is the report's clause in a build's headline ("" when nothing was measured).
func (r *ReproductionReport) Headline() string {
	if r == nil || r.Calls == 0 {
		return ""
	}
	return fmt.Sprintf("; reproduction from each trace's first write %.1f%% of %d calls exact (%d of %d state-changing calls)",
		r.AgreementPct, r.Calls, r.StateChangingAgree, r.StateChanging)
}
