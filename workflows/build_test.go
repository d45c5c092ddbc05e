package workflows

import (
	"errors"
	"testing"
	"time"

	"context"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twinstate"
)

func newEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	Register(env)
	return env
}

func TestBuildSucceeds(t *testing.T) {
	env := newEnv(t)
	var a *activities.Builds
	plan := activities.BuildPlan{EnvID: "env_1", BuildID: "bld_1", BatchKeys: []string{"batches/aa"}, NTraces: 3}
	inf := activities.Inferred{BundleKey: "bundles/bb", BundleHash: "sha256:bb", NTools: 4}
	chk := activities.SelfChecked{Agreement: 90, Calls: 10}
	env.OnActivity(a.PlanBuild, mock.Anything, "env_1", "bld_1").Return(plan, nil).Once()
	env.OnActivity(a.InferBundle, mock.Anything, plan).Return(inf, nil).Once()
	env.OnActivity(a.SelfCheck, mock.Anything, plan, inf).Return(chk, nil).Once()
	env.OnActivity(a.ActivateBuild, mock.Anything, plan, inf, chk).Return(nil).Once()
	env.OnSignalExternalWorkflow(mock.Anything, TwinWorkflowID("env_1"), "", NewBuildSignal,
		twinstate.Build{BuildID: "bld_1", BundleKey: "bundles/bb", BundleHash: "sha256:bb"}).Return(nil).Once()

	var stages []string
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		v, err := env.QueryWorkflow(ProgressQuery)
		if err != nil {
			t.Errorf("query progress: %v", err)
			return
		}
		var p BuildProgress
		if err := v.Get(&p); err != nil {
			t.Errorf("decode progress: %v", err)
		}
		stages = append(stages, info.ActivityType.Name+"@"+p.Stage)
	})
	env.ExecuteWorkflow(BuildWorkflowName, BuildInput{EnvID: "env_1", BuildID: "bld_1"})
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("workflow: completed=%v err=%v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	var res BuildResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded || res.BundleHash != "sha256:bb" {
		t.Errorf("result = %+v", res)
	}
	want := []string{"PlanBuild@planning", "InferBundle@inferring", "SelfCheck@self-checking", "ActivateBuild@activating"}
	if len(stages) != len(want) {
		t.Fatalf("stages = %v, want %v", stages, want)
	}
	for i := range want {
		if stages[i] != want[i] {
			t.Errorf("stage %d = %s, want %s", i, stages[i], want[i])
		}
	}
	v, err := env.QueryWorkflow(ProgressQuery)
	if err != nil {
		t.Fatal(err)
	}
	var p BuildProgress
	_ = v.Get(&p)
	if p.Stage != "succeeded" || p.Percent != 100 {
		t.Errorf("final progress = %+v", p)
	}
	env.AssertExpectations(t)
}

func TestBuildFailureIsRecorded(t *testing.T) {
	env := newEnv(t)
	var a *activities.Builds
	plan := activities.BuildPlan{EnvID: "env_1", BuildID: "bld_2"}
	env.OnActivity(a.PlanBuild, mock.Anything, "env_1", "bld_2").Return(plan, nil)
	env.OnActivity(a.InferBundle, mock.Anything, plan).Return(activities.Inferred{},
		temporal.NewNonRetryableApplicationError("no tool calls in any trace", activities.ErrTypeBadInput, nil))
	env.OnActivity(a.FailBuild, mock.Anything, "env_1", "bld_2", "no tool calls in any trace").Return(nil).Once()
	movedTwin := false
	env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, mock.Anything, mock.Anything, mock.Anything).
		Run(func(mock.Arguments) { movedTwin = true }).Return(nil).Maybe()

	env.ExecuteWorkflow(BuildWorkflowName, BuildInput{EnvID: "env_1", BuildID: "bld_2"})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatalf("workflow error = %v, want a completed workflow reporting the failure", err)
	}
	var res BuildResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || res.Error != "no tool calls in any trace" {
		t.Errorf("result = %+v", res)
	}
	if movedTwin {
		t.Error("a failed build signalled the twin workflow to move to it")
	}
	env.AssertExpectations(t)
}

func TestRebuildDebounces(t *testing.T) {
	env := newEnv(t)
	var a *activities.Builds
	env.OnActivity(a.QueueBuild, mock.Anything, "env_1").Return("bld_9", nil).Once()
	var childStartedAt time.Time
	env.OnWorkflow(BuildWorkflowName, mock.Anything, BuildInput{EnvID: "env_1", BuildID: "bld_9"}).Return(
		func(ctx workflow.Context, in BuildInput) (BuildResult, error) {
			childStartedAt = workflow.Now(ctx)
			return BuildResult{BuildID: in.BuildID, Succeeded: true}, nil
		}).Once()

	start := env.Now()
	// Signals at 10s and 50s keep pushing the quiet period; the build starts 60s after the last.
	for _, at := range []time.Duration{10 * time.Second, 50 * time.Second} {
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(CollectedSignal, nil) }, at)
	}
	env.ExecuteWorkflow(RebuildWorkflowName, RebuildInput{EnvID: "env_1", Debounce: time.Minute})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if got := childStartedAt.Sub(start); got != 110*time.Second {
		t.Errorf("build started %s after the first signal, want 110s (60s after the last)", got)
	}
	env.AssertExpectations(t)
}

func TestRebuildContinuesWhenTracesArriveDuringBuild(t *testing.T) {
	env := newEnv(t)
	var a *activities.Builds
	env.OnActivity(a.QueueBuild, mock.Anything, "env_1").Return("bld_1", nil).Once()
	env.OnWorkflow(BuildWorkflowName, mock.Anything, mock.Anything).Return(
		func(ctx workflow.Context, in BuildInput) (BuildResult, error) {
			_ = workflow.Sleep(ctx, time.Minute)
			return BuildResult{BuildID: in.BuildID, Succeeded: true}, nil
		})
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CollectedSignal, nil) }, 90*time.Second)
	env.ExecuteWorkflow(RebuildWorkflowName, RebuildInput{EnvID: "env_1", Debounce: time.Minute})
	err := env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	if !errors.As(err, &can) {
		t.Fatalf("err = %v, want continue-as-new so the late batch gets built", err)
	}
}
