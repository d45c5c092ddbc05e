package workflows_test

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// TestRecordSettleSpansHistory records a SettleSpans history on a real Temporal server with stand-in activities
// (one conversation still pending at the first run, then done), into RECORD_OUT_SETTLE. Skipped unless set.
func TestRecordSettleSpansHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_OUT_SETTLE", "record-settle-")
	runs := 0
	w.RegisterActivityWithOptions(func(ctx context.Context, envID string, settle time.Duration) (activities.SettleResult, error) {
		runs++
		if runs == 1 {
			return activities.SettleResult{Assembled: 2, Pending: 1, NextIn: time.Second}, nil
		}
		return activities.SettleResult{Assembled: 1}, nil
	}, activity.RegisterOptions{Name: "AssembleSettled"})
	w.RegisterActivityWithOptions(func(ctx context.Context, envID string) error { return nil }, activity.RegisterOptions{Name: "ScheduleRebuild"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	s := &wfclient.Spans{Conn: wfclient.Conn{Client: c, TaskQueue: queue}, Settle: time.Second}
	ctx := context.Background()
	if err := s.ScheduleSettle(ctx, "ws_record", "env_record"); err != nil {
		t.Fatal(err)
	}
	if err := s.ScheduleSettle(ctx, "ws_record", "env_record"); err != nil { // a second export, signalling the same run
		t.Fatal(err)
	}
	run := c.GetWorkflow(ctx, wfclient.SettleSpansWorkflowID("env_record"), "")
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, wfclient.SettleSpansWorkflowID("env_record"), out)
}
