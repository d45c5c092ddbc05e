package workflows_test

import (
	"testing"

	"go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/internal/replaytest"
	"github.com/doppel-dev/doppel/workflows"
)

// TestReplayRecordedHistories replays histories recorded from real runs on the dev server against today's
// workflow code: a change that would break running workflows fails here. Record a new file (see testdata/README)
// whenever a workflow changes shape, and keep the old ones.
func TestReplayRecordedHistories(t *testing.T) {
	replaytest.Replay(t, "testdata", func(r worker.WorkflowReplayer) { workflows.Register(r) })
}
