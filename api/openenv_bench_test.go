package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/trace"
)

// loadEnv names the environment variable that makes TestOpenEnvLoadClient the load generator of
// BenchmarkOpenEnvCapacity: url, key, concurrency, steps, separated by spaces.
const loadEnv = "DOPPEL_OPENENV_LOAD"

// loadResult is what the load generator reports.
type loadResult struct {
	Episodes, OK    int
	Reset, Step     []time.Duration
	Elapsed         time.Duration
	FirstError      string
	ActionsPerEpoch int
}

// BenchmarkOpenEnvCapacity is OpenEnv's capacity method on doppel's OpenEnv WebSocket: C concurrent episodes
// (64, 256, 1,024), each one connection that resets (a seeded doppel session) and then steps through real
// recorded tau-retail calls, closing at the end. The load generator is a separate process (this test binary as
// TestOpenEnvLoadClient) so its CPU is measured apart: its share of the machine's CPU for the run is printed.
// Reports success rate, p50/p99 reset and step latency, episodes/s, the server's CPU per step, and the server's RSS
// growth per concurrent session at the peak. DOPPEL_OPENENV_LEVELS overrides the levels (e.g. "64,256").
func BenchmarkOpenEnvCapacity(b *testing.B) {
	levels := []int{64, 256, 1024}
	if v := os.Getenv("DOPPEL_OPENENV_LEVELS"); v != "" {
		levels = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			levels = append(levels, n)
		}
	}
	serverGC(b)
	bundle, traces := retailBundle(b)
	p := newPlane(b, schema.DriverSQLite, bundle, planeOptions{local: true})
	srv := openEnvServer(b, p, p.tp, 1<<20)
	actions := stepActions(traces, 8)
	af, err := os.CreateTemp(b.TempDir(), "actions")
	if err != nil {
		b.Fatal(err)
	}
	if err := json.NewEncoder(af).Encode(actions); err != nil {
		b.Fatal(err)
	}
	af.Close()
	for _, c := range levels {
		b.Run(fmt.Sprintf("episodes=%d", c), func(b *testing.B) {
			rssBefore := rssBytes()
			var peak atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if r := rssBytes(); r > peak.Load() {
						peak.Store(r)
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			cpu0 := cpuTime()
			cmd := exec.Command(os.Args[0], "-test.run=^TestOpenEnvLoadClient$", "-test.v")
			cmd.Env = append(os.Environ(), loadEnv+"="+strings.Join([]string{"ws" + strings.TrimPrefix(srv.URL, "http") + "/openenv/envs/" + p.env.Slug + "/ws", p.key,
				strconv.Itoa(c), af.Name()}, " "))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, os.Stderr
			b.ResetTimer()
			began := time.Now()
			if err := cmd.Run(); err != nil {
				b.Fatalf("load generator: %v\n%s", err, out.String())
			}
			wall := time.Since(began)
			b.StopTimer()
			close(stop)
			wg.Wait()
			serverCPU := cpuTime() - cpu0
			ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			var genCPU time.Duration
			if ru != nil {
				genCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			var res loadResult
			sc := bufio.NewScanner(&out)
			sc.Buffer(make([]byte, 1<<20), 1<<28)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "LOADRESULT "); ok {
					if err := json.Unmarshal([]byte(line), &res); err != nil {
						b.Fatal(err)
					}
				}
			}
			if res.Episodes == 0 {
				b.Fatalf("the load generator reported nothing:\n%s", out.String())
			}
			sortDurations(res.Reset)
			sortDurations(res.Step)
			steps := max(len(res.Step), 1)
			b.ReportMetric(100*float64(res.OK)/float64(res.Episodes), "success-%")
			b.ReportMetric(ms(latency.Percentile(res.Reset, 50)), "reset-p50-ms")
			b.ReportMetric(ms(latency.Percentile(res.Reset, 99)), "reset-p99-ms")
			b.ReportMetric(ms(latency.Percentile(res.Step, 50)), "step-p50-ms")
			b.ReportMetric(ms(latency.Percentile(res.Step, 99)), "step-p99-ms")
			b.ReportMetric(float64(res.Episodes)/res.Elapsed.Seconds(), "episodes/s")
			b.ReportMetric(float64(serverCPU.Microseconds())/float64(steps), "server-cpu-µs/step")
			b.ReportMetric(float64(peak.Load()-rssBefore)/float64(c)/1024, "rss-KB/session")
			b.ReportMetric(100*genCPU.Seconds()/(genCPU.Seconds()+serverCPU.Seconds()), "generator-cpu-%")
			b.ReportMetric(0, "ns/op")
			if res.FirstError != "" {
				b.Logf("first error: %s", res.FirstError)
			}
			b.Logf("wall %s, server CPU %s, generator CPU %s", wall, serverCPU, genCPU)
		})
	}
}

// stepActions are the recorded calls of tau-retail conversations as OpenEnv call_tool actions, per episode.
func stepActions(traces []trace.Trace, perEpisode int) [][]map[string]any {
	var out [][]map[string]any
	for _, tr := range traces {
		var acts []map[string]any
		for _, c := range trace.Calls(tr) {
			if c.Args == nil || c.Tool == "transfer_to_human_agents" || len(acts) == perEpisode {
				continue
			}
			acts = append(acts, map[string]any{"type": "call_tool", "tool_name": c.Tool, "arguments": c.Args})
		}
		if len(acts) > 0 {
			out = append(out, acts)
		}
	}
	return out
}

func sortDurations(d []time.Duration) { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }) }

// rssBytes is this process's resident set size (0 where /proc is not).
func rssBytes() int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// TestOpenEnvLoadClient is BenchmarkOpenEnvCapacity's load generator (skipped unless it is run as one): it runs the
// episodes concurrently, all of them connected at once, and prints their latencies.
func TestOpenEnvLoadClient(t *testing.T) {
	spec := os.Getenv(loadEnv)
	if spec == "" {
		t.Skip("the load generator of BenchmarkOpenEnvCapacity")
	}
	f := strings.Fields(spec)
	url, key, actionsFile := f[0], f[1], f[3]
	c, _ := strconv.Atoi(f[2])
	var actions [][]map[string]any
	raw, err := os.ReadFile(actionsFile)
	if err != nil || json.Unmarshal(raw, &actions) != nil {
		t.Fatalf("actions: %v", err)
	}
	dialer := &websocket.Dialer{HandshakeTimeout: 60 * time.Second}
	var mu sync.Mutex
	res := loadResult{Episodes: c}
	var ready, start sync.WaitGroup
	ready.Add(c)
	start.Add(1)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) {
				mu.Lock()
				if res.FirstError == "" {
					res.FirstError = err.Error()
				}
				mu.Unlock()
			}
			conn, _, err := dialer.Dial(url, http.Header{"Authorization": {"Bearer " + key}})
			ready.Done()
			if err != nil {
				fail(err)
				return
			}
			defer conn.Close()
			start.Wait() // every episode connected: C concurrent sessions
			var resets, steps []time.Duration
			ask := func(msg any) (time.Duration, error) {
				t0 := time.Now()
				if err := conn.WriteJSON(msg); err != nil {
					return 0, err
				}
				var out map[string]any
				if err := conn.ReadJSON(&out); err != nil {
					return 0, err
				}
				if out["type"] == "error" {
					return 0, fmt.Errorf("%v", out["data"])
				}
				return time.Since(t0), nil
			}
			d, err := ask(map[string]any{"type": "reset", "data": map[string]any{"seed": i}})
			if err != nil {
				fail(err)
				return
			}
			resets = append(resets, d)
			for _, a := range actions[i%len(actions)] {
				d, err := ask(map[string]any{"type": "step", "data": a})
				if err != nil {
					fail(err)
					return
				}
				steps = append(steps, d)
			}
			_ = conn.WriteJSON(map[string]any{"type": "close"})
			mu.Lock()
			res.OK++
			res.Reset = append(res.Reset, resets...)
			res.Step = append(res.Step, steps...)
			mu.Unlock()
		}()
	}
	ready.Wait()
	start.Done()
	wg.Wait()
	res.Elapsed = time.Since(began)
	out, _ := json.Marshal(res)
	fmt.Printf("LOADRESULT %s\n", out)
}
