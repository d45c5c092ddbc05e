package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
)

// settleRun records when AssembleSettled ran (as workflow time since start) and answers from a script.
type settleRun struct {
	start  time.Time
	at     []time.Duration
	script []activities.SettleResult
}

func (s *settleRun) assemble(env interface{ Now() time.Time }) func(context.Context, string, time.Duration) (activities.SettleResult, error) {
	return func(_ context.Context, envID string, settle time.Duration) (activities.SettleResult, error) {
		s.at = append(s.at, env.Now().Sub(s.start))
		if len(s.at) > len(s.script) {
			return activities.SettleResult{}, nil
		}
		return s.script[len(s.at)-1], nil
	}
}

func TestSettleSpansAssemblesOnceSettled(t *testing.T) {
	env := newEnv(t)
	var a *activities.Spans
	run := &settleRun{start: env.Now(), script: []activities.SettleResult{
		{Assembled: 3, Pending: 1, NextIn: 20 * time.Second}, // one conversation still receiving spans
		{Assembled: 1},
	}}
	env.OnActivity(a.AssembleSettled, mock.Anything, "env_1", time.Minute).Return(run.assemble(env))
	env.OnActivity(a.ScheduleRebuild, mock.Anything, "env_1").Return(nil).Twice()
	env.ExecuteWorkflow(SettleSpansWorkflowName, SettleSpansInput{EnvID: "env_1", Settle: time.Minute})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{time.Minute, 80 * time.Second}; len(run.at) != 2 || run.at[0] != want[0] || run.at[1] != want[1] {
		t.Errorf("assembled at %v, want %v", run.at, want)
	}
	env.AssertExpectations(t)
}

// TestSettleSpansSteadyTrafficDoesNotStarve: exports every 10s keep signalling; conversations that ended are
// assembled on time all the same.
func TestSettleSpansSteadyTrafficDoesNotStarve(t *testing.T) {
	env := newEnv(t)
	var a *activities.Spans
	run := &settleRun{start: env.Now(), script: []activities.SettleResult{
		{Assembled: 1, Pending: 1, NextIn: 30 * time.Second},
		{Assembled: 1, Pending: 1, NextIn: 30 * time.Second},
		{Assembled: 1},
	}}
	env.OnActivity(a.AssembleSettled, mock.Anything, "env_1", time.Minute).Return(run.assemble(env))
	env.OnActivity(a.ScheduleRebuild, mock.Anything, "env_1").Return(nil)
	for i := 1; i <= 11; i++ {
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(SpansStagedSignal, nil) }, time.Duration(i)*10*time.Second)
	}
	env.ExecuteWorkflow(SettleSpansWorkflowName, SettleSpansInput{EnvID: "env_1", Settle: time.Minute})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{60 * time.Second, 90 * time.Second, 120 * time.Second}; len(run.at) != 3 || run.at[0] != want[0] || run.at[1] != want[1] || run.at[2] != want[2] {
		t.Errorf("assembled at %v, want %v", run.at, want)
	}
}

// TestSettleSpansSignalDuringRun: spans staged while the activity ran are waited for, a settle time later.
func TestSettleSpansSignalDuringRun(t *testing.T) {
	env := newEnv(t)
	var a *activities.Spans
	run := &settleRun{start: env.Now(), script: []activities.SettleResult{{Assembled: 1}, {Assembled: 1}}}
	first := true
	env.OnActivity(a.AssembleSettled, mock.Anything, "env_1", time.Minute).Return(
		func(ctx context.Context, id string, settle time.Duration) (activities.SettleResult, error) {
			if first {
				first = false
				env.SignalWorkflow(SpansStagedSignal, nil)
			}
			return run.assemble(env)(ctx, id, settle)
		})
	env.OnActivity(a.ScheduleRebuild, mock.Anything, "env_1").Return(nil)
	env.ExecuteWorkflow(SettleSpansWorkflowName, SettleSpansInput{EnvID: "env_1", Settle: time.Minute})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if len(run.at) != 2 || run.at[1] != 2*time.Minute {
		t.Errorf("assembled at %v, want 1m then 2m", run.at)
	}
}

// TestSettleSpansMoreAtOnce: a run that left settled conversations is followed by another at once; nothing
// assembled schedules no rebuild.
func TestSettleSpansMoreAtOnce(t *testing.T) {
	env := newEnv(t)
	var a *activities.Spans
	run := &settleRun{start: env.Now(), script: []activities.SettleResult{{Assembled: 500, More: true}, {Failed: 2}}}
	env.OnActivity(a.AssembleSettled, mock.Anything, "env_1", time.Minute).Return(run.assemble(env))
	env.OnActivity(a.ScheduleRebuild, mock.Anything, "env_1").Return(nil).Once()
	env.ExecuteWorkflow(SettleSpansWorkflowName, SettleSpansInput{EnvID: "env_1", Settle: time.Minute})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if len(run.at) != 2 || run.at[0] != time.Minute || run.at[1] != time.Minute {
		t.Errorf("assembled at %v, want twice at 1m", run.at)
	}
	env.AssertExpectations(t)
}

func TestSettleSpansContinuesAsNew(t *testing.T) {
	env := newEnv(t)
	var a *activities.Spans
	env.OnActivity(a.AssembleSettled, mock.Anything, "env_1", time.Minute).Return(activities.SettleResult{Pending: 1, NextIn: time.Second}, nil)
	env.ExecuteWorkflow(SettleSpansWorkflowName, SettleSpansInput{EnvID: "env_1", Settle: time.Minute})
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("err = %v, want continue-as-new after %d rounds", err, settleRoundsPerRun)
	}
}
