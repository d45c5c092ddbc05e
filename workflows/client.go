package workflows

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// Starter starts doppel's workflows from the API side.
type Starter struct {
	Client    client.Client
	TaskQueue string
	// Debounce is the quiet time after the last collected batch before a rebuild starts.
	Debounce time.Duration
	// Settle is how long a conversation's spans must be quiet before it becomes a trace (ScheduleSettle).
	Settle time.Duration
}

// ScheduleBuild signals the environment's Rebuild workflow, starting it if none runs: batches that arrive close
// together produce one build, started Debounce after the last.
func (s *Starter) ScheduleBuild(ctx context.Context, envID string) error {
	_, err := s.Client.SignalWithStartWorkflow(ctx, RebuildWorkflowID(envID), CollectedSignal, nil,
		client.StartWorkflowOptions{
			TaskQueue:             s.TaskQueue,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			StaticSummary:         "rebuild " + envID + " after collected traces",
		},
		RebuildWorkflowName, RebuildInput{EnvID: envID, Debounce: s.Debounce})
	if err != nil {
		return fmt.Errorf("schedule rebuild of %s: %w", envID, err)
	}
	return nil
}

// StartBuild starts the Build workflow for an already created build row.
func (s *Starter) StartBuild(ctx context.Context, envID, buildID string) (string, error) {
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:            BuildWorkflowID(buildID),
		TaskQueue:     s.TaskQueue,
		StaticSummary: "build " + buildID + " of " + envID,
	}, BuildWorkflowName, BuildInput{EnvID: envID, BuildID: buildID})
	if err != nil {
		return "", fmt.Errorf("start build %s: %w", buildID, err)
	}
	return run.GetID(), nil
}

// BuildProgress asks a running build for its progress.
func (s *Starter) BuildProgress(ctx context.Context, buildID string) (BuildProgress, error) {
	var p BuildProgress
	v, err := s.Client.QueryWorkflow(ctx, BuildWorkflowID(buildID), "", ProgressQuery)
	if err != nil {
		return p, err
	}
	return p, v.Get(&p)
}
