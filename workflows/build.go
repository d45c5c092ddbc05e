package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twinstate"
)

// Registered names of the build workflows; never change them (running histories refer to them).
const (
	BuildWorkflowName   = "doppel.Build"
	RebuildWorkflowName = "doppel.Rebuild"

	// ProgressQuery answers a build's current BuildProgress.
	ProgressQuery = "progress"
	// CollectedSignal tells a Rebuild workflow that new traces arrived.
	CollectedSignal = "collected"
)

// BuildWorkflowID is the workflow id of one build.
func BuildWorkflowID(buildID string) string { return "build/" + buildID }

// BuildInput names the build to run; its inputs are found through the build row, never carried here.
type BuildInput struct {
	EnvID   string
	BuildID string
}

// BuildResult is what a finished build reports.
type BuildResult struct {
	BuildID    string
	Succeeded  bool
	BundleKey  string
	BundleHash string
	Error      string
}

// BuildProgress is the answer to ProgressQuery.
type BuildProgress struct {
	Stage   string  `json:"stage"`
	Percent float64 `json:"percent"`
}

// Stages of a build, in order, with the share of the work done when each starts.
var buildStages = []BuildProgress{
	{"planning", 0}, {"inferring", 10}, {"self-checking", 60}, {"activating", 95},
}

// Build turns an environment's collected traces and uploads into a bundle and activates it.
// A failure marks the build failed with its reason and leaves the previous active build in place.
func Build(ctx workflow.Context, in BuildInput) (BuildResult, error) {
	b := &builder{in: in, progress: BuildProgress{Stage: "queued"}}
	if err := workflow.SetQueryHandler(ctx, ProgressQuery, func() (BuildProgress, error) { return b.progress, nil }); err != nil {
		return BuildResult{}, err
	}
	return b.run(ctx)
}

type builder struct {
	in       BuildInput
	progress BuildProgress
}

func (b *builder) stage(ctx workflow.Context, i int) {
	b.progress = buildStages[i]
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("**%s** (%.0f%%)", b.progress.Stage, b.progress.Percent))
}

func (b *builder) run(ctx workflow.Context) (BuildResult, error) {
	var a *activities.Builds
	short := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 5},
	})
	long := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Minute,
		// The activities heartbeat every 2s with their progress: a worker that dies mid-build is noticed within
		// this timeout and the retry resumes from the last heartbeat (issue 13, defect 9).
		HeartbeatTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			MaximumInterval:        5 * time.Second,
			MaximumAttempts:        5,
			NonRetryableErrorTypes: []string{activities.ErrTypeBadInput},
		},
	})

	b.stage(ctx, 0)
	var plan activities.BuildPlan
	if err := workflow.ExecuteActivity(short, a.PlanBuild, b.in.EnvID, b.in.BuildID).Get(ctx, &plan); err != nil {
		return b.fail(short, err)
	}

	b.stage(ctx, 1)
	var inferred activities.Inferred
	if err := workflow.ExecuteActivity(long, a.InferBundle, plan).Get(ctx, &inferred); err != nil {
		return b.fail(short, err)
	}

	b.stage(ctx, 2)
	var checked activities.SelfChecked
	if err := workflow.ExecuteActivity(long, a.SelfCheck, plan, inferred).Get(ctx, &checked); err != nil {
		return b.fail(short, err)
	}

	b.stage(ctx, 3)
	if err := workflow.ExecuteActivity(short, a.ActivateBuild, plan, inferred, checked).Get(ctx, nil); err != nil {
		return b.fail(short, err)
	}
	if workflow.GetVersion(ctx, "build-activates-twin", workflow.DefaultVersion, 1) == 1 {
		b.activateTwin(ctx, twinstate.Build{BuildID: b.in.BuildID, BundleKey: inferred.BundleKey, BundleHash: inferred.BundleHash})
	}
	b.progress = BuildProgress{Stage: "succeeded", Percent: 100}
	workflow.SetCurrentDetails(ctx, "**succeeded**")
	return BuildResult{BuildID: b.in.BuildID, Succeeded: true, BundleKey: inferred.BundleKey, BundleHash: inferred.BundleHash}, nil
}

// activateTwin tells the environment's twin workflow, when one runs, that the new build is active: new sessions
// open on its bundle while open sessions stay on theirs. With no twin workflow running there is nothing to tell:
// the next wake starts one on the active build.
func (b *builder) activateTwin(ctx workflow.Context, tb twinstate.Build) {
	err := workflow.SignalExternalWorkflow(ctx, TwinWorkflowID(b.in.EnvID), "", NewBuildSignal, tb).Get(ctx, nil)
	if err != nil {
		workflow.GetLogger(ctx).Info("no twin to move to the new build", "env", b.in.EnvID, "build", b.in.BuildID, "reason", err)
	}
}

// fail records why the build failed; the workflow itself completes, reporting the failure in its result.
func (b *builder) fail(ctx workflow.Context, cause error) (BuildResult, error) {
	reason := cause.Error()
	var appErr *temporal.ApplicationError
	if errors.As(cause, &appErr) {
		reason = appErr.Message()
	}
	b.progress = BuildProgress{Stage: "failed", Percent: b.progress.Percent}
	workflow.SetCurrentDetails(ctx, "**failed**: "+reason)
	var a *activities.Builds
	if err := workflow.ExecuteActivity(ctx, a.FailBuild, b.in.EnvID, b.in.BuildID, reason).Get(ctx, nil); err != nil {
		return BuildResult{}, fmt.Errorf("record build failure (%s): %w", reason, err)
	}
	return BuildResult{BuildID: b.in.BuildID, Error: reason}, nil
}

// RebuildInput configures an environment's debounced rebuild.
type RebuildInput struct {
	EnvID    string
	Debounce time.Duration
}

// Rebuild waits until no CollectedSignal has arrived for Debounce, then runs one Build as a child. Signals that
// arrive while the build runs continue the workflow as new, so the last batch is always built.
func Rebuild(ctx workflow.Context, in RebuildInput) (BuildResult, error) {
	signals := workflow.GetSignalChannel(ctx, CollectedSignal)
	for {
		timerCtx, cancel := workflow.WithCancel(ctx)
		quiet := false
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(workflow.NewTimer(timerCtx, in.Debounce), func(workflow.Future) { quiet = true })
		sel.AddReceive(signals, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.Select(ctx)
		cancel()
		if quiet {
			break
		}
	}
	for signals.ReceiveAsync(nil) {
	}

	short := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 5},
	})
	var a *activities.Builds
	var buildID string
	if err := workflow.ExecuteActivity(short, a.QueueBuild, in.EnvID).Get(ctx, &buildID); err != nil {
		return BuildResult{}, err
	}
	// The build carries the rebuild's search attributes and its own build id (a child start's attributes are not
	// part of what a replay compares).
	child := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: BuildWorkflowID(buildID),
		TypedSearchAttributes: ChildTags(ctx, buildID)})
	fut := workflow.ExecuteChildWorkflow(child, BuildWorkflowName, BuildInput{EnvID: in.EnvID, BuildID: buildID})
	more := false
	for done := false; !done; {
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(fut, func(workflow.Future) { done = true })
		sel.AddReceive(signals, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil); more = true })
		sel.Select(ctx)
	}
	var res BuildResult
	err := fut.Get(ctx, &res)
	more = more || signals.ReceiveAsync(nil)
	if more {
		return BuildResult{}, workflow.NewContinueAsNewError(ctx, RebuildWorkflowName, in)
	}
	return res, err
}
