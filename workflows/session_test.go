package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twin/rpc"
)

func newSessionEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	RegisterSessions(env)
	env.RegisterActivity(&activities.Sessions{})
	return env
}

var openIn = SessionOpenInput{SessionID: "ses_1", EnvID: "env_1", Spec: rpc.SessionSpec{Seed: 7, SeedInstructions: "1 pending order"}}

func TestSessionOpenWarm(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	rc := rpc.Receipts{Seeded: true, Seed: 7, WorldHash: "sha256:ab"}
	env.OnActivity(a.FindTwin, mock.Anything, activities.FindTwinInput{EnvID: "env_1"}).
		Return(activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_1"}, nil).Once()
	env.OnActivity(a.OpenOnTwin, mock.Anything, activities.OpenOnTwinInput{Addr: "http://127.0.0.1:1", SessionID: "ses_1", Spec: openIn.Spec}).
		Return(activities.OpenOnTwinResult{Receipts: rc, StateHash: "sha256:ab"}, nil).Once()
	env.ExecuteWorkflow(SessionOpenWorkflowName, openIn)
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("completed=%v err=%v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	var res SessionOpenResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.TwinAddr != "http://127.0.0.1:1" || res.BuildID != "bld_1" || res.Receipts.WorldHash != "sha256:ab" || !res.Receipts.Seeded {
		t.Fatalf("result = %+v", res)
	}
	env.AssertExpectations(t)
}

func TestSessionOpenWakesATwinThatDoesNotAnswer(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	stale := activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_1", HandleID: "twin-a"}
	woken := activities.TwinEndpoint{Addr: "http://127.0.0.1:2", BuildID: "bld_1", HandleID: "twin-b"}
	env.OnActivity(a.FindTwin, mock.Anything, activities.FindTwinInput{EnvID: "env_1"}).Return(stale, nil).Once()
	env.OnActivity(a.OpenOnTwin, mock.Anything, activities.OpenOnTwinInput{Addr: stale.Addr, SessionID: "ses_1", Spec: openIn.Spec}).
		Return(activities.OpenOnTwinResult{}, temporal.NewApplicationError("connection refused", activities.ErrTypeTwinUnavailable)).Once()
	env.OnActivity(a.FindTwin, mock.Anything, activities.FindTwinInput{EnvID: "env_1", Suspect: "twin-a"}).Return(woken, nil).Once()
	env.OnActivity(a.OpenOnTwin, mock.Anything, activities.OpenOnTwinInput{Addr: woken.Addr, SessionID: "ses_1", Spec: openIn.Spec}).
		Return(activities.OpenOnTwinResult{Receipts: rpc.Receipts{WorldHash: "sha256:cd"}}, nil).Once()
	env.ExecuteWorkflow(SessionOpenWorkflowName, openIn)
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res SessionOpenResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.TwinAddr != woken.Addr || res.Receipts.WorldHash != "sha256:cd" {
		t.Fatalf("result = %+v", res)
	}
	env.AssertExpectations(t)
}

func TestSessionOpenBadSpecIsNotRetried(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	env.OnActivity(a.FindTwin, mock.Anything, mock.Anything).Return(activities.TwinEndpoint{Addr: "http://x"}, nil).Once()
	env.OnActivity(a.OpenOnTwin, mock.Anything, mock.Anything).
		Return(activities.OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError("scenario: no scenario \"x\"", activities.ErrTypeSessionSpec, nil)).Once()
	env.ExecuteWorkflow(SessionOpenWorkflowName, openIn)
	err := env.GetWorkflowError()
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeSessionSpec {
		t.Fatalf("err = %v, want a %s application error", err, activities.ErrTypeSessionSpec)
	}
	env.AssertExpectations(t)
}

func TestSessionReaperSweepsOnWorkflowTimeAndContinuesAsNew(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	var nows []time.Time
	env.OnActivity(a.ReapIdleSessions, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ReapInput) (activities.ReapResult, error) {
			if in.Idle != time.Hour {
				t.Errorf("idle = %v", in.Idle)
			}
			nows = append(nows, in.Now)
			if n := len(nows); n >= 3 && n <= 5 {
				// The third sweep fails all 3 attempts: the reaper logs it and keeps sweeping.
				return activities.ReapResult{}, errors.New("database away")
			}
			return activities.ReapResult{Expired: []string{"ses_x"}}, nil
		})
	env.ExecuteWorkflow(SessionReaperWorkflowName, SessionReaperInput{Idle: time.Hour, Every: 30 * time.Second})
	err := env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	if !errors.As(err, &can) {
		t.Fatalf("err = %v, want continue-as-new", err)
	}
	// sweepsPerRun sweeps, one of which took 3 attempts (retries carry their sweep's Now).
	if len(nows) != sweepsPerRun+2 {
		t.Fatalf("%d activity attempts before continuing as new, want %d", len(nows), sweepsPerRun+2)
	}
	distinct := 1
	for i := 1; i < len(nows); i++ {
		d := nows[i].Sub(nows[i-1])
		switch {
		case d == 0:
			continue
		case d < 30*time.Second:
			t.Fatalf("sweeps at %d and %d are %v apart, want ≥ 30s of workflow time", i-1, i, d)
		}
		distinct++
	}
	if distinct != sweepsPerRun {
		t.Fatalf("%d distinct sweep times, want %d", distinct, sweepsPerRun)
	}
}

func TestSessionReaperRefusesZeroIdle(t *testing.T) {
	env := newSessionEnv(t)
	env.ExecuteWorkflow(SessionReaperWorkflowName, SessionReaperInput{})
	if env.GetWorkflowError() == nil {
		t.Fatal("reaper with idle 0 ran")
	}
}
