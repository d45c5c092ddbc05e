package twin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
)

// Result is one answer (spec §2.5).
type Result struct {
	Content    string `json:"content"`
	Error      bool   `json:"error"`
	Fidelity   string `json:"fidelity"`
	Rung       string `json:"rung"`
	Downgraded bool   `json:"downgraded"`
	StateHash  string `json:"state_hash"`
	// Changed reports whether the call changed the world.
	Changed bool `json:"changed"`
	// Note says why higher rungs did not answer, when they did not.
	Note string `json:"note,omitempty"`
}

// Call answers one tool call from the highest rung that can, starting at the
// tool's bound rung. A tool's own error is a Result with Error set, not a Go error.
func (s *Session) Call(ctx context.Context, tool string, args json.RawMessage) (Result, error) {
	t := s.rt.tools[tool]
	if t == nil {
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownTool, tool)
	}
	av, err := jsonvalue.Parse(args)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadArguments, err)
	}
	ao, ok := av.(*jsonvalue.Object)
	if !ok {
		return Result{}, fmt.Errorf("%w: got %s", ErrBadArguments, jsonKind(av))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Result{}, ErrClosed
	}
	if p := t.args.problem(t, args, ao); p != "" {
		return s.argsError(t, p), nil
	}
	return s.call(ctx, t, ao, nil)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case jsonvalue.Number:
		return "a number"
	case []any:
		return "an array"
	}
	return "an object"
}

// answer is what one rung produced.
type answer struct {
	content  string
	isErr    bool
	env      *callEnv
	apply    *jsonvalue.Object // a replayed write's row to store, under applyKey
	applyKey string
	note     string // said in the result's note
}

func (s *Session) call(ctx context.Context, t *rtTool, args *jsonvalue.Object, journaled *string) (Result, error) {
	var notes []string
	start := t.start
	if s.traceID != "" && start >= rungIndex(RungTwin) {
		if a, note := s.ownTraceAnswer(t, args); a != nil {
			res := Result{Content: a.content, Error: a.isErr, Rung: RungReplay, Fidelity: FidelityReplayed, Note: note}
			res.Changed = s.commit(t, args, a)
			res.StateHash = s.currentHash()
			return res, nil
		}
	}
	if t.def.PreferRecorded && start <= rungIndex(RungTwin) {
		if a := s.replaySameState(t, args); a != nil {
			res := Result{Content: a.content, Error: a.isErr, Rung: RungReplay, Fidelity: FidelityReplayed,
				Note: "a recording from this very state answered before the imperfect handler"}
			res.Changed = s.commit(t, args, a)
			res.StateHash = s.currentHash()
			return res, nil
		}
	}
	if start == rungIndex(RungTwin) && t.synth != nil && s.stateUnseen(t, args) {
		// The handler would answer from state this session has never shown or set (the base world's values, the
		// ones most recorded worlds had): a recording with these very arguments is the better guess, and its
		// answer becomes the session's state (adoptState).
		if a, _ := s.replay(t, args); a != nil {
			res := Result{Content: a.content, Error: a.isErr, Rung: RungReplay, Fidelity: FidelityReplayed,
				Note: "a recording with these arguments answered: the state the handler reads was never shown in this session"}
			res.Changed = s.commit(t, args, a)
			res.StateHash = s.currentHash()
			return res, nil
		}
	}
	for r := start; r < len(Rungs()); r++ {
		rung := Rungs()[r]
		var a *answer
		var why string
		switch rung {
		case RungProvided:
			if t.provided == nil {
				continue
			}
			a, why = s.runHandler(ctx, t, t.provided, args, true)
		case RungTwin:
			if t.synth == nil {
				continue
			}
			a, why = s.runHandler(ctx, t, t.synth, args, false)
		case RungReplay:
			a, why = s.replay(t, args)
		case RungInfer:
			if s.absentRead(t, args) {
				a, why = s.inferNotFound(t, args)
				break
			}
			a, why = s.infer(t, args)
		case RungSimulate:
			if journaled != nil {
				a = &answer{content: *journaled, isErr: isErrorText(*journaled)}
				break
			}
			if s.rt.opts.Simulator == nil {
				why = "no simulator configured"
				break
			}
			a, why = s.simulate(ctx, t, args)
		}
		if a == nil {
			if why != "" {
				notes = append(notes, rung+": "+why)
			}
			continue
		}
		if a.env != nil && len(a.env.matOrder) > 0 && rung != RungReplay {
			// A recording with these very arguments is better evidence than an entity made up for them (production
			// answered "not found" for an id that matched the format, or showed the entity itself).
			if ra, _ := s.replay(t, args); ra != nil {
				a, rung = ra, RungReplay
				notes = append(notes, "a recording with these arguments answered instead of an entity made up for them")
			}
		}
		if a.note != "" {
			notes = append(notes, a.note)
		}
		res := Result{Content: a.content, Error: a.isErr, Rung: rung, Fidelity: FidelityOf(rung), Downgraded: rungIndex(rung) > start}
		if a.env != nil && len(a.env.matOrder) > 0 {
			// The answer rests on entities made up for ids the world did not hold.
			res.Fidelity = FidelityInferred
			notes = append(notes, "made up "+describeMade(a.env.matOrder)+" (world policy "+s.world+")")
		}
		if rung == RungSimulate && t.def.Kind == KindWrite {
			// A model never changes the world: a write it answered is always marked.
			res.Downgraded = true
			notes = append(notes, "simulate: a write answered by the model does not change the world")
		}
		if len(notes) > 0 {
			res.Note = strings.Join(notes, "; ")
		}
		res.Changed = s.commit(t, args, a)
		res.StateHash = s.currentHash()
		return res, nil
	}
	// A tool bound below the recordings (simulated) whose rungs could not answer — no model configured — falls back
	// to the recordings: the closest recorded answer, labelled by the rung that gave it and downgraded.
	for _, rung := range []string{RungReplay, RungInfer} {
		if rungIndex(rung) >= start {
			break
		}
		var a *answer
		var why string
		if rung == RungReplay {
			a, why = s.replay(t, args)
		} else {
			a, why = s.infer(t, args)
		}
		if a == nil {
			if why != "" {
				notes = append(notes, rung+": "+why)
			}
			continue
		}
		if a.note != "" {
			notes = append(notes, a.note)
		}
		res := Result{Content: a.content, Error: a.isErr, Rung: rung, Fidelity: FidelityOf(rung), Downgraded: true,
			Note: strings.Join(append(notes, rung+": the bound rung could not answer, so the recordings did"), "; ")}
		res.Changed = s.commit(t, args, a)
		res.StateHash = s.currentHash()
		return res, nil
	}
	return Result{}, fmt.Errorf("%w: tool %q (%s)", ErrNoAnswer, t.def.Name, strings.Join(notes, "; "))
}

// Try runs a single rung for a call without falling to the next; answered is false
// when the rung declined or failed (note says why). A twin or provided answer that
// changes the world is kept, as a call's would be.
func (s *Session) Try(ctx context.Context, tool string, args *jsonvalue.Object, rung string) (content string, isErr, answered bool, note string) {
	t := s.rt.tools[tool]
	if t == nil {
		return "", false, false, "unknown tool"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var a *answer
	switch rung {
	case RungProvided:
		if t.provided == nil {
			return "", false, false, "no provided code"
		}
		a, note = s.runHandler(ctx, t, t.provided, args, true)
	case RungTwin:
		if t.synth == nil {
			return "", false, false, "no handler"
		}
		a, note = s.runHandler(ctx, t, t.synth, args, false)
	case RungReplay:
		a, note = s.replay(t, args)
	case RungInfer:
		a, note = s.infer(t, args)
	default:
		return "", false, false, "rung " + rung + " cannot be tried alone"
	}
	if a == nil {
		return "", false, false, note
	}
	s.commit(t, args, a)
	return a.content, a.isErr, true, ""
}

// commit stores what an answer changed; it reports whether anything did.
func (s *Session) commit(t *rtTool, args *jsonvalue.Object, a *answer) bool {
	changed := false
	if a.env != nil {
		for _, tk := range a.env.matOrder {
			if _, ok := s.row(tk.table, tk.key); !ok {
				s.put(tk.table, tk.key, a.env.mat[tk])
				changed = true
			}
		}
	}
	if a.env != nil && len(a.env.order) > 0 && !a.isErr {
		for _, tk := range a.env.order {
			if a.env.dels[tk] {
				s.put(tk.table, tk.key, nil)
			} else {
				s.put(tk.table, tk.key, a.env.txn[tk])
			}
		}
		changed = true
	}
	if a.apply != nil && t.def.Table != "" && a.applyKey != "" {
		s.put(t.def.Table, a.applyKey, a.apply)
		changed = true
	}
	if a.env == nil && !a.isErr && t.def.State != nil && s.adoptState(t, args, a.content) {
		changed = true
	}
	if t.def.Kind == KindWrite && !a.isErr {
		s.rt.rowsOnce.Do(s.rt.learnRows)
		if s.applyEffects(t, args) {
			changed = true
		}
	}
	return changed
}

// describeMade names the rows a call made up ("users mia_li_3668, orders #W1234567").
func describeMade(tks []tableKey) string {
	parts := make([]string, len(tks))
	for i, tk := range tks {
		parts[i] = tk.table + " " + tk.key
	}
	return strings.Join(parts, ", ")
}

func keyArg(def *Tool, args *jsonvalue.Object) (string, bool) {
	if def.KeyArg == "" {
		return "", false
	}
	v, ok := args.Get(def.KeyArg)
	if !ok {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, true
	case jsonvalue.Number:
		return string(x), true
	}
	return "", false
}

// isErrorText tells a tool's own error answer by its text, as recordings spell them.
func isErrorText(s string) bool {
	t := strings.TrimSpace(s)
	if len(t) < 5 {
		return false
	}
	head := strings.ToLower(t[:5])
	return head == "error"
}

// IsErrorText reports whether an answer text reads as the tool's own error.
func IsErrorText(s string) bool { return isErrorText(s) }

// runHandler runs a handler on a call's arguments. Provided code runs with its memory budget (starguard.go): past it
// the call answers the tool's own error, and the world is unchanged.
func (s *Session) runHandler(ctx context.Context, t *rtTool, fn starlark.Callable, args *jsonvalue.Object, provided bool) (*answer, string) {
	env := &callEnv{sess: s}
	th := &starlark.Thread{Name: t.def.Name, Print: func(*starlark.Thread, string) {}}
	th.SetLocal(envKey, env)
	th.SetMaxExecutionSteps(s.rt.opts.MaxSteps)
	if provided {
		guard(th, s.rt.opts.MaxAllocBytes)
	}
	timer := time.AfterFunc(s.rt.opts.CallBudget, func() { th.Cancel("time budget exceeded") })
	stop := context.AfterFunc(ctx, func() { th.Cancel("context done") })
	v, err := starlark.Call(th, fn, starlark.Tuple{toStar(args)}, nil)
	timer.Stop()
	stop()
	if errors.Is(err, ErrHandlerMemory) {
		return memoryAnswer(err), ""
	}
	if err != nil {
		return nil, "handler failed: " + firstLine(err.Error())
	}
	switch x := v.(type) {
	case *declined:
		return nil, "declined: " + x.reason
	case *errorAnswer:
		return &answer{content: x.text, isErr: true}, ""
	}
	if str, ok := v.(starlark.String); ok && !t.def.StringsAsJSON {
		return &answer{content: string(str), env: env}, "" // a text answer, as it is
	}
	maxLen := 0
	if provided {
		maxLen = int(max(remaining(th), 1)) // the rendering is charged too: a list held many times over is not written out whole
	}
	content, err := renderStarMax(v, s.rt.style, int(t.answerSize.Load()), maxLen) // Render(fromStar(v)), without the model value in between
	if errors.Is(err, errRenderTooLong) {
		err = &memoryError{what: "rendering the answer", want: int64(maxLen) + 1, limit: s.rt.opts.MaxAllocBytes}
	}
	if err == nil && provided {
		err = charge(th, "rendering the answer", int64(len(content)))
	}
	if errors.Is(err, ErrHandlerMemory) {
		return memoryAnswer(err), ""
	}
	if err != nil {
		return nil, "handler answer: " + err.Error()
	}
	if n := int64(len(content)); n > t.answerSize.Load() && n <= maxAnswerHint {
		t.answerSize.Store(n)
	}
	return &answer{content: content, env: env}, ""
}

// memoryAnswer is what a call past its memory budget answers: the tool's own error, naming the refusal (without
// the Starlark backtrace); the world is unchanged.
func memoryAnswer(err error) *answer {
	var me *memoryError
	var big *intTooLarge
	text := firstLine(err.Error())
	switch {
	case errors.As(err, &me):
		text = me.Error()
	case errors.As(err, &big):
		text = big.Error()
	}
	return &answer{content: "Error: " + text, isErr: true}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
