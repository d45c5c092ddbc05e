package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twinrpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// SessionOpenWorkflowName is the registered name of the session-open workflow; never change it.
const SessionOpenWorkflowName = "doppel.SessionOpen"

// SessionOpenWorkflowID is the workflow id of one session's open.
func SessionOpenWorkflowID(sessionID string) string { return "session-open/" + sessionID }

// SessionOpenInput names the session to open: its id (chosen by the API), environment and world spec.
// The session token never passes through Temporal: the API mints it after the open succeeds.
type SessionOpenInput struct {
	SessionID string
	EnvID     string
	Spec      twinrpc.SessionSpec
	// TwinWait bounds the wait for a cold twin (default 5 minutes; the spec's cold start is about two).
	TwinWait time.Duration
}

// SessionOpenResult is the opened session: where its twin answers, the build it runs, and its receipts.
type SessionOpenResult struct {
	TwinAddr  string
	BuildID   string
	Receipts  twinrpc.Receipts
	StateHash string
}

// SessionOpen finds the twin of the environment's active build (the one this worker last found, or one woken
// through the TwinWorkflow and waited for) and opens the session on it. Both steps are local activities: a warm
// open is one workflow task. A twin that does not answer is reported to the TwinWorkflow as suspect (checked,
// restarted if dead) and the open retried once.
func SessionOpen(ctx workflow.Context, in SessionOpenInput) (SessionOpenResult, error) {
	var a *activities.Sessions
	wait := in.TwinWait
	if wait <= 0 {
		wait = 5 * time.Minute
	}
	findCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: wait,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3, NonRetryableErrorTypes: []string{activities.ErrTypeBadInput}},
	})
	openCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 2, NonRetryableErrorTypes: []string{
			activities.ErrTypeSessionSpec, activities.ErrTypeTwinUnavailable}},
	})
	var out SessionOpenResult
	suspect := ""
	for attempt := 0; attempt < 2; attempt++ {
		var ep activities.TwinEndpoint
		if err := workflow.ExecuteLocalActivity(findCtx, a.FindTwin, activities.FindTwinInput{EnvID: in.EnvID, Suspect: suspect}).Get(ctx, &ep); err != nil {
			return out, err
		}
		var res activities.OpenOnTwinResult
		err := workflow.ExecuteLocalActivity(openCtx, a.OpenOnTwin, activities.OpenOnTwinInput{Addr: ep.Addr, SessionID: in.SessionID, Spec: in.Spec}).Get(ctx, &res)
		var appErr *temporal.ApplicationError
		if err != nil && attempt == 0 && errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeTwinUnavailable {
			suspect = ep.HandleID // the twin found did not answer: have it checked (restarted if dead) and try again
			if suspect == "" {
				suspect = ep.Addr
			}
			continue
		}
		if err != nil {
			return out, err
		}
		return SessionOpenResult{TwinAddr: ep.Addr, BuildID: ep.BuildID, Receipts: res.Receipts, StateHash: res.StateHash}, nil
	}
	return out, temporal.NewApplicationError("twin of "+in.EnvID+" did not answer after waking", activities.ErrTypeTwinUnavailable)
}

// RegisterSessions registers the session-open and reaper workflows under their explicit names.
func RegisterSessions(r Registrar) {
	r.RegisterWorkflowWithOptions(SessionOpen, workflow.RegisterOptions{Name: SessionOpenWorkflowName})
	r.RegisterWorkflowWithOptions(SessionReaper, workflow.RegisterOptions{Name: SessionReaperWorkflowName})
}

// Sessions starts the session workflows from the API side.
type Sessions struct {
	Client    client.Client
	TaskQueue string
	// TwinWait bounds a session open's wait for a cold twin.
	TwinWait time.Duration
}

// Open runs the session-open workflow (eagerly, on a worker in this process when there is one) and waits
// for its result.
func (s *Sessions) Open(ctx context.Context, in SessionOpenInput) (SessionOpenResult, error) {
	if in.TwinWait == 0 {
		in.TwinWait = s.TwinWait
	}
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       SessionOpenWorkflowID(in.SessionID),
		TaskQueue:                s.TaskQueue,
		EnableEagerStart:         true,
		WorkflowExecutionTimeout: in.TwinWait + time.Minute,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "open session " + in.SessionID + " on " + in.EnvID,
	}, SessionOpenWorkflowName, in)
	if err != nil {
		return SessionOpenResult{}, fmt.Errorf("start session open %s: %w", in.SessionID, err)
	}
	var out SessionOpenResult
	if err := run.Get(ctx, &out); err != nil {
		return SessionOpenResult{}, err
	}
	return out, nil
}

// TwinDirectory finds environments' twins through their TwinWorkflows: it is the activities.TwinDirectory of
// session opens (waiting for a cold twin) and of the call path (waking without waiting).
type TwinDirectory struct {
	Client    client.Client
	TaskQueue string
	// Input is the TwinInput a wake starts an environment's TwinWorkflow with when none runs (Idle,
	// HealthEvery, ReapEvery); EnvID and Active are filled per wake.
	Input TwinInput
}

var _ activities.TwinDirectory = (*TwinDirectory)(nil)

// WakeTwin implements activities.TwinDirectory with the TwinWorkflow's wake update.
func (d *TwinDirectory) WakeTwin(ctx context.Context, w twinstate.Wake) (twinstate.Status, error) {
	in := d.Input
	in.EnvID, in.Active, in.Twins = w.EnvID, w.Active, nil
	st, err := WakeTwin(ctx, d.Client, d.TaskQueue, in, WakeRequest{Build: w.Build, Wait: w.Wait, Suspect: w.Suspect, Idle: d.Input.Idle})
	if err != nil {
		return twinstate.Status{}, err
	}
	out := twinstate.Status{State: st.State, Addr: st.Addr, BuildID: st.Build.BuildID, Error: st.Error, ErrorType: st.ErrorType}
	if st.Handle != nil {
		out.HandleID = st.Handle.ID
	}
	return out, nil
}

// RunningTwins implements activities.TwinDirectory with the TwinWorkflow's status query (no twin is booted).
func (d *TwinDirectory) RunningTwins(ctx context.Context, envID string) (map[string]twinstate.Status, error) {
	out := map[string]twinstate.Status{}
	v, err := d.Client.QueryWorkflow(ctx, TwinWorkflowID(envID), "", TwinStatusQuery)
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("twins of %s: %w", envID, err)
	}
	var st TwinStatus
	if err := v.Get(&st); err != nil {
		return nil, fmt.Errorf("twins of %s: %w", envID, err)
	}
	for _, t := range st.Twins {
		if t.State != twinstate.Ready || t.Handle == nil {
			continue
		}
		out[t.Build.BuildID] = twinstate.Status{State: t.State, Addr: t.Handle.Addr, BuildID: t.Build.BuildID, HandleID: t.Handle.ID}
	}
	return out, nil
}
