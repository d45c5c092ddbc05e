package sampledata

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/trace"
)

// TestFiles reads every file of testdata/: the trace files decode as collect bodies with the traces and calls
// testdata/README.md states, and the tool-definition files parse as a build's tools part.
func TestFiles(t *testing.T) {
	traces := []struct {
		name, project string
		traces, calls int
	}{
		{"tau-retail-dev.json", "tau2-retail", 126, 960},
		{"tau-airline-dev.json", "tau-airline", 148, 941},
		{"bfcl-multi-turn-dev.json", "bfcl-multi-turn", 268, 1573},
	}
	for _, tc := range traces {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Batch(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if b.Project != tc.project || len(b.Traces) != tc.traces || countCalls(b.Traces) != tc.calls {
				t.Errorf("project %q, %d traces, %d calls; want %q, %d, %d", b.Project, len(b.Traces), countCalls(b.Traces), tc.project, tc.traces, tc.calls)
			}
		})
	}
	tools := []struct {
		name string
		n    int
	}{
		{"tau-retail-tools.json", 16},
		{"tau-airline-tools.json", 14},
		{"bfcl-multi-turn-tools.json", 128},
	}
	for _, tc := range tools {
		t.Run(tc.name, func(t *testing.T) {
			defs, err := infer.ParseToolDefs(MustRead(t, tc.name))
			if err != nil {
				t.Fatal(err)
			}
			if len(defs) != tc.n {
				t.Errorf("%d tool definitions, want %d", len(defs), tc.n)
			}
		})
	}
	if _, err := Read("no-such-file.json"); !os.IsNotExist(err) {
		t.Errorf("Read of a missing file: %v, want a not-exist error", err)
	}
}

// TestExamples keeps the quick start's files (examples/) equal to the samples they are taken from: the tool
// definitions byte for byte, and each sample trace equal to the dev trace of its id.
func TestExamples(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	tools, err := os.ReadFile(filepath.Join(root, "examples", "tau-retail-tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tools, MustRead(t, "tau-retail-tools.json")) {
		t.Error("examples/tau-retail-tools.json differs from testdata/tau-retail-tools.json.gz")
	}
	data, err := os.ReadFile(filepath.Join(root, "examples", "tau-retail-sample.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sample trace.Batch
	if err := json.Unmarshal(data, &sample); err != nil {
		t.Fatalf("examples/tau-retail-sample.json: %v", err)
	}
	dev, err := Batch("tau-retail-dev.json")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]trace.Trace{}
	for _, tr := range dev.Traces {
		byID[tr.ID] = tr
	}
	if sample.Project != dev.Project || len(sample.Traces) != 20 || countCalls(sample.Traces) != 159 {
		t.Errorf("sample: project %q, %d traces, %d calls; want %q, 20, 159 (examples/README.md)", sample.Project, len(sample.Traces), countCalls(sample.Traces), dev.Project)
	}
	for _, tr := range sample.Traces {
		if want, ok := byID[tr.ID]; !ok || !reflect.DeepEqual(tr, want) {
			t.Errorf("sample trace %s is not the dev trace of that id", tr.ID)
		}
	}
}

func countCalls(traces []trace.Trace) int {
	n := 0
	for _, tr := range traces {
		for _, m := range tr.Messages {
			n += len(m.ToolCalls)
		}
	}
	return n
}
