package infer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// SelfCheckReport scores how faithfully twins reproduce recorded answers.
type SelfCheckReport struct {
	// Mode is "leave-one-task-out" (each task's traces against a build without them),
	// "leave-one-out" (each trace against a build without it), "N-fold" or "N-fold by task",
	// or "replay" (each trace against the build from all traces).
	Mode string `json:"mode"`
	// Split is what a fold holds out: "task" (all trials of a task together; traces naming
	// no task are their own unit), "trace", or "none" for replay.
	Split  string `json:"split"`
	Traces int    `json:"traces"`
	// Tasks is how many distinct tasks the trace ids name (see taskKey).
	Tasks int `json:"tasks"`
	// Calls are the scored calls (answered, with JSON-object arguments); Agree those whose
	// answer was JSON-equal (or text-equal) to the recorded one (exact agreement).
	Calls        int     `json:"calls"`
	Agree        int     `json:"agree"`
	AgreementPct float64 `json:"agreement_pct"`
	// ShapeAgree counts the answers of the recorded one's shape (twin.ShapesAgreeMaps: same keys
	// recursively and value types, arrays by element shape, maps — MapPaths — by member shape; for
	// text, both errors or both not). ErrorAgree counts the calls where the twin answered an error exactly when
	// production did (twin.IsErrorAnswer); a call no rung answered agrees on neither.
	ShapeAgree    int            `json:"shape_agree"`
	ShapeAgreePct float64        `json:"shape_agree_pct"`
	ErrorAgree    int            `json:"error_agree"`
	ErrorAgreePct float64        `json:"error_agree_pct"`
	Fidelity      map[string]int `json:"fidelity"`
	// Unanswered counts calls no rung could answer (or whose tool the build did not know).
	Unanswered int `json:"unanswered"`
	// ArgsRefused counts the calls production answered without an error that the twin refused by its argument
	// rules (twin.ArgRules): rules learned from the other traces that were stricter than production. The build
	// drops every rule a recorded success breaks, so against the traces it was built from this is 0.
	ArgsRefused int `json:"args_refused"`
	// Covered counts the calls the twin's world could know the answer to: the tool has no
	// entity, or the entity it names (or a lookup finds) was in the session's world before
	// the call, or production answered with an error. CoveredAgree is how many of them agree.
	Covered         int         `json:"covered"`
	CoveredAgree    int         `json:"covered_agree"`
	CoveredAgreePct float64     `json:"covered_agree_pct"`
	Tools           []ToolCheck `json:"tools"`
	// MapPaths are, per tool, the paths of its answers whose objects are maps (keys that are data: ids,
	// a product's option names), learned from all the recorded answers (twin.LearnMapPaths); shape
	// agreement compares a map by its members' shapes, not its keys.
	MapPaths map[string][]string `json:"map_paths,omitempty"`
	// Reproduction is the reproduction fidelity of the held-out traces (reproduce.go): each replayed in a session
	// opened from its own calls before its first write, scored from that write on (nil for a replay check).
	Reproduction *ReproductionReport `json:"reproduction,omitempty"`
}

// ToolCheck is one tool's self-check line.
type ToolCheck struct {
	Name string `json:"name"`
	// Binding and Rung are the tool's in the build from all traces.
	Binding       string         `json:"binding"`
	Rung          string         `json:"rung"`
	Kind          string         `json:"kind"`
	Calls         int            `json:"calls"`
	Agree         int            `json:"agree"`
	AgreementPct  float64        `json:"agreement_pct"`
	ShapeAgree    int            `json:"shape_agree"`
	ShapeAgreePct float64        `json:"shape_agree_pct"`
	ErrorAgree    int            `json:"error_agree"`
	ErrorAgreePct float64        `json:"error_agree_pct"`
	Fidelity      map[string]int `json:"fidelity"`
	// AgreeByFidelity counts agreeing answers per fidelity label.
	AgreeByFidelity map[string]int `json:"agree_by_fidelity"`
	Unanswered      int            `json:"unanswered"`
	ArgsRefused     int            `json:"args_refused"`
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
// built without that trace, and scores agreement with the recorded answers per
// tool. When trace ids name tasks (a path segment "task-N", as tau-bench's
// ".../task-12/trial-0"), all trials of a task are held out together, so a twin never
// sees a sibling trial of the trace it is checked on; traces naming no task are held
// out alone. Up to MaxLeaveOneOut such units it is leave-one-out (one build per task,
// or per trace); beyond, or when opts.Folds is set, the units are split into that many
// folds (10 by default) and each fold is checked against a build from the others.
func SelfCheck(traces []trace.Trace, opts Options) (*SelfCheckReport, error) {
	return check(prepared(traces), opts, true, Resume{}, splitAuto)
}

// prepared is the Prepared of one batch of traces.
func prepared(traces []trace.Trace) *Prepared {
	var p Prepared
	p.Add(traces)
	return &p
}

// FoldResult is one checked fold: the calls replayed for each of its traces (by trace index).
// Split, Fold and Folds identify the fold; a resumed check uses it only when all three match.
type FoldResult struct {
	Split string                `json:"split"`
	Fold  int                   `json:"fold"`
	Folds int                   `json:"folds"`
	Calls map[int][]CheckedCall `json:"calls"`
	// Repro holds, by trace index, the calls the reproduction replay scored (reproduce.go); a fold checked before
	// it was measured has none and is checked again.
	Repro map[int][]CheckedCall `json:"repro"`
}

// Resume carries a self-check's progress across an interruption. Done holds folds an earlier run of the same
// traces and options checked (skipped now; a fold of another split is ignored); OnFold, when set, is called
// once per fold checked now, one call at a time.
type Resume struct {
	Done   []FoldResult
	OnFold func(FoldResult)
}

// SelfCheckResume is SelfCheck that skips the folds r.Done holds and reports each new one to r.OnFold. Its
// report equals an uninterrupted SelfCheck's.
func SelfCheckResume(traces []trace.Trace, opts Options, r Resume) (*SelfCheckReport, error) {
	return check(prepared(traces), opts, true, r, splitAuto)
}

// SelfCheckFrom is SelfCheckResume over traces prepared batch by batch (see Prepared).
func SelfCheckFrom(p *Prepared, opts Options, r Resume) (*SelfCheckReport, error) {
	return check(p, opts, true, r, splitAuto)
}

// ReplayCheck is SelfCheck against one build from all traces (not leave-one-out):
// how well the twin reproduces what it was built from.
func ReplayCheck(traces []trace.Trace, opts Options) (*SelfCheckReport, error) {
	return check(prepared(traces), opts, false, Resume{}, splitAuto)
}

// Split kinds.
const (
	splitAuto  = ""      // by task when any trace id names one, else by trace
	splitTask  = "task"  // trials of a task together
	splitTrace = "trace" // each trace alone
)

// taskKey is the task a trace id names: its first path segment "task-N" (N digits).
// The trace format carries no other metadata, so the id is the only source.
func taskKey(id string) (string, bool) {
	for _, seg := range strings.Split(id, "/") {
		n := strings.TrimPrefix(seg, "task-")
		if len(n) == len(seg) || n == "" {
			continue
		}
		if strings.Trim(n, "0123456789") == "" {
			return seg, true
		}
	}
	return "", false
}

// splitUnits groups traces into hold-out units: by task (kind splitTask, or splitAuto when
// some trace names one; traces naming none are units of their own) or one per trace. Units
// are numbered in the order of their first trace, so the split is deterministic. It
// returns each trace's unit, the number of units, the kind used and the tasks named.
func splitUnits(pts []*ptrace, kind string) (unit []int, units int, used string, tasks int) {
	unit = make([]int, len(pts))
	byTask := map[string]int{}
	for i, pt := range pts {
		key, ok := taskKey(pt.id)
		if !ok {
			unit[i] = units
			units++
			continue
		}
		if _, seen := byTask[key]; !seen {
			byTask[key] = units
			units++
		}
		unit[i] = byTask[key]
	}
	tasks = len(byTask)
	if kind == splitTrace || tasks == 0 {
		for i := range unit {
			unit[i] = i
		}
		return unit, len(pts), splitTrace, tasks
	}
	return unit, units, splitTask, tasks
}

// MaxLeaveOneOut is the most units (tasks, or traces) SelfCheck checks one by one.
const MaxLeaveOneOut = 300

// CheckedCall is one replayed call of a self-check; FoldResult carries them so an interrupted check can resume.
type CheckedCall struct {
	Tool      string `json:"tool"`
	Scored    bool   `json:"scored,omitempty"` // answered in the recording: compared
	Fidelity  string `json:"fidelity,omitempty"`
	Agree     bool   `json:"agree,omitempty"`
	Shape     bool   `json:"shape,omitempty"`
	ErrAgree  bool   `json:"err_agree,omitempty"`
	Covered   bool   `json:"covered,omitempty"`
	Known     bool   `json:"known,omitempty"`
	KnownTwin bool   `json:"known_twin,omitempty"`
	NoAnswer  bool   `json:"no_answer,omitempty"`
	// ArgsRefused: production answered without an error, the twin refused the arguments.
	ArgsRefused bool `json:"args_refused,omitempty"`
	// Write: the call's tool is a write (in the build from every trace): a state-changing call.
	Write bool      `json:"write,omitempty"`
	Miss  CheckMiss `json:"miss"`
}

func check(p *Prepared, opts Options, holdOut bool, resume Resume, split string) (*SelfCheckReport, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	pts, w, err := p.finish()
	if err != nil {
		return nil, err
	}
	full, _, err := buildPrepared(pts, &opts, w, false)
	if err != nil {
		return nil, err
	}
	unit, units, kind, tasks := splitUnits(pts, split)
	rep := &SelfCheckReport{Mode: "replay", Split: "none", Traces: len(pts), Tasks: tasks, Fidelity: map[string]int{}}
	folds := 1
	if holdOut {
		rep.Split = kind
		folds = units
		rep.Mode = "leave-one-out"
		if kind == splitTask {
			rep.Mode = "leave-one-task-out"
		}
		if opts.Folds > 0 && opts.Folds < units || units > MaxLeaveOneOut {
			folds = opts.Folds
			if folds <= 0 {
				folds = 10
			}
			folds = min(folds, units)
			rep.Mode = fmt.Sprintf("%d-fold", folds)
			if kind == splitTask {
				rep.Mode += " by task"
			}
		}
	} else {
		kind = "none"
	}
	foldOf := make([]int, len(pts))
	for i := range pts {
		foldOf[i] = unit[i] % folds
	}
	maps := learnMaps(pts)
	rep.MapPaths = map[string][]string{}
	for tool, m := range maps {
		for p := range m {
			rep.MapPaths[tool] = append(rep.MapPaths[tool], p)
		}
		sort.Strings(rep.MapPaths[tool])
	}
	results := make([][]CheckedCall, len(pts))
	var rp *reproduction
	if holdOut {
		rp = newReproduction(full, len(pts))
	}
	errs := make([]error, folds)
	var fullRT *twin.Runtime
	if !holdOut {
		if fullRT, err = twin.NewRuntime(full, twin.RuntimeOptions{}); err != nil {
			return nil, err
		}
	}
	done := make([]bool, folds)
	for _, fr := range resume.Done {
		if fr.Split != kind || fr.Folds != folds || fr.Fold < 0 || fr.Fold >= folds || done[fr.Fold] || rp != nil && fr.Repro == nil {
			continue
		}
		for i, calls := range fr.Repro {
			if i < 0 || i >= len(pts) || foldOf[i] != fr.Fold {
				return nil, fmt.Errorf("self-check resume: fold %d/%d names trace %d", fr.Fold, folds, i)
			}
			rp.results[i] = calls
		}
		for i, calls := range fr.Calls {
			if i < 0 || i >= len(pts) || foldOf[i] != fr.Fold {
				return nil, fmt.Errorf("self-check resume: fold %d/%d names trace %d", fr.Fold, folds, i)
			}
			results[i] = calls
		}
		done[fr.Fold] = true
	}
	var report sync.Mutex
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range max(1, min(runtime.GOMAXPROCS(0), folds)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range jobs {
				if errs[f] = checkFold(pts, &opts, f, foldOf, holdOut, fullRT, maps, results, rp); errs[f] != nil || resume.OnFold == nil {
					continue
				}
				fr := FoldResult{Split: kind, Fold: f, Folds: folds, Calls: map[int][]CheckedCall{}, Repro: map[int][]CheckedCall{}}
				for i := range pts {
					if foldOf[i] == f {
						fr.Calls[i] = results[i]
						if rp != nil {
							fr.Repro[i] = rp.results[i]
						}
					}
				}
				report.Lock()
				resume.OnFold(fr)
				report.Unlock()
			}
		}()
	}
	for f := 0; f < folds; f++ {
		if !done[f] {
			jobs <- f
		}
	}
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	tools := map[string]*ToolCheck{}
	for _, t := range full.Tools {
		tools[t.Name] = &ToolCheck{Name: t.Name, Binding: t.Binding, Rung: t.Rung, Kind: t.Kind,
			Fidelity: map[string]int{}, AgreeByFidelity: map[string]int{}}
	}
	for _, rs := range results {
		for _, r := range rs {
			tc := tools[r.Tool]
			if tc == nil {
				tc = &ToolCheck{Name: r.Tool, Fidelity: map[string]int{}, AgreeByFidelity: map[string]int{}}
				tools[r.Tool] = tc
			}
			if !r.Scored {
				continue
			}
			tc.Calls++
			rep.Calls++
			if r.Known {
				tc.Known++
				if r.KnownTwin {
					tc.KnownTwin++
				}
			}
			if r.Covered {
				tc.Covered++
				rep.Covered++
			}
			if r.NoAnswer {
				tc.Unanswered++
				rep.Unanswered++
			} else {
				tc.Fidelity[r.Fidelity]++
				rep.Fidelity[r.Fidelity]++
			}
			if r.ArgsRefused {
				tc.ArgsRefused++
				rep.ArgsRefused++
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
				tc.AgreeByFidelity[r.Fidelity]++
				if r.Covered {
					tc.CoveredAgree++
					rep.CoveredAgree++
				}
			} else if len(tc.Misses) < maxCheckMisses {
				tc.Misses = append(tc.Misses, r.Miss)
			}
		}
	}
	if rep.Calls > 0 {
		rep.AgreementPct = pct(rep.Agree, rep.Calls)
		rep.ShapeAgreePct = pct(rep.ShapeAgree, rep.Calls)
		rep.ErrorAgreePct = pct(rep.ErrorAgree, rep.Calls)
	}
	if rep.Covered > 0 {
		rep.CoveredAgreePct = round4(100 * float64(rep.CoveredAgree) / float64(rep.Covered))
	}
	for _, n := range sortedKeys(tools) {
		tc := tools[n]
		if tc.Calls > 0 {
			tc.AgreementPct = pct(tc.Agree, tc.Calls)
			tc.ShapeAgreePct = pct(tc.ShapeAgree, tc.Calls)
			tc.ErrorAgreePct = pct(tc.ErrorAgree, tc.Calls)
		}
		rep.Tools = append(rep.Tools, *tc)
	}
	sort.SliceStable(rep.Tools, func(i, j int) bool { return rep.Tools[i].Calls > rep.Tools[j].Calls })
	if rp != nil {
		rep.Reproduction = rp.report()
	}
	return rep, nil
}

// pct is n of total in percent, to four decimals.
func pct(n, total int) float64 { return round4(100 * float64(n) / float64(total)) }

// checkFold builds a twin without fold f's traces (those i with foldOf[i] == f; or uses the
// full one) and replays each of them; with rp, each again from its calls before its first write (reproduce.go).
func checkFold(pts []*ptrace, opts *Options, f int, foldOf []int, holdOut bool, fullRT *twin.Runtime, maps map[string]twin.MapPaths, results [][]CheckedCall, rp *reproduction) error {
	rt := fullRT
	if holdOut {
		var others []*ptrace
		for i, pt := range pts {
			if foldOf[i] != f {
				others = append(others, pt)
			}
		}
		b, _, err := buildPrepared(others, opts, &warnings{}, false)
		if err != nil {
			return fmt.Errorf("self-check fold %d: %w", f, err)
		}
		if rt, err = twin.NewRuntime(b, twin.RuntimeOptions{}); err != nil {
			return fmt.Errorf("self-check fold %d: %w", f, err)
		}
	}
	ctx := context.Background()
	for i, pt := range pts {
		if foldOf[i] != f {
			continue
		}
		if rp != nil {
			if err := rp.replay(ctx, rt, i, pt, maps); err != nil {
				return err
			}
		}
		s, _, err := rt.Open(twin.SessionSpec{})
		if err != nil {
			return err
		}
		for _, c := range pt.calls {
			if c.args == nil {
				continue
			}
			r := CheckedCall{Tool: c.tool, Scored: c.answer, Covered: c.isErr}
			if def, ok := rt.Bundle().ToolByName(c.tool); ok {
				switch {
				case def.Table != "" && def.KeyArg != "":
					if kv, ok := c.args.Get(def.KeyArg); ok {
						if k, ok := scalarText(kv); ok {
							_, r.Known = s.Row(def.Table, k)
						}
					}
					r.Covered = r.Covered || r.Known
					r.Known = r.Known && def.Kind == twin.KindRead
				case def.Kind == twin.KindLookup && def.Table != "":
					if k, ok := lookupKey(c); ok {
						_, found := s.Row(def.Table, k)
						r.Covered = r.Covered || found
					}
				default:
					r.Covered = true
				}
			}
			res, err := s.Call(ctx, c.tool, []byte(c.canon))
			if err := score(&r, res, err, pt, c, maps); err != nil {
				return err
			}
			results[i] = append(results[i], r)
		}
	}
	return nil
}

// score scores a replayed call's answer (or the error that stopped it) into r against the recorded one. An error
// other than an unroutable tool or no answer is the check's own failure.
func score(r *CheckedCall, res twin.Result, err error, pt *ptrace, c *call, maps map[string]twin.MapPaths) error {
	if err != nil {
		if !errors.Is(err, twin.ErrUnknownTool) && !errors.Is(err, twin.ErrNoAnswer) {
			return fmt.Errorf("self-check %s call %d (%s): %w", pt.id, c.idx, c.tool, err)
		}
		r.NoAnswer = true
		r.Miss = CheckMiss{Trace: pt.id, Call: c.idx, Args: c.canon, Want: c.text, Got: err.Error()}
		return nil
	}
	r.Fidelity = res.Fidelity
	r.KnownTwin = res.Rung == twin.RungTwin
	r.Agree = twin.AnswersAgree(res.Content, c.text)
	r.Shape = twin.ShapesAgreeMaps(res.Content, c.text, maps[c.tool])
	r.ErrAgree = (res.Error || twin.IsErrorAnswer(res.Content)) == c.isErr
	r.ArgsRefused = !c.isErr && res.Note == twin.ArgsRefusedNote
	if !r.Agree {
		r.Miss = CheckMiss{Trace: pt.id, Call: c.idx, Args: c.canon, Fidelity: res.Fidelity, Want: c.text, Got: res.Content}
	}
	return nil
}

// learnMaps learns, per tool, the paths of its recorded JSON answers whose objects are maps.
func learnMaps(pts []*ptrace) map[string]twin.MapPaths {
	answers := map[string][]any{}
	for _, pt := range pts {
		for _, c := range pt.calls {
			if c.success && c.isJSON {
				answers[c.tool] = append(answers[c.tool], c.val)
			}
		}
	}
	out := map[string]twin.MapPaths{}
	for tool, as := range answers {
		if m := twin.LearnMapPaths(as); len(m) > 0 {
			out[tool] = m
		}
	}
	return out
}

// lookupKey is the key a lookup's recorded answer names (a bare or quoted string).
func lookupKey(c *call) (string, bool) {
	if !c.success {
		return "", false
	}
	if s, ok := c.val.(string); ok && c.isJSON {
		return s, true
	}
	if !c.isJSON {
		return c.text, true
	}
	return "", false
}
