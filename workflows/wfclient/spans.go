package wfclient

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/doppel-dev/doppel/workflows"
)

// SettleSpansWorkflowID is the workflow id of an environment's span settling.
func SettleSpansWorkflowID(envID string) string { return "settle-spans/" + envID }

// Spans starts environments' span settling: POST /v1/traces after each export, a starting worker for what a crash
// left pending.
type Spans struct {
	Conn
	// Settle is how long a conversation's spans must be quiet before it becomes a trace (config otlp.settle).
	Settle time.Duration
}

// ScheduleSettle signals the environment's SettleSpans workflow, starting it if none runs (api.SpanSettler).
func (s *Spans) ScheduleSettle(ctx context.Context, workspaceID, envID string) error {
	_, err := s.Client.SignalWithStartWorkflow(ctx, SettleSpansWorkflowID(envID), workflows.SpansStagedSignal, nil,
		client.StartWorkflowOptions{
			TaskQueue:             s.TaskQueue,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			StaticSummary:         "assemble the spans of " + envID + " into traces as their conversations settle",
			TypedSearchAttributes: s.tags(workspaceID, envID, ""),
		},
		workflows.SettleSpansWorkflowName, workflows.SettleSpansInput{EnvID: envID, Settle: s.Settle})
	if err != nil {
		return fmt.Errorf("schedule span settling of %s: %w", envID, err)
	}
	return nil
}
