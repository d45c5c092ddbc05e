package workflows

import (
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/twin/rpc"
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
	Spec      rpc.SessionSpec
	// TwinWait bounds the wait for a cold twin (default DefaultSessionTwinWait; the spec's cold start is about two
	// minutes).
	TwinWait time.Duration
}

// DefaultSessionTwinWait is how long a session open waits for a cold twin unless told.
const DefaultSessionTwinWait = 5 * time.Minute

// SessionOpenResult is the opened session: where its twin answers, the build it runs, and its receipts.
type SessionOpenResult struct {
	TwinAddr  string
	BuildID   string
	Receipts  rpc.Receipts
	StateHash string
}

// SessionOpen finds the twin of the environment's active build (the one this worker last found, or one woken
// through the TwinWorkflow and waited for) and opens the session on it. Both steps are local activities: a warm
// open is one workflow task. A twin that does not answer is reported to the TwinWorkflow as suspect (checked,
// restarted if dead) and the open retried once.
func SessionOpen(ctx workflow.Context, in SessionOpenInput) (SessionOpenResult, error) {
	return openSession(ctx, in)
}

// openSession is the open of one session, as SessionOpen and the SessionOpener's updates run it.
func openSession(ctx workflow.Context, in SessionOpenInput) (SessionOpenResult, error) {
	var a *activities.Sessions
	wait := in.TwinWait
	if wait <= 0 {
		wait = DefaultSessionTwinWait
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

// RegisterSessions registers the session-open, session-opener and reaper workflows under their explicit names.
func RegisterSessions(r Registrar) {
	r.RegisterWorkflowWithOptions(SessionOpen, workflow.RegisterOptions{Name: SessionOpenWorkflowName})
	r.RegisterWorkflowWithOptions(SessionOpener, workflow.RegisterOptions{Name: SessionOpenerWorkflowName})
	r.RegisterWorkflowWithOptions(SessionReaper, workflow.RegisterOptions{Name: SessionReaperWorkflowName})
}
