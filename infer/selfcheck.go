package infer

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// SelfCheckReport scores how faithfully twins reproduce recorded answers.
type SelfCheckReport struct {
	// Mode is "leave-one-out" (each trace against a build without it) or "replay"
	// (each trace against the build from all traces).
	Mode   string `json:"mode"`
	Traces int    `json:"traces"`
	// Calls are the scored calls (answered, with JSON-object arguments); Agree those whose
	// answer was JSON-equal (or text-equal) to the recorded one.
	Calls        int            `json:"calls"`
	Agree        int            `json:"agree"`
	AgreementPct float64        `json:"agreement_pct"`
	Fidelity     map[string]int `json:"fidelity"`
	// Unanswered counts calls no rung could answer (or whose tool the build did not know).
	Unanswered int `json:"unanswered"`
	// Covered counts the calls the twin's world could know the answer to: the tool has no
	// entity, or the entity it names (or a lookup finds) was in the session's world before
	// the call, or production answered with an error. CoveredAgree is how many of them agree.
	Covered         int         `json:"covered"`
	CoveredAgree    int         `json:"covered_agree"`
	CoveredAgreePct float64     `json:"covered_agree_pct"`
	Tools           []ToolCheck `json:"tools"`
}

// ToolCheck is one tool's self-check line.
type ToolCheck struct {
	Name string `json:"name"`
	// Binding and Rung are the tool's in the build from all traces.
	Binding      string         `json:"binding"`
	Rung         string         `json:"rung"`
	Kind         string         `json:"kind"`
	Calls        int            `json:"calls"`
	Agree        int            `json:"agree"`
	AgreementPct float64        `json:"agreement_pct"`
	Fidelity     map[string]int `json:"fidelity"`
	// AgreeByFidelity counts agreeing answers per fidelity label.
	AgreeByFidelity map[string]int `json:"agree_by_fidelity"`
	Unanswered      int            `json:"unanswered"`
	// Known counts the calls of a read tool whose entity the session's world held before
	// the call; KnownTwin those of them the twin rung answered.
	Known        int `json:"known"`
	KnownTwin    int `json:"known_twin"`
	Covered      int `json:"covered"`
	CoveredAgree int `json:"covered_agree"`
	// Misses are the first few calls whose answer differed from the recorded one.
	Misses []CheckMiss `json:"misses,omitempty"`
}

// CheckMiss is one self-check disagreement.
type CheckMiss struct {
	Trace    string `json:"trace"`
	Call     int    `json:"call"`
	Args     string `json:"args"`
	Fidelity string `json:"fidelity"`
	Want     string `json:"want"`
	Got      string `json:"got"`
}

// maxCheckMisses bounds the misses kept per tool.
const maxCheckMisses = 20

// SelfCheck replays every trace's calls, in order, in a fresh session of a twin
// built from the other traces (leave-one-out), and scores agreement with the
// recorded answers per tool.
func SelfCheck(traces []trace.Trace, opts Options) (*SelfCheckReport, error) {
	return check(traces, opts, true)
}

// ReplayCheck is SelfCheck against one build from all traces (not leave-one-out):
// how well the twin reproduces what it was built from.
func ReplayCheck(traces []trace.Trace, opts Options) (*SelfCheckReport, error) {
	return check(traces, opts, false)
}

func check(traces []trace.Trace, opts Options, loo bool) (*SelfCheckReport, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	w := &warnings{}
	pts := prepare(traces, w)
	full, _, err := buildPrepared(pts, &opts, w)
	if err != nil {
		return nil, err
	}
	rep := &SelfCheckReport{Mode: "replay", Traces: len(pts), Fidelity: map[string]int{}}
	if loo {
		rep.Mode = "leave-one-out"
	}
	tools := map[string]*ToolCheck{}
	for _, t := range full.Tools {
		tools[t.Name] = &ToolCheck{Name: t.Name, Binding: t.Binding, Rung: t.Rung, Kind: t.Kind,
			Fidelity: map[string]int{}, AgreeByFidelity: map[string]int{}}
	}
	var fullRT *twin.Runtime
	if !loo {
		if fullRT, err = twin.NewRuntime(full, twin.RuntimeOptions{}); err != nil {
			return nil, err
		}
	}
	ctx := context.Background()
	for i, pt := range pts {
		rt := fullRT
		if loo {
			others := make([]*ptrace, 0, len(pts)-1)
			others = append(others, pts[:i]...)
			others = append(others, pts[i+1:]...)
			b, _, err := buildPrepared(others, &opts, &warnings{})
			if err != nil {
				return nil, fmt.Errorf("self-check without trace %s: %w", pt.id, err)
			}
			if rt, err = twin.NewRuntime(b, twin.RuntimeOptions{}); err != nil {
				return nil, fmt.Errorf("self-check without trace %s: %w", pt.id, err)
			}
		}
		s, _, err := rt.Open(twin.SessionSpec{})
		if err != nil {
			return nil, err
		}
		for _, c := range pt.calls {
			if c.args == nil {
				continue
			}
			tc := tools[c.tool]
			if tc == nil {
				tc = &ToolCheck{Name: c.tool, Fidelity: map[string]int{}, AgreeByFidelity: map[string]int{}}
				tools[c.tool] = tc
			}
			known, covered := false, c.isErr
			if def, ok := rt.Bundle().ToolByName(c.tool); ok {
				switch {
				case def.Table != "" && def.KeyArg != "":
					if kv, ok := c.args.Get(def.KeyArg); ok {
						if k, ok := scalarText(kv); ok {
							_, known = s.Row(def.Table, k)
						}
					}
					covered = covered || known
					known = known && def.Kind == twin.KindRead
				case def.Kind == twin.KindLookup && def.Table != "":
					if k, ok := lookupKey(c); ok {
						_, found := s.Row(def.Table, k)
						covered = covered || found
					}
				default:
					covered = true
				}
			}
			res, err := s.Call(ctx, c.tool, []byte(c.canon))
			if !c.answer {
				continue
			}
			if known {
				tc.Known++
				if err == nil && res.Rung == twin.RungTwin {
					tc.KnownTwin++
				}
			}
			tc.Calls++
			rep.Calls++
			if err != nil {
				if !errors.Is(err, twin.ErrUnknownTool) && !errors.Is(err, twin.ErrNoAnswer) {
					return nil, fmt.Errorf("self-check %s call %d (%s): %w", pt.id, c.idx, c.tool, err)
				}
				tc.Unanswered++
				rep.Unanswered++
				if covered {
					tc.Covered++
					rep.Covered++
				}
				if len(tc.Misses) < maxCheckMisses {
					tc.Misses = append(tc.Misses, CheckMiss{Trace: pt.id, Call: c.idx, Args: c.canon, Want: c.text, Got: err.Error()})
				}
				continue
			}
			tc.Fidelity[res.Fidelity]++
			rep.Fidelity[res.Fidelity]++
			agree := twin.AnswersAgree(res.Content, c.text)
			if covered {
				tc.Covered++
				rep.Covered++
				if agree {
					tc.CoveredAgree++
					rep.CoveredAgree++
				}
			}
			if agree {
				tc.Agree++
				rep.Agree++
				tc.AgreeByFidelity[res.Fidelity]++
			} else if len(tc.Misses) < maxCheckMisses {
				tc.Misses = append(tc.Misses, CheckMiss{Trace: pt.id, Call: c.idx, Args: c.canon, Fidelity: res.Fidelity, Want: c.text, Got: res.Content})
			}
		}
	}
	if rep.Calls > 0 {
		rep.AgreementPct = round4(100 * float64(rep.Agree) / float64(rep.Calls))
	}
	if rep.Covered > 0 {
		rep.CoveredAgreePct = round4(100 * float64(rep.CoveredAgree) / float64(rep.Covered))
	}
	names := sortedKeys(tools)
	for _, n := range names {
		tc := tools[n]
		if tc.Calls > 0 {
			tc.AgreementPct = round4(100 * float64(tc.Agree) / float64(tc.Calls))
		}
		rep.Tools = append(rep.Tools, *tc)
	}
	sort.SliceStable(rep.Tools, func(i, j int) bool { return rep.Tools[i].Calls > rep.Tools[j].Calls })
	return rep, nil
}

// lookupKey is the key a lookup's recorded answer names (a bare or quoted string).
func lookupKey(c *call) (string, bool) {
	if !c.success {
		return "", false
	}
	if s, ok := c.val.(string); ok && c.isJSON {
		return s, true
	}
	if o, ok := c.val.(*twin.Object); ok && c.isJSON {
		_ = o
		return "", false
	}
	if !c.isJSON {
		return c.text, true
	}
	return "", false
}
