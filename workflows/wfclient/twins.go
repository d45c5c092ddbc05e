package wfclient

import (
	"context"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/workflows"
)

// TwinDirectory finds environments' twins through their TwinWorkflows: the twin directory of session opens
// (waiting for a cold twin) and of the call path (waking without waiting).
type TwinDirectory struct {
	Conn
	// Input is the TwinInput a wake starts an environment's TwinWorkflow with when none runs (Idle, HealthEvery,
	// ReapEvery); EnvID and Active are filled per wake.
	Input workflows.TwinInput
}

// WakeTwin wakes the build's twin with the TwinWorkflow's wake update.
func (d *TwinDirectory) WakeTwin(ctx context.Context, w twinstate.Wake) (twinstate.Status, error) {
	in := d.Input
	in.EnvID, in.Active, in.Twins = w.EnvID, w.Active, nil
	st, err := d.Wake(ctx, w.WorkspaceID, in, workflows.WakeRequest{Build: w.Build, Wait: w.Wait, Suspect: w.Suspect, Idle: d.Input.Idle})
	if err != nil {
		return twinstate.Status{}, err
	}
	out := twinstate.Status{State: st.State, Addr: st.Addr, BuildID: st.Build.BuildID, Error: st.Error, ErrorType: st.ErrorType}
	if st.Handle != nil {
		out.HandleID = st.Handle.ID
	}
	return out, nil
}

// RunningTwins answers the environment's ready twins by build id, with the TwinWorkflow's status query (no twin is
// booted).
func (d *TwinDirectory) RunningTwins(ctx context.Context, envID string) (map[string]twinstate.Status, error) {
	out := map[string]twinstate.Status{}
	st, ok, err := d.Status(ctx, envID)
	if err != nil || !ok {
		return out, err
	}
	for _, t := range st.Twins {
		if t.State != twinstate.Ready || t.Handle == nil {
			continue
		}
		out[t.Build.BuildID] = twinstate.Status{State: t.State, Addr: t.Handle.Addr, BuildID: t.Build.BuildID, HandleID: t.Handle.ID}
	}
	return out, nil
}

// State answers the state of the environment's active twin as the API shows it: stopped when no TwinWorkflow runs
// or its last start failed.
func (d *TwinDirectory) State(ctx context.Context, envID string) (string, error) {
	st, ok, err := d.Status(ctx, envID)
	if err != nil {
		return "", err
	}
	if !ok || st.State == twinstate.Failed {
		return twinstate.Stopped, nil
	}
	return st.State, nil
}

// Status asks the environment's TwinWorkflow for its status; ok is false when none runs.
func (c Conn) Status(ctx context.Context, envID string) (st workflows.TwinStatus, ok bool, err error) {
	v, err := c.Client.QueryWorkflow(ctx, workflows.TwinWorkflowID(envID), "", workflows.TwinStatusQuery)
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("twins of %s: %w", envID, err)
	}
	if err := v.Get(&st); err != nil {
		return st, false, fmt.Errorf("twins of %s: %w", envID, err)
	}
	return st, true, nil
}

// Wake sends a WakeRequest to the environment's twin workflow, starting it with in (in workspaceID) if none runs,
// and answers the build's TwinStatus. The API's wake route answers 202 for booting and 200 for ready; a session open sets Wait.
// An ErrorType of twinstate.EngineUnreachable on a failed twin is a 503.
func (c Conn) Wake(ctx context.Context, workspaceID string, in workflows.TwinInput, req workflows.WakeRequest) (workflows.TwinStatus, error) {
	start := c.Client.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:                       workflows.TwinWorkflowID(in.EnvID),
		TaskQueue:                c.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		StaticSummary:            "twin of " + in.EnvID,
		TypedSearchAttributes:    c.tags(workspaceID, in.EnvID, in.Active.BuildID),
	}, workflows.TwinWorkflowName, in)
	h, err := c.Client.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{UpdateName: workflows.WakeUpdate, Args: []any{req},
			WaitForStage: client.WorkflowUpdateStageCompleted},
	})
	if err != nil {
		return workflows.TwinStatus{}, fmt.Errorf("wake twin of %s: %w", in.EnvID, err)
	}
	var st workflows.TwinStatus
	if err := h.Get(ctx, &st); err != nil {
		return workflows.TwinStatus{}, fmt.Errorf("wake twin of %s: %w", in.EnvID, err)
	}
	return st, nil
}

// ActivateTwinBuild tells the environment's twin workflow, if one runs, that b is the active build. (With none
// running, the next wake starts one with the active build in its input.)
func (c Conn) ActivateTwinBuild(ctx context.Context, envID string, b twinstate.Build) error {
	err := c.Client.SignalWorkflow(ctx, workflows.TwinWorkflowID(envID), "", workflows.NewBuildSignal, b)
	var notFound *serviceerror.NotFound
	if err != nil && !errors.As(err, &notFound) {
		return fmt.Errorf("activate build %s on the twin of %s: %w", b.BuildID, envID, err)
	}
	return nil
}
