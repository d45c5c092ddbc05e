package workflows

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// sendOpen sends an open update for session id at delay and records its answer in got.
func sendOpen(env *testsuite.TestWorkflowEnvironment, delay time.Duration, in SessionOpenInput, got map[string]SessionOpenResult, errs map[string]error) {
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(OpenSessionUpdate, in.SessionID, &testsuite.TestUpdateCallback{
			OnReject: func(err error) { errs[in.SessionID] = err },
			OnAccept: func() {},
			OnComplete: func(v any, err error) {
				if err != nil {
					errs[in.SessionID] = err
					return
				}
				got[in.SessionID] = v.(SessionOpenResult)
			},
		}, in)
	}, delay)
}

func TestSessionOpenerOpensEachUpdateAndEndsIdle(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	ep := activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_1"}
	env.OnActivity(a.FindTwin, mock.Anything, activities.FindTwinInput{EnvID: "env_1"}).Return(ep, nil)
	env.OnActivity(a.OpenOnTwin, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
			return activities.OpenOnTwinResult{Receipts: rpc.Receipts{Seeded: true, Seed: in.Spec.Seed, WorldHash: fmt.Sprintf("sha256:%d", in.Spec.Seed)},
				StateHash: "sha256:s-" + in.SessionID}, nil
		})
	got, errs := map[string]SessionOpenResult{}, map[string]error{}
	for i, d := range []time.Duration{time.Second, time.Second, 2 * time.Second, 5 * time.Minute} {
		in := openIn
		in.SessionID = fmt.Sprintf("ses_%d", i)
		in.Spec.Seed = int64(i)
		sendOpen(env, d, in, got, errs)
	}
	bad := openIn
	bad.SessionID, bad.EnvID = "ses_other", "env_2"
	sendOpen(env, 3*time.Second, bad, got, errs)
	start := env.Now()
	env.ExecuteWorkflow(SessionOpenerWorkflowName, SessionOpenerInput{EnvID: "env_1", Idle: 10 * time.Minute})
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("completed=%v err=%v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	for i := range 4 {
		id := fmt.Sprintf("ses_%d", i)
		r, ok := got[id]
		if !ok || r.TwinAddr != ep.Addr || r.BuildID != "bld_1" || r.Receipts.WorldHash != fmt.Sprintf("sha256:%d", i) || r.StateHash != "sha256:s-"+id {
			t.Errorf("%s: %+v (answered %v, err %v)", id, r, ok, errs[id])
		}
	}
	if errs["ses_other"] == nil {
		t.Error("an open of another environment's session was accepted")
	}
	// The last open at 5 min: the opener ends after a whole idle period without one (10 to 20 min), not before.
	if ran := env.Now().Sub(start); ran < 15*time.Minute || ran > 25*time.Minute {
		t.Fatalf("the opener ended after %v, want 20m (a whole idle period after the last open's)", ran)
	}
}

func TestSessionOpenerPassesRefusalsAndContinuesAsNew(t *testing.T) {
	env := newSessionEnv(t)
	var a *activities.Sessions
	env.OnActivity(a.FindTwin, mock.Anything, mock.Anything).Return(activities.TwinEndpoint{Addr: "http://x", BuildID: "bld_1"}, nil)
	env.OnActivity(a.OpenOnTwin, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
			if in.SessionID == "ses_bad" {
				return activities.OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError("scenario: no scenario \"x\"", activities.ErrTypeSessionSpec, nil)
			}
			return activities.OpenOnTwinResult{Receipts: rpc.Receipts{WorldHash: "sha256:w"}}, nil
		})
	got, errs := map[string]SessionOpenResult{}, map[string]error{}
	for i := range 9 {
		in := openIn
		in.SessionID = fmt.Sprintf("ses_%d", i)
		if i == 3 {
			in.SessionID = "ses_bad"
		}
		sendOpen(env, time.Duration(i+1)*time.Second, in, got, errs)
	}
	// The history passes MaxHistory after the ninth open: the opener continues as new.
	env.RegisterDelayedCallback(func() { env.SetCurrentHistoryLength(61) }, 9500*time.Millisecond)
	env.ExecuteWorkflow(SessionOpenerWorkflowName, SessionOpenerInput{EnvID: "env_1", MaxHistory: 60})
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("err = %v, want continue-as-new past 60 events", err)
	}
	var appErr *temporal.ApplicationError
	if !errors.As(errs["ses_bad"], &appErr) || appErr.Type() != activities.ErrTypeSessionSpec {
		t.Fatalf("refused open answered %v, want a %s application error", errs["ses_bad"], activities.ErrTypeSessionSpec)
	}
	// Every open sent before it continued answered: none was left behind in the old run.
	if len(got) != 8 {
		t.Fatalf("%d opens answered before continuing as new, want 8 (and the refused one): %v %v", len(got), got, errs)
	}
	for id, err := range errs {
		if id != "ses_bad" {
			t.Errorf("%s: %v", id, err)
		}
	}
}
