package wfclient

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/doppel-dev/doppel/workflows"
)

// RebuildWorkflowID is the workflow id of an environment's debounced rebuild.
func RebuildWorkflowID(envID string) string { return "rebuild/" + envID }

// Builds starts builds: the API's build route and collect, and a starting worker's missed rebuilds.
type Builds struct {
	Conn
	// Debounce is the quiet time after the last collected batch before a rebuild starts.
	Debounce time.Duration
}

// ScheduleBuild signals the environment's Rebuild workflow, starting it if none runs: batches that arrive close
// together produce one build, started Debounce after the last.
func (b *Builds) ScheduleBuild(ctx context.Context, workspaceID, envID string) error {
	_, err := b.Client.SignalWithStartWorkflow(ctx, RebuildWorkflowID(envID), workflows.CollectedSignal, nil,
		client.StartWorkflowOptions{
			TaskQueue:             b.TaskQueue,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			StaticSummary:         "rebuild " + envID + " after collected traces",
			TypedSearchAttributes: b.tags(workspaceID, envID, ""),
		},
		workflows.RebuildWorkflowName, workflows.RebuildInput{EnvID: envID, Debounce: b.Debounce})
	if err != nil {
		return fmt.Errorf("schedule rebuild of %s: %w", envID, err)
	}
	return nil
}

// StartBuild starts the Build workflow for an already created build row and answers its workflow id.
func (b *Builds) StartBuild(ctx context.Context, workspaceID, envID, buildID string) (string, error) {
	run, err := b.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                    workflows.BuildWorkflowID(buildID),
		TaskQueue:             b.TaskQueue,
		StaticSummary:         "build " + buildID + " of " + envID,
		TypedSearchAttributes: b.tags(workspaceID, envID, buildID),
	}, workflows.BuildWorkflowName, workflows.BuildInput{EnvID: envID, BuildID: buildID})
	if err != nil {
		return "", fmt.Errorf("start build %s: %w", buildID, err)
	}
	return run.GetID(), nil
}
