package workflows

import (
	"errors"
	"strconv"
	"time"

	"go.temporal.io/sdk/workflow"
)

// Registered name and update name of the session opener; never change them.
const (
	SessionOpenerWorkflowName = "doppel.SessionOpener"
	// OpenSessionUpdate (SessionOpenInput → SessionOpenResult) opens one session's world, as SessionOpen does.
	OpenSessionUpdate = "open"
)

// Defaults of SessionOpenerInput.
const (
	// DefaultOpenerIdle is how long an opener waits without an open before it ends.
	DefaultOpenerIdle = 10 * time.Minute
	// DefaultOpenerMaxHistory is the history length past which an opener continues as new once its opens are done.
	DefaultOpenerMaxHistory = 4_000
)

// SessionOpenerWorkflowID is the workflow id of one of an environment's session openers: opens are spread over a
// few (shard 0, 1, …), as Temporal bounds the updates in flight on one workflow (history.maxInFlightUpdates, 10 by
// default) and serializes each workflow's requests.
func SessionOpenerWorkflowID(envID string, shard int) string {
	return "session-opener/" + envID + "/" + strconv.Itoa(shard)
}

// SessionOpenerInput starts (or continues) an environment's session opener.
type SessionOpenerInput struct {
	EnvID string
	// Idle is how long the opener runs with no open before it ends (zero: DefaultOpenerIdle); the next open starts
	// it again.
	Idle time.Duration
	// MaxHistory is the history length past which it continues as new (zero: DefaultOpenerMaxHistory).
	MaxHistory int
}

// SessionOpener opens an environment's sessions, one OpenSessionUpdate each: a long-running workflow per
// environment, so an open costs one update rather than a workflow of its own. Each update runs SessionOpen's steps
// (find the twin, open the world on it: local activities), and the updates that arrive together are handled in one
// workflow task. Same receipts and world hash as SessionOpen: the twin opens the world from the same spec.
//
// It ends after Idle with no open and continues as new once its history passes MaxHistory (or the server suggests
// it), in both cases after the opens in flight have answered.
func SessionOpener(ctx workflow.Context, in SessionOpenerInput) error {
	idle := in.Idle
	if idle <= 0 {
		idle = DefaultOpenerIdle
	}
	maxHistory := in.MaxHistory
	if maxHistory <= 0 {
		maxHistory = DefaultOpenerMaxHistory
	}
	opens := 0
	if err := workflow.SetUpdateHandlerWithOptions(ctx, OpenSessionUpdate,
		func(ctx workflow.Context, o SessionOpenInput) (SessionOpenResult, error) {
			opens++
			return openSession(ctx, o)
		},
		workflow.UpdateHandlerOptions{Validator: func(o SessionOpenInput) error {
			if o.SessionID == "" {
				return errors.New("an open names its session")
			}
			if o.EnvID != in.EnvID {
				return errors.New("this opener opens sessions of " + in.EnvID + ", not " + o.EnvID)
			}
			return nil
		}}); err != nil {
		return err
	}
	full := func() bool {
		info := workflow.GetInfo(ctx)
		return info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() >= maxHistory
	}
	for {
		seen := opens
		// One timer per idle period, not per open: the loop wakes early only to continue as new.
		isFull, err := workflow.AwaitWithTimeout(ctx, idle, full)
		if err != nil {
			return err
		}
		if isFull {
			if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
				return err
			}
			return workflow.NewContinueAsNewError(ctx, SessionOpenerWorkflowName, in)
		}
		if opens == seen && workflow.AllHandlersFinished(ctx) {
			return nil
		}
	}
}
