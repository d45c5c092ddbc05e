package wfclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/query/flow"
)

// QueryWorkflowID is the workflow id of one query.
func QueryWorkflowID(queryID string) string { return "query/" + queryID }

// Queries runs query workflows for the query service (its query.Runner).
type Queries struct {
	Conn
	// TwinWait bounds a query's session open's wait for a cold twin (config twin.wait).
	TwinWait time.Duration
}

var _ query.Runner = (*Queries)(nil)

// Start starts the query's workflow (workflow id query/<id>); starting it again is a no-op.
func (q *Queries) Start(ctx context.Context, in query.Input) error {
	if in.TwinWait == 0 {
		in.TwinWait = q.TwinWait
	}
	deadline := in.Deadline
	if deadline <= 0 {
		deadline = query.DefaultDeadline
	}
	_, err := q.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       QueryWorkflowID(in.QueryID),
		TaskQueue:                q.TaskQueue,
		EnableEagerStart:         true,
		WorkflowExecutionTimeout: deadline + 10*time.Minute, // the open may wait for a cold twin; closing and recording follow
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "query " + in.QueryID + " on " + in.EnvSlug,
		TypedSearchAttributes:    q.tags(in.WorkspaceID, in.EnvID, in.BuildID),
	}, flow.QueryWorkflowName, in)
	if err != nil {
		return fmt.Errorf("start query %s: %w", in.QueryID, err)
	}
	return nil
}

// Await waits until the query's workflow ends or ctx does: nil when it succeeded, its failure (QueryFailure) when
// it failed.
func (q *Queries) Await(ctx context.Context, queryID string) error {
	return QueryFailure(q.Client.GetWorkflow(ctx, QueryWorkflowID(queryID), "").Get(ctx, nil))
}

// QueryFailure turns a query workflow's failure into a *query.Failure: its application error's type, field
// (the error's details) and message, or a timeout. A context's error and nil pass unchanged.
func QueryFailure(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		f := &query.Failure{Kind: appErr.Type(), Message: appErr.Message()}
		if appErr.HasDetails() {
			_ = appErr.Details(&f.Field)
		}
		return f
	}
	var te *temporal.TimeoutError
	return &query.Failure{Message: err.Error(), Timeout: errors.As(err, &te)}
}
