package infer

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
)

// The build config's terminal_tools reach the bundle (episodes end on them); an empty name is refused naming it.
func TestConfigTerminalTools(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:3]
	b, _, err := Build(traces, Options{Config: Config{TerminalTools: []string{"transfer_to_human_agents"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b.TerminalTools, []string{"transfer_to_human_agents"}) {
		t.Fatalf("bundle terminal tools %v", b.TerminalTools)
	}
	_, _, err = Build(traces, Options{Config: Config{TerminalTools: []string{"think", " "}}})
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "config.terminal_tools[1]") {
		t.Fatalf("an empty terminal tool: %v", err)
	}
}
