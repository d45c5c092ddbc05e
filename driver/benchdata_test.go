package driver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// The benchmarks run the tau-retail bundle: built once from the real traces of the repository's testdata/, with
// recorded writes and reads to drive it.
var tauRetail struct {
	sync.Once
	err    error
	path   string
	hash   string
	writes []string // modify_user_address arguments, as recorded
	reads  []string // get_order_details arguments, as recorded
	// session is the calls of the first trace with at least three writes, in order.
	session []trace.Call
}

func loadTauRetail(dir string) error {
	data, err := sampledata.Read("tau-retail-dev.json")
	if err != nil {
		return err
	}
	var batch trace.Batch
	if err := json.Unmarshal(data, &batch); err != nil {
		return err
	}
	toolsJSON, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		return err
	}
	tools, err := infer.ParseToolDefs(toolsJSON)
	if err != nil {
		return err
	}
	b, _, err := infer.Build(batch.Traces, infer.Options{Tools: tools})
	if err != nil {
		return fmt.Errorf("infer tau-retail: %w", err)
	}
	raw, err := b.Marshal()
	if err != nil {
		return err
	}
	tauRetail.path = filepath.Join(dir, "tau-retail.bundle.json")
	tauRetail.hash = twin.HashBytes(raw)
	if err := os.WriteFile(tauRetail.path, raw, 0o644); err != nil {
		return err
	}
	writeTools := map[string]bool{}
	for _, t := range b.Tools {
		writeTools[t.Name] = t.Kind == twin.KindWrite
	}
	for _, tr := range batch.Traces {
		calls, writes := trace.Calls(tr), 0
		for _, c := range calls {
			if writeTools[c.Tool] {
				writes++
			}
		}
		if tauRetail.session == nil && writes >= 3 {
			tauRetail.session = calls
		}
		for _, c := range calls {
			switch c.Tool {
			case "modify_user_address":
				tauRetail.writes = append(tauRetail.writes, c.RawArgs)
			case "get_order_details":
				tauRetail.reads = append(tauRetail.reads, c.RawArgs)
			}
		}
	}
	if len(tauRetail.writes) == 0 || len(tauRetail.reads) == 0 {
		return fmt.Errorf("tau-retail traces: %d modify_user_address and %d get_order_details calls", len(tauRetail.writes), len(tauRetail.reads))
	}
	return nil
}

// benchSpec is the tau-retail bundle's spec; the bundle is built on first use.
func benchSpec(b testing.TB, env string) Spec {
	b.Helper()
	tauRetail.Do(func() {
		tauRetail.err = loadTauRetail(testDir)
	})
	if tauRetail.err != nil {
		b.Skipf("tau-retail bundle: %v", tauRetail.err)
	}
	return Spec{EnvID: env, BuildID: "bld_tau", BundlePath: tauRetail.path, BundleHash: tauRetail.hash}
}

// benchWrite is a recorded call that changes a session's world.
func benchWrite(i int) (tool, args string) {
	return "modify_user_address", tauRetail.writes[i%len(tauRetail.writes)]
}

// benchRead is a recorded read call.
func benchRead(i int) (tool, args string) {
	return "get_order_details", tauRetail.reads[i%len(tauRetail.reads)]
}
