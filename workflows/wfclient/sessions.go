package wfclient

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
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
	// OpenerIdle is how long an environment's session opener runs without an open (zero: the workflow's default).
	OpenerIdle time.Duration
	// OpenerShards is how many openers an environment's opens are spread over (zero: DefaultOpenerShards).
	OpenerShards int
	// OpenerInFlight bounds this process's opens in flight on one opener (zero: DefaultOpenerInFlight); keep it
	// under the server's history.maxInFlightUpdates.
	OpenerInFlight int

	mu       sync.Mutex
	inFlight map[string]chan struct{} // by opener workflow id
}

var _ toolplane.SessionOpener = (*Sessions)(nil)

// Open opens the world as an update of one of the environment's SessionOpener workflows (chosen by the session id),
// starting it when none runs (update-with-start), and waits for the update's result. The update's id is the
// session's, so a resent open is the same update. The opens this process has in flight on one opener are bounded
// (OpenerInFlight, under Temporal's history.maxInFlightUpdates); an open the server turned away without running it
// (the opener ending under it, its in-flight bound reached by other processes, the workflow busy) is sent again
// after a short wait: the world's open on the twin is idempotent by session id. Its refusals are the tool plane's
// (OpenError).
func (s *Sessions) Open(ctx context.Context, w toolplane.OpenWorld) (toolplane.OpenedWorld, error) {
	in := workflows.SessionOpenInput{SessionID: w.SessionID, EnvID: w.EnvID, Spec: w.Spec, TwinWait: s.TwinWait}
	shard := s.shard(in.SessionID)
	sem := s.slots(workflows.SessionOpenerWorkflowID(in.EnvID, shard))
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return toolplane.OpenedWorld{}, fmt.Errorf("open session %s: %w", in.SessionID, ctx.Err())
	}
	defer func() { <-sem }()
	var out workflows.SessionOpenResult
	var err error
	wait := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if out, err = s.openOnce(ctx, w, in, shard); err == nil || !openTurnedAway(err) || attempt == openAttempts-1 {
			break
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
	if err != nil {
		return toolplane.OpenedWorld{}, OpenError(err)
	}
	return toolplane.OpenedWorld{TwinAddr: out.TwinAddr, BuildID: out.BuildID, Receipts: out.Receipts, StateHash: out.StateHash}, nil
}

// openAttempts bounds the sends of one open the server turned away.
const openAttempts = 20

// Defaults of Sessions' opener settings.
const (
	DefaultOpenerShards   = 8
	DefaultOpenerInFlight = 8
)

// OpenerID is the workflow id of the opener that opens session sessionID of environment envID.
func (s *Sessions) OpenerID(envID, sessionID string) string {
	return workflows.SessionOpenerWorkflowID(envID, s.shard(sessionID))
}

// shard picks the opener of a session: a hash of its id, so opens spread evenly.
func (s *Sessions) shard(sessionID string) int {
	n := s.OpenerShards
	if n <= 0 {
		n = DefaultOpenerShards
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(sessionID))
	return int(h.Sum32() % uint32(n))
}

// slots is the semaphore bounding this process's opens in flight on one opener.
func (s *Sessions) slots(id string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight == nil {
		s.inFlight = map[string]chan struct{}{}
	}
	sem, ok := s.inFlight[id]
	if !ok {
		n := s.OpenerInFlight
		if n <= 0 {
			n = DefaultOpenerInFlight
		}
		sem = make(chan struct{}, n)
		s.inFlight[id] = sem
	}
	return sem
}

func (s *Sessions) openOnce(ctx context.Context, w toolplane.OpenWorld, in workflows.SessionOpenInput, shard int) (workflows.SessionOpenResult, error) {
	var out workflows.SessionOpenResult
	start := s.Client.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:                       workflows.SessionOpenerWorkflowID(in.EnvID, shard),
		TaskQueue:                s.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		StaticSummary:            "open sessions on " + in.EnvID,
		TypedSearchAttributes:    s.tags(w.WorkspaceID, w.EnvID, ""),
	}, workflows.SessionOpenerWorkflowName, workflows.SessionOpenerInput{EnvID: in.EnvID, Idle: s.OpenerIdle})
	h, err := s.Client.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{UpdateID: in.SessionID, UpdateName: workflows.OpenSessionUpdate,
			Args: []any{in}, WaitForStage: client.WorkflowUpdateStageCompleted},
	})
	if err != nil {
		return out, fmt.Errorf("open session %s: %w", in.SessionID, err)
	}
	if err := h.Get(ctx, &out); err != nil {
		return out, err
	}
	return out, nil
}

// openTurnedAway says the server turned an open's update away, or lost it, before the opener ran it to the end:
// the opener ended (idle) under it (NotFound, or the server's AcceptedUpdateCompletedWorkflow should it have been
// accepted), its bound of updates in flight was reached or the workflow was busy (ResourceExhausted), or the
// update was aborted (Unavailable). A new send reaches a running opener, and opening the world again answers the
// one already open. (An opener continuing as new has its pending updates sent to the new run by the server.)
func openTurnedAway(err error) bool {
	var notFound *serviceerror.NotFound
	var exhausted *serviceerror.ResourceExhausted
	var unavailable *serviceerror.Unavailable
	var appErr *temporal.ApplicationError
	return errors.As(err, &notFound) || errors.As(err, &exhausted) || errors.As(err, &unavailable) ||
		errors.As(err, &appErr) && appErr.Type() == "AcceptedUpdateCompletedWorkflow"
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
	var te *rpc.Error
	if errors.As(err, &te) && errors.Is(err, rpc.ErrBadSpec) {
		return OpenError(temporal.NewApplicationError(te.Detail, activities.ErrTypeSessionSpec))
	}
	if rpc.IsRetryable(err) {
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
