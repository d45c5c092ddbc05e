package twin_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

var updateTraceWorld = flag.Bool("update-trace-world", false, "rewrite testdata/trace_world.golden")

type sampleData struct {
	rt     *twin.Runtime
	traces []trace.Trace
	err    error
}

var (
	samplesMu sync.Mutex
	samples   = map[string]*sampleData{}
)

// sample builds a dev sample's runtime (retail, airline, bfcl: the last with its tool definitions; retail+defs and
// airline+defs with theirs) from all its traces, once per test binary, and answers it with the traces sorted by id.
func sample(t testing.TB, name string) (*twin.Runtime, []trace.Trace) {
	t.Helper()
	samplesMu.Lock()
	defer samplesMu.Unlock()
	d := samples[name]
	if d == nil {
		d = &sampleData{}
		samples[name] = d
		d.err = func() error {
			var opts infer.Options
			var err error
			defs := ""
			switch domain, withDefs := strings.CutSuffix(name, "+defs"); {
			case name == "bfcl":
				var b trace.Batch
				if b, err = sampledata.Batch("bfcl-multi-turn-dev.json"); err != nil {
					return err
				}
				d.traces, defs = b.Traces, "bfcl-multi-turn-tools.json"
			default:
				if d.traces, err = sampledata.Traces(domain); err != nil {
					return err
				}
				if withDefs {
					defs = "tau-" + domain + "-tools.json"
				}
			}
			if defs != "" {
				data, err := sampledata.Read(defs)
				if err != nil {
					return err
				}
				if opts.Tools, err = infer.ParseToolDefs(data); err != nil {
					return err
				}
			}
			sort.Slice(d.traces, func(i, j int) bool { return d.traces[i].ID < d.traces[j].ID })
			b, _, err := infer.Build(d.traces, opts)
			if err != nil {
				return err
			}
			d.rt, err = twin.NewRuntime(b, twin.RuntimeOptions{})
			return err
		}()
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	return d.rt, d.traces
}

func traceSpec(tr trace.Trace) *twin.TraceSpec {
	return &twin.TraceSpec{ID: tr.ID, Calls: twin.TraceCallsOf(tr)}
}

// TestTraceWorldGolden: a session opened from a trace has the same world hash every time, and again when it is
// opened from the calls its receipts say were used (a rebuild); the hashes of a few traces of each dev sample are
// pinned by testdata/trace_world.golden (-update-trace-world rewrites it).
func TestTraceWorldGolden(t *testing.T) {
	var lines []string
	for _, name := range []string{"retail", "airline", "bfcl"} {
		rt, traces := sample(t, name)
		for _, tr := range traces[:3] {
			open := func(spec *twin.TraceSpec) twin.Receipts {
				_, rc, err := rt.Open(twin.SessionSpec{Seed: 7, Trace: spec})
				if err != nil {
					t.Fatalf("%s %s: %v", name, tr.ID, err)
				}
				return rc
			}
			a, b := open(traceSpec(tr)), open(traceSpec(tr))
			if a.WorldHash != b.WorldHash || a.Trace == nil || *a.Trace != *b.Trace {
				t.Errorf("%s %s: opened twice: %s %+v, then %s %+v", name, tr.ID, a.WorldHash, a.Trace, b.WorldHash, b.Trace)
			}
			re := open(&twin.TraceSpec{ID: tr.ID, Calls: a.TraceCalls})
			if re.WorldHash != a.WorldHash || re.Trace.Hash != a.Trace.Hash || re.Trace.Used != a.Trace.Used {
				t.Errorf("%s %s: reopened from the calls used: %s %+v, first %s %+v", name, tr.ID, re.WorldHash, re.Trace, a.WorldHash, a.Trace)
			}
			if a.Trace.Used == 0 && a.WorldHash != rt.BaseHash() {
				t.Errorf("%s %s: no call used, yet the world %s is not the base %s", name, tr.ID, a.WorldHash, rt.BaseHash())
			}
			lines = append(lines, fmt.Sprintf("%s %s used %d of %d (first write %q) trace %s world %s",
				name, tr.ID, a.Trace.Used, a.Trace.Given, a.Trace.FirstWrite, a.Trace.Hash, a.WorldHash))
		}
	}
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "trace_world.golden")
	if *updateTraceWorld {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-trace-world to create it)", err)
	}
	if got != string(want) {
		t.Errorf("trace worlds changed:\n got:\n%s\nwant:\n%s", got, want)
	}
}

// TestTraceOpenRefusesSeeds: a trace is used instead of seed instructions or a scenario, never with them.
func TestTraceOpenRefusesSeeds(t *testing.T) {
	rt, traces := sample(t, "retail")
	_, _, err := rt.Open(twin.SessionSpec{Trace: traceSpec(traces[0]), SeedInstructions: "1 order with status pending"})
	if err == nil || !strings.Contains(err.Error(), "trace:") {
		t.Fatalf("trace with seed instructions: %v, want a bad-spec error naming trace", err)
	}
}

// TestTraceReplay: a session opened from a trace of the build reproduces that trace's own answers, call by call
// (the dev replay of each sample: at least 99 % exact).
func TestTraceReplay(t *testing.T) {
	for _, name := range []string{"retail", "airline", "bfcl"} {
		rt, traces := sample(t, name)
		calls, agree := 0, 0
		var misses []string
		for _, tr := range traces {
			s, _, err := rt.Open(twin.SessionSpec{Trace: traceSpec(tr)})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range twin.TraceCallsOf(tr) {
				calls++
				res, err := s.Call(context.Background(), c.Tool, c.Args)
				if err == nil && twin.AnswersAgree(res.Content, c.Answer) {
					agree++
				} else if len(misses) < 5 {
					misses = append(misses, fmt.Sprintf("%s %s(%s): %.200q (%v), recorded %.200q", tr.ID, c.Tool, c.Args, res.Content, err, c.Answer))
				}
			}
		}
		pct := 100 * float64(agree) / float64(calls)
		t.Logf("%s: %d of %d calls reproduced (%.2f%%)", name, agree, calls, pct)
		if pct < 99 {
			t.Errorf("%s: %.2f%% of the calls reproduced, want at least 99%%; e.g.\n%s", name, pct, strings.Join(misses, "\n"))
		}
	}
}
