package toolplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// Reward modes of an episode.
const (
	// RewardFraction rewards the fraction of the expectations that pass (0…1).
	RewardFraction = "fraction"
	// RewardAll rewards 1 when every expectation passes, else 0.
	RewardAll = "all"
)

// Task makes a session an episode: what it is graded on and when it ends.
type Task struct {
	// Expect are the end-state expectations (sessions.assert's language) the reward grades.
	Expect []twin.Expectation
	// MaxSteps ends the episode after this many calls (0: no limit).
	MaxSteps int64
	// Reward is RewardFraction ("" too) or RewardAll.
	Reward string
}

// Episode is an episode's spec as the session keeps it (schema.Session.Episode): the task with the build's
// terminal tools as they were at open, so every replica grades it the same.
type Episode struct {
	Expect        []twin.Expectation `json:"expect"`
	MaxSteps      int64              `json:"max_steps,omitempty"`
	TerminalTools []string           `json:"terminal_tools,omitempty"`
	Reward        string             `json:"reward"`
}

// EpisodeState is where an episode stands after a call.
type EpisodeState struct {
	// Done is true once the episode ended: the step limit reached or a terminal tool called.
	Done bool
	// Steps is the calls the episode has taken (a fork's count its parent's calls before it).
	Steps int64
	// Reason says why it is done: "max_steps" or "terminal_tool" ("" while it runs).
	Reason string
	// Reward, set when done, is the graded reward; Outcomes the expectations' verdicts, in order.
	Reward   *float64
	Outcomes []twin.Outcome
}

// episodeOf checks a task against the build and answers the episode spec the session keeps, as JSON.
func (p *Plane) episodeOf(ctx context.Context, buildID string, t *Task) (json.RawMessage, error) {
	switch t.Reward {
	case "":
		t.Reward = RewardFraction
	case RewardFraction, RewardAll:
	default:
		return nil, invalid("body.task.reward", fmt.Sprintf("must be %q or %q", RewardFraction, RewardAll))
	}
	if len(t.Expect) == 0 {
		return nil, invalid("body.task.expect", "an episode needs at least one expectation to grade")
	}
	if t.MaxSteps < 0 {
		return nil, invalid("body.task.max_steps", "must not be negative")
	}
	build, err := store.GetBuildByID(ctx, p.db, buildID)
	if err != nil {
		return nil, notFoundOr(err, "build "+buildID)
	}
	bundle, err := p.bundles.Get(ctx, build)
	if err != nil {
		return nil, err
	}
	tables := make([]string, len(bundle.Tables))
	for i, tb := range bundle.Tables {
		tables[i] = tb.Name
	}
	slices.Sort(tables)
	if err := twin.CheckExpectations(tables, t.Expect); err != nil {
		var ee *twin.ExpectError
		if errors.As(err, &ee) {
			return nil, invalid(fmt.Sprintf("body.task.expect[%d].%s", ee.Index, ee.Field), ee.Detail)
		}
		return nil, invalid("body.task.expect", err.Error())
	}
	ep := Episode{Expect: t.Expect, MaxSteps: t.MaxSteps, TerminalTools: bundle.TerminalTools, Reward: t.Reward}
	return json.Marshal(ep)
}

// episode decodes the session's episode spec once per live session (nil: the session is not an episode).
func (p *Plane) episode(s *schema.Session, l *liveSession) (*Episode, error) {
	if len(s.Episode) == 0 || string(s.Episode) == "null" {
		return nil, nil
	}
	if l.episode == nil {
		var ep Episode
		if err := json.Unmarshal(s.Episode, &ep); err != nil {
			return nil, fmt.Errorf("episode of session %s: %w", s.ID, err)
		}
		l.episode = &ep
	}
	return l.episode, nil
}

// doneReason says whether an episode that took steps calls, the last of them to tool, is done, and why.
func (ep *Episode) doneReason(steps int64, tool string) string {
	switch {
	case tool != "" && slices.Contains(ep.TerminalTools, tool):
		return "terminal_tool"
	case ep.MaxSteps > 0 && steps >= ep.MaxSteps:
		return "max_steps"
	}
	return ""
}

// lastTool is the tool of the session's call seq (its own, or for a fork its lineage's); "" for seq 0.
func (p *Plane) lastTool(ctx context.Context, s *schema.Session, seq int64) (string, error) {
	for depth := 0; seq > 0 && depth <= maxLineage; depth++ {
		if seq > s.ForkedAt {
			calls, err := journal.ListCalls(ctx, p.db, s.ID, seq-1, 1)
			if err != nil {
				return "", err
			}
			if len(calls) == 0 {
				return "", fmt.Errorf("session %s: call %d is not in the journal", s.ID, seq)
			}
			return calls[0].Tool, nil
		}
		parent, err := store.GetSessionByID(ctx, p.db, s.ForkedFrom)
		if err != nil {
			return "", fmt.Errorf("session %s was forked from %s: %w", s.ID, s.ForkedFrom, err)
		}
		s = parent
	}
	return "", nil
}

// episodeDone refuses a call to an episode that is done: a Conflict that changes nothing. l.calls is known.
func (p *Plane) episodeDone(ctx context.Context, s *schema.Session, l *liveSession, ep *Episode) error {
	if !l.lastToolKnown {
		tool, err := p.lastTool(ctx, s, l.calls)
		if err != nil {
			return err
		}
		l.lastTool, l.lastToolKnown = tool, true
	}
	if why := ep.doneReason(l.calls, l.lastTool); why != "" {
		return errorf(Conflict, "the episode of session %s is done (%s after %d steps): a call after done is refused and changes nothing; read its reward from the call that ended it, or grade it with sessions.assert", s.ID, strings.ReplaceAll(why, "_", " "), l.calls)
	}
	return nil
}

// grade answers where the episode stands after its call number l.calls, to tool: when done, its reward graded on
// the world the twin holds now (the same verdicts sessions.assert answers without against).
func (p *Plane) grade(ctx context.Context, s *schema.Session, l *liveSession, ep *Episode) (*EpisodeState, error) {
	st := &EpisodeState{Steps: l.calls}
	st.Reason = ep.doneReason(l.calls, l.lastTool)
	if st.Reason == "" {
		return st, nil
	}
	st.Done = true
	te, err := p.twin(ctx, s, l, "")
	if err != nil {
		return nil, err
	}
	res, err := te.c.Assert(ctx, s.ID, rpc.AssertRequest{Expect: ep.Expect})
	if err != nil {
		return nil, twinError(err)
	}
	st.Outcomes = res.Outcomes
	r := Reward(ep.Reward, res.Outcomes)
	st.Reward = &r
	return st, nil
}

// Reward is the reward of verdicts in a mode: the fraction that pass, or 1 when all pass (else 0).
func Reward(mode string, outcomes []twin.Outcome) float64 {
	passed := 0
	for _, o := range outcomes {
		if o.Pass {
			passed++
		}
	}
	if mode == RewardAll {
		if passed == len(outcomes) {
			return 1
		}
		return 0
	}
	if len(outcomes) == 0 {
		return 0
	}
	return float64(passed) / float64(len(outcomes))
}
