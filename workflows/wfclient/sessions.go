package wfclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twinrpc"
	"github.com/doppel-dev/doppel/workflows"
)

// SessionReaperWorkflowID is the reaper's workflow id on the default task queue "doppel".
const SessionReaperWorkflowID = "session-reaper"

// SessionReaperID is the reaper's workflow id for a task queue: one reaper per task queue, so deployments that
// share a namespace on different queues (each with its own database) each expire their own sessions. The default
// queue keeps the id it always had.
func SessionReaperID(taskQueue string) string {
	if taskQueue == "" || taskQueue == "doppel" {
		return SessionReaperWorkflowID
	}
	return SessionReaperWorkflowID + "/" + taskQueue
}

// Sessions runs session opens for the tool plane (its toolplane.SessionOpener) and starts the idle-session reaper.
type Sessions struct {
	Conn
	// TwinWait bounds a session open's wait for a cold twin.
	TwinWait time.Duration
}

var _ toolplane.SessionOpener = (*Sessions)(nil)

// Open runs the session-open workflow (eagerly, on a worker in this process when there is one) and waits for its
// result. Its refusals are the tool plane's (OpenError).
func (s *Sessions) Open(ctx context.Context, w toolplane.OpenWorld) (toolplane.OpenedWorld, error) {
	in := workflows.SessionOpenInput{SessionID: w.SessionID, EnvID: w.EnvID, Spec: w.Spec, TwinWait: s.TwinWait}
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       workflows.SessionOpenWorkflowID(in.SessionID),
		TaskQueue:                s.TaskQueue,
		EnableEagerStart:         true,
		WorkflowExecutionTimeout: in.TwinWait + time.Minute,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "open session " + in.SessionID + " on " + in.EnvID,
		TypedSearchAttributes:    s.tags(w.WorkspaceID, w.EnvID, w.BuildID),
	}, workflows.SessionOpenWorkflowName, in)
	if err != nil {
		return toolplane.OpenedWorld{}, fmt.Errorf("start session open %s: %w", in.SessionID, err)
	}
	var out workflows.SessionOpenResult
	if err := run.Get(ctx, &out); err != nil {
		return toolplane.OpenedWorld{}, OpenError(err)
	}
	return toolplane.OpenedWorld{TwinAddr: out.TwinAddr, BuildID: out.BuildID, Receipts: out.Receipts, StateHash: out.StateHash}, nil
}

// OpenError turns a failed session open (the workflow's, or its activities' run directly) into the tool plane's
// refusal: a refused spec is Invalid naming its field, a gone environment NotFound, a twin that never came up
// Unavailable. Other errors pass unchanged.
func OpenError(err error) error {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		msg := appErr.Message()
		switch appErr.Type() {
		case activities.ErrTypeSessionSpec:
			return toolplane.SpecRefusal(msg)
		case activities.ErrTypeBadInput:
			return &toolplane.Error{Kind: toolplane.NotFound, Detail: msg}
		}
		if strings.HasPrefix(appErr.Type(), "Twin") { // the twin activities' error types: it did not come up
			return &toolplane.Error{Kind: toolplane.Unavailable, Detail: "the environment's twin is not available: " + msg}
		}
	}
	var te *twinrpc.Error
	if errors.As(err, &te) && errors.Is(err, twinrpc.ErrBadSpec) {
		return OpenError(temporal.NewApplicationError(te.Detail, activities.ErrTypeSessionSpec))
	}
	if twinrpc.IsRetryable(err) {
		return &toolplane.Error{Kind: toolplane.Unavailable, Detail: fmt.Sprintf("the environment's twin is not available: %v", err)}
	}
	return err
}

// StartReaper starts the idle-session reaper unless it already runs.
func (s *Sessions) StartReaper(ctx context.Context, in workflows.SessionReaperInput) error {
	_, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       SessionReaperID(s.TaskQueue),
		TaskQueue:                s.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "expire sessions idle for " + in.Idle.String(),
	}, workflows.SessionReaperWorkflowName, in)
	if err != nil {
		return fmt.Errorf("start session reaper: %w", err)
	}
	return nil
}
