// Package replaytest records workflow histories from real runs and replays them against today's workflow code, for
// the replay tests of the packages that hold workflows.
package replaytest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"
)

// Record writes a workflow run's history (runID "" is the latest run) to file as JSON, as the Temporal CLI's
// `workflow show --output json` does.
func Record(t testing.TB, c client.Client, workflowID, runID, file string) {
	t.Helper()
	hist := &historypb.History{}
	it := c.GetWorkflowHistory(context.Background(), workflowID, runID, false, 0)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		hist.Events = append(hist.Events, e)
	}
	data, err := protojson.MarshalOptions{Indent: " "}.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Replay replays every history under dir (*.json) against the workflows register registers: a change that would
// break running workflows fails here. It fails when dir holds no history.
func Replay(t *testing.T, dir string, register func(worker.WorkflowReplayer)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no recorded histories under %s", dir)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			register(r)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatalf("replay %s: %v", f, err)
			}
		})
	}
}
