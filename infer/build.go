package infer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// Report tells what a build made of the traces.
type Report struct {
	NTraces      int          `json:"n_traces"`
	NCalls       int          `json:"n_calls"`
	Tools        []ToolReport `json:"tools"`
	Tables       []TableInfo  `json:"tables"`
	Warnings     []Warning    `json:"warnings"`
	CoveredPct   float64      `json:"covered_pct"`
	SimulatedPct float64      `json:"simulated_pct"`
	Headline     string       `json:"headline"`
	SchemaSource string       `json:"schema_source"`
	Style        string       `json:"style"`
	// Facts tells what mentions showed of entities beyond the base world, and the conflicts recency resolved.
	Facts *FactsReport `json:"facts,omitempty"`
	// SelfCheckSplit is the split of the self-check AddSelfCheck merged in: "task" or "trace".
	SelfCheckSplit string `json:"self_check_split,omitempty"`
}

// ToolReport is one tool's line in the report.
type ToolReport struct {
	Name    string `json:"name"`
	Binding string `json:"binding"`
	Rung    string `json:"rung"`
	Kind    string `json:"kind"`
	Table   string `json:"table,omitempty"`
	Calls   int    `json:"calls"`
	Errors  int    `json:"errors"`
	// Fit is the share of recorded calls the synthesized handler reproduced on the recorded state.
	Fit       float64  `json:"fit"`
	FitCalls  int      `json:"fit_calls"`
	Attention []string `json:"attention,omitempty"`
	// Misses are a few recorded calls the handler answered differently.
	Misses []Miss `json:"misses,omitempty"`
	// SelfCheckPct is the tool's self-check exact agreement, once AddSelfCheck has merged one
	// in; SelfCheckShapePct and SelfCheckErrorPct its shape and error agreement (see
	// SelfCheckReport).
	SelfCheckPct      *float64 `json:"self_check_pct,omitempty"`
	SelfCheckShapePct *float64 `json:"self_check_shape_pct,omitempty"`
	SelfCheckErrorPct *float64 `json:"self_check_error_pct,omitempty"`
}

// Miss is one recorded call a synthesized handler answered differently.
type Miss struct {
	Trace string `json:"trace"`
	Call  int    `json:"call"`
	Args  string `json:"args"`
	Want  string `json:"want"`
	Got   string `json:"got"`
}

// TableInfo summarizes an entity table.
type TableInfo struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	Rows int    `json:"rows"`
}

// Warning counts one kind of messy input.
type Warning struct {
	Code    string `json:"code"`
	Count   int    `json:"count"`
	Example string `json:"example,omitempty"`
}

// minFit is the share of recorded calls a synthesized handler must reproduce for
// its tool to start at the twin rung; below it the tool starts at replay.
const minFit = 0.75

// minStateFit is minFit for a handler answering from state beyond rows: its fit counts as misses the calls whose
// variables the trace had not shown (the base value answered), which a session that shows them gets right, and
// the recordings would answer those no better.
const minStateFit = 0.5

// Build infers a twin bundle from traces. Messy input (calls without answers,
// arguments or answers that are not JSON, unknown roles) is counted in the
// report's warnings, never fatal; invalid options are an error naming the field.
func Build(traces []trace.Trace, opts Options) (*twin.Bundle, *Report, error) {
	if err := opts.validate(); err != nil {
		return nil, nil, err
	}
	var p Prepared
	p.Add(traces)
	return BuildFrom(&p, opts)
}

// BuildFrom is Build over traces prepared batch by batch (see Prepared).
func BuildFrom(p *Prepared, opts Options) (*twin.Bundle, *Report, error) {
	if err := opts.validate(); err != nil {
		return nil, nil, err
	}
	pts, w, err := p.finish()
	if err != nil {
		return nil, nil, err
	}
	b, rep, err := buildPrepared(pts, &opts, w, true)
	if err != nil {
		return nil, nil, err
	}
	b.Agent = p.agent.agent(opts.Config)
	return b, rep, nil
}

// buildPrepared builds from prepared traces. With release, it drops each call's parsed answer once the
// build is done with it (see ptrace.release), so a large build's peak holds the world rather than every
// answer's tree.
func buildPrepared(pts []*ptrace, opts *Options, w *warnings, release bool) (*twin.Bundle, *Report, error) {
	for name, src := range opts.Code {
		if err := twin.CheckHandler(name, src); err != nil {
			return nil, nil, fmt.Errorf("%w: code.%s: %w", ErrBadInput, name, err)
		}
	}
	m := newModel(pts, opts, w, release)
	b := m.learn()
	fits, err := m.fit(b)
	if err != nil {
		return nil, nil, err
	}
	if release {
		for _, t := range m.traces {
			t.release()
		}
	}
	m.renderRows(b)
	rep := m.decide(b, fits)
	rep.Facts = m.factsReport()
	return b, rep, nil
}

// bundle assembles the bundle from what the model learned (bindings decided later).
func (m *model) bundle() *twin.Bundle {
	b := &twin.Bundle{Format: twin.FormatVersion, Name: m.opts.Config.Name, Framework: m.opts.Config.Framework,
		Language: m.opts.Config.Language, SchemaSource: "traces", Style: m.style, Clock: m.opts.Config.Clock,
		Scenarios: m.opts.Config.Scenarios, World: m.opts.Config.World, TerminalTools: m.opts.Config.TerminalTools, StateTable: m.stateTable}
	if len(m.opts.Tools) > 0 {
		b.SchemaSource = "provided"
	}
	for _, name := range m.toolNames {
		ti := m.tools[name]
		t := twin.Tool{Name: name, Kind: ti.kind, Source: ti.source, Table: ti.table, KeyArg: ti.keyArg,
			StringsAsJSON: ti.stringsAsJSON, Provided: m.opts.Code[name], State: ti.state}
		if ti.kind == twin.KindLookup {
			t.KeyArg = ""
		}
		in, out := newShape(), newShape()
		for _, c := range ti.calls {
			if c.args != nil {
				in.add(c.args)
			}
			if c.success && c.isJSON {
				out.add(c.val)
			} else if c.success {
				out.add(c.text)
			}
			t.Scores.Calls++
			if c.isErr {
				t.Scores.Errors++
			}
		}
		if in.n == 0 {
			in.add(jsonvalue.NewObject(0))
		}
		t.InputSchema = schemaJSON(in.schema())
		if out.n > 0 {
			t.OutputSchema = schemaJSON(out.schema())
		}
		if ti.def != nil {
			t.Description = ti.def.Description
			t.InputSchema = ti.def.InputSchema
			t.Defined = true
		}
		t.Args = m.argRules(ti, &t)
		// A definition's description is the tool's; without one, a plain sentence from the name. How many calls
		// the tool was inferred from is in its figures (scores.calls), not its text.
		t.DescriptionFrom = twin.DescribedByDefinition
		if t.Description == "" {
			t.Description, t.DescriptionFrom = twin.PlainDescription(name), twin.DescribedByName
		}
		t.Attention = append(t.Attention, ti.notes...)
		b.Tools = append(b.Tools, t)
	}
	for _, tn := range m.tableNames {
		ti := m.tables[tn]
		t := twin.Table{Name: tn, Key: ti.keyField, KeyInRow: ti.keyInRow, Refs: ti.refs}
		keys := sortedKeys(m.base[tn])
		if tn != m.stateTable { // variables are named, not made up: no id format, facts or absent keys
			t.KeyShape = keyShape(keys)
			t.KeyPattern = keyPatternOf(keys)
			t.KeyParts = m.keyParts(tn)
			t.KeyWords = m.keyWords(tn, t.KeyParts)
			t.Facts = m.factRows(tn)
			t.Absent = m.absentKeys(tn)
		}
		t.Rows = make([]twin.Row, len(keys))
		for i, k := range keys {
			t.Rows[i].Key = k // rendered once fit is done (renderRows)
		}
		for ix := range ti.indexes {
			t.Indexes = append(t.Indexes, ix)
		}
		sort.Slice(t.Indexes, func(i, j int) bool {
			if t.Indexes[i].Path != t.Indexes[j].Path {
				return t.Indexes[i].Path < t.Indexes[j].Path
			}
			return !t.Indexes[i].Fold && t.Indexes[j].Fold
		})
		for _, name := range sortedKeys(ti.subs) {
			t.Subs = append(t.Subs, ti.subs[name])
		}
		b.Tables = append(b.Tables, t)
	}
	if m.release {
		// Only recordings and fit read answers from here on, and neither needs every sighting of a row:
		// dropping them lets recordings release the answers of the traces fit will not walk.
		m.sightings, m.subs = nil, nil
	}
	m.recordings(b)
	return b
}

// renderRows renders the bundle's base rows from the build's parsed ones. It runs after fit, whose runtime
// takes the parsed rows themselves: the rendered copy of a large world (as large as its canonical form,
// which that runtime holds) need not be in memory beside it.
func (m *model) renderRows(b *twin.Bundle) {
	for i := range b.Tables {
		t := &b.Tables[i]
		for j := range t.Rows {
			t.Rows[j].JSON = twin.Render(m.base[t.Name][t.Rows[j].Key], twin.StylePythonU)
		}
	}
}

// newModel indexes prepared traces' calls by tool, beside the tools and code opts declare.
func newModel(pts []*ptrace, opts *Options, w *warnings, release bool) *model {
	m := &model{traces: pts, opts: opts, w: w, tools: map[string]*toolInfo{}, release: release}
	for _, t := range pts {
		for _, c := range t.calls {
			ti := m.tools[c.tool]
			if ti == nil {
				ti = &toolInfo{name: c.tool}
				m.tools[c.tool] = ti
			}
			ti.calls = append(ti.calls, c)
		}
	}
	for i := range opts.Tools {
		d := &opts.Tools[i]
		ti := m.tools[d.Name]
		if ti == nil {
			ti = &toolInfo{name: d.Name}
			m.tools[d.Name] = ti
		}
		ti.def = d
	}
	for name := range opts.Code {
		if m.tools[name] == nil {
			m.tools[name] = &toolInfo{name: name}
		}
	}
	m.toolNames = sortedKeys(m.tools)
	return m
}

// learn runs the build's stages up to the bundle fit scores: style, tables, base world, relations,
// handlers, facts, recordings.
func (m *model) learn() *twin.Bundle {
	m.detectStyle()
	m.classify()
	m.buildBase()
	m.learnRelations()
	m.synthesize()
	m.learnFacts()
	m.learnState()
	return m.bundle()
}

// recordings indexes every answered call by tool and canonical arguments, with the
// fingerprint of the target row's state before the call.
func (m *model) recordings(b *twin.Bundle) {
	answerIdx := map[string]int{}
	// The fingerprints of the rows met: a row is the target of many calls and is not changed while they
	// are indexed. Base rows' are kept throughout, a trace's own rows' only while it is indexed (so the
	// answers recordings release can go).
	basePrints, tracePrints := map[*jsonvalue.Object]string{}, map[*jsonvalue.Object]string{}
	n := 0 // sized up front: a large build's recordings are its largest slice, and doubling leaves up to half unused
	for _, t := range m.traces {
		for _, c := range t.calls {
			if c.answer && c.args != nil {
				n++
			}
		}
	}
	b.Recordings = slices.Grow(b.Recordings, n)
	for i, t := range m.traces {
		v := m.newView()
		clear(tracePrints)
		for _, c := range t.calls {
			if c.answer && c.args != nil {
				state := ""
				if tn, k, ok := m.target(c); ok && m.tools[c.tool].kind != twin.KindLookup {
					r, _ := v.get(tn, k)
					prints := tracePrints
					if r == nil || m.base[tn][k] == r {
						prints = basePrints
					}
					if state, ok = prints[r]; !ok {
						state = twin.Fingerprint(r)
						prints[r] = state
					}
				}
				ai, ok := answerIdx[c.text]
				if !ok {
					ai = len(b.Answers)
					answerIdx[c.text] = ai
					b.Answers = append(b.Answers, c.text)
				}
				b.Recordings = append(b.Recordings, twin.Recording{Tool: c.tool, Args: c.canon, Answer: ai, Error: c.isErr,
					State: state, Trace: t.id, Call: c.idx})
			}
			v.observe(c)
		}
		if m.release && i >= maxFitTraces {
			t.release() // recordings are the last to read the answers of the traces fit will not walk
		}
	}
	sort.SliceStable(b.Recordings, func(i, j int) bool {
		x, y := b.Recordings[i], b.Recordings[j]
		if x.Tool != y.Tool {
			return x.Tool < y.Tool
		}
		if x.Args != y.Args {
			return x.Args < y.Args
		}
		if x.Trace != y.Trace {
			return x.Trace < y.Trace
		}
		return x.Call < y.Call
	})
}

// toolFit is how a synthesized handler did on the recorded calls.
type toolFit struct {
	tried, agreed, declined int
	misses                  []Miss
}

const maxMisses = 5

// maxFitCalls bounds the recorded calls fit runs one tool's handler on: the first ones in trace-id
// order (a deterministic sample; the report's fit_calls says how many). Past a few thousand calls the
// score hardly moves, while running every call of a 100,000-trace build costs half a minute.
const maxFitCalls = 5000

// maxFitTraces bounds the traces fit walks, the first ones in trace-id order: a tool seen only now and
// then would otherwise have fit replay every trace of a large build, and keep every answer parsed for it.
// (A variable so tests can lower it.)
var maxFitTraces = 10000

// fit runs each synthesized handler on the recorded calls (at most maxFitCalls a tool), on the world
// as the trace showed it just before that call, and scores exact agreement.
func (m *model) fit(b *twin.Bundle) (map[string]*toolFit, error) {
	probe := fitProbe(b)
	// The probe shares the build's parsed base rows (the bundle's rows are their rendering) rather than
	// parsing a second copy of the world; neither fit nor the runtime changes them.
	rt, err := twin.NewRuntime(&probe, twin.RuntimeOptions{Parsed: m.base})
	if err != nil {
		return nil, fmt.Errorf("build: synthesized handlers do not load: %w", err)
	}
	fits := map[string]*toolFit{}
	ctx := context.Background()
	// need is how many calls each tool is fit on; once every tool has had its share the rest of the
	// traces would only be replayed into the world, so fit stops.
	need := map[string]int{}
	traces := m.traces[:min(len(m.traces), maxFitTraces)]
	for _, t := range traces {
		for _, c := range t.calls {
			if m.tools[c.tool].source != "" && c.answer && c.args != nil && need[c.tool] < maxFitCalls {
				need[c.tool]++
			}
		}
	}
	pending := len(need)
	for ti, t := range traces {
		if pending == 0 {
			break
		}
		// Closed world: an id the recorded world did not hold was not found, whatever its format.
		s, _, err := rt.Open(twin.SessionSpec{World: twin.WorldClosed})
		if err != nil {
			return nil, err
		}
		// The state as this trace's world had it (its rows come from the base world and its own sightings).
		for _, k := range sortedKeys(m.stateTraces[ti]) {
			s.PutRow(m.stateTable, k, twin.StateRow(m.stateTraces[ti][k]))
		}
		v := m.newView()
		for _, c := range t.calls {
			ti := m.tools[c.tool]
			if ti.source != "" && c.answer && c.args != nil {
				f := fits[c.tool]
				if f == nil {
					f = &toolFit{}
					fits[c.tool] = f
				}
				if f.tried+f.declined < maxFitCalls {
					m.fitCall(ctx, s, v, t, c, f)
					if f.tried+f.declined == need[c.tool] {
						pending--
					}
				}
			}
			// Teacher forcing: the world now holds what the recording showed.
			if tn, k, row, ok := m.rowOf(c); ok {
				s.PutRow(tn, k, row)
			}
			m.putState(s.PutRow, s.StateValue, c)
			m.putHidden(s.PutRow, c)
			v.observe(c)
		}
		if m.release {
			t.release()
		}
	}
	return fits, nil
}

// fitProbe is the bundle fit runs b's synthesized handlers in: every tool bound to its handler at the twin
// rung. The twin rung reads only the recorded errors (the style of an argument error, the not-found answer of
// a closed world), so the probe indexes only those rather than every recording of a large build.
func fitProbe(b *twin.Bundle) twin.Bundle {
	probe := *b
	probe.Recordings = nil
	for _, r := range b.Recordings {
		if r.Error {
			probe.Recordings = append(probe.Recordings, r)
		}
	}
	probe.Tools = append([]twin.Tool(nil), b.Tools...)
	for i := range probe.Tools {
		probe.Tools[i].Binding, probe.Tools[i].Rung = twin.BindingSynthesized, twin.RungTwin
		probe.Tools[i].Provided = ""
	}
	return probe
}

// fitCall runs c's handler in s, on the target row as the trace knew it, and scores the answer into f.
func (m *model) fitCall(ctx context.Context, s *twin.Session, v *view, t *ptrace, c *call, f *toolFit) {
	// The target row as the trace knew it, whatever earlier checks did to it.
	if tn, k, ok := m.target(c); ok {
		if r, ok := v.get(tn, k); ok {
			s.PutRow(tn, k, r)
		}
	}
	content, isErr, ok, _ := s.Try(ctx, c.tool, c.args, twin.RungTwin)
	switch {
	case !ok:
		f.declined++
	default:
		f.tried++
		if isErr == c.isErr && twin.AnswersAgree(content, c.text) {
			f.agreed++
		} else if len(f.misses) < maxMisses {
			f.misses = append(f.misses, Miss{Trace: t.id, Call: c.idx, Args: c.canon, Want: c.text, Got: content})
		}
	}
}

// decide sets each tool's binding and starting rung and writes the report.
func (m *model) decide(b *twin.Bundle, fits map[string]*toolFit) *Report {
	rep := &Report{NTraces: len(m.traces), SchemaSource: b.SchemaSource, Style: m.style.Name}
	covered, simulated, total := 0, 0, 0
	for i := range b.Tools {
		t := &b.Tools[i]
		f := fits[t.Name]
		if f != nil && f.tried > 0 {
			t.Scores.Fit = round4(float64(f.agreed) / float64(f.tried))
			t.Scores.FitCalls = f.tried
		}
		switch {
		case t.Provided != "":
			t.Binding, t.Rung = twin.BindingProvided, twin.RungProvided
		case t.Source != "" && (f == nil || f.tried == 0 || t.Scores.Fit >= minFit || t.State != nil && t.Scores.Fit >= minStateFit):
			t.Binding, t.Rung = twin.BindingSynthesized, twin.RungTwin
			if t.Kind == twin.KindWrite && f != nil && f.agreed < f.tried+f.declined {
				t.PreferRecorded = true
			}
		default:
			t.Binding, t.Rung = twin.BindingSimulated, twin.RungReplay
			if t.Source != "" {
				t.Attention = append(t.Attention, fmt.Sprintf("synthesized handler reproduced only %.0f%% of %d recorded calls; answers start at replay",
					100*t.Scores.Fit, t.Scores.FitCalls))
			}
			if t.Scores.Calls == 0 {
				t.Rung = twin.RungSimulate
			}
		}
		if ov, ok := m.opts.Config.Bindings[t.Name]; ok {
			t.Binding = ov
			switch ov {
			case twin.BindingProvided:
				t.Rung = twin.RungProvided
			case twin.BindingSynthesized:
				t.Rung = twin.RungTwin
				if t.Source == "" {
					t.Attention = append(t.Attention, "bound synthesized by config, but no handler could be synthesized: answers fall to replay")
				}
			case twin.BindingSimulated:
				t.Rung = twin.RungReplay
				if t.Scores.Calls == 0 {
					t.Rung = twin.RungSimulate
				}
			}
		}
		if t.Scores.Calls > 0 && t.Scores.Calls < 3 {
			t.Attention = append(t.Attention, fmt.Sprintf("only %d recorded call(s)", t.Scores.Calls))
		}
		if t.Scores.Calls == 0 {
			t.Attention = append(t.Attention, "never seen in a trace")
		}
		total += t.Scores.Calls
		if t.Binding == twin.BindingSimulated {
			simulated += t.Scores.Calls
		} else {
			covered += t.Scores.Calls
		}
		rep.Tools = append(rep.Tools, ToolReport{Name: t.Name, Binding: t.Binding, Rung: t.Rung, Kind: t.Kind, Table: t.Table,
			Calls: t.Scores.Calls, Errors: t.Scores.Errors, Fit: t.Scores.Fit, FitCalls: t.Scores.FitCalls, Attention: t.Attention})
		if f != nil {
			rep.Tools[len(rep.Tools)-1].Misses = f.misses
		}
	}
	rep.NCalls = total
	if total > 0 {
		rep.CoveredPct = round4(100 * float64(covered) / float64(total))
		rep.SimulatedPct = round4(100 * float64(simulated) / float64(total))
	}
	for _, t := range b.Tables {
		rep.Tables = append(rep.Tables, TableInfo{Name: t.Name, Key: t.Key, Rows: len(t.Rows)})
	}
	rep.Warnings = m.w.list()
	nSynth := 0
	for _, t := range b.Tools {
		if t.Binding != twin.BindingSimulated {
			nSynth++
		}
	}
	rep.Headline = fmt.Sprintf("%d tools (%d with code, %d from recordings) over %d entity types; %.1f%% of %d recorded calls covered by code",
		len(b.Tools), nSynth, len(b.Tools)-nSynth, len(b.Tables), rep.CoveredPct, total)
	b.Summary = twin.Summary{NTraces: rep.NTraces, NCalls: total, NTools: len(b.Tools), CoveredPct: rep.CoveredPct,
		SimulatedPct: rep.SimulatedPct, Headline: rep.Headline}
	return rep
}

func round4(f float64) float64 {
	return float64(int64(f*10000+0.5)) / 10000
}

// MarshalReport is the report as JSON (for storing next to the bundle).
func (r *Report) MarshalReport() ([]byte, error) { return json.Marshal(r) }

// AddSelfCheck merges a self-check's per-tool agreement into the report and its headline.
func (r *Report) AddSelfCheck(sc *SelfCheckReport) {
	by := map[string]ToolCheck{}
	for _, t := range sc.Tools {
		by[t.Name] = t
	}
	for i := range r.Tools {
		if t, ok := by[r.Tools[i].Name]; ok && t.Calls > 0 {
			exact, shape, errs := t.AgreementPct, t.ShapeAgreePct, t.ErrorAgreePct
			r.Tools[i].SelfCheckPct, r.Tools[i].SelfCheckShapePct, r.Tools[i].SelfCheckErrorPct = &exact, &shape, &errs
		}
	}
	r.SelfCheckSplit = sc.Split
	r.Headline += fmt.Sprintf("; self-check (%s) %.1f%% of %d calls exact, %.1f%% shape, %.1f%% error agreement",
		sc.Mode, sc.AgreementPct, sc.Calls, sc.ShapeAgreePct, sc.ErrorAgreePct)
	r.Headline += sc.Reproduction.Headline()
}
