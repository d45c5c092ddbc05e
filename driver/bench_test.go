package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/twin/rpc"
)

// reportLatencies reports p50/p99 of ds in milliseconds.
func reportLatencies(b *testing.B, ds []time.Duration, unit string) {
	b.Helper()
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-"+unit)
	b.ReportMetric(q(0.99), "p99-"+unit)
}

// benchColdStart measures Start (wake → ready) of the bench bundle, stopping each twin untimed.
func benchColdStart(b *testing.B, d Driver) {
	ctx := context.Background()
	spec := benchSpec(b, "env_bench")
	var ds []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		h, err := d.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		b.StopTimer()
		if err := d.Stop(ctx, h); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportLatencies(b, ds, "ms")
}

func BenchmarkColdStartProcess(b *testing.B) {
	d := newProcess(b, b.TempDir())
	benchColdStart(b, d)
}

func BenchmarkColdStartDocker(b *testing.B) {
	cli := dockerClient(b)
	owner := testOwner(b)
	b.Cleanup(func() { reapOwner(b, cli, owner) })
	benchColdStart(b, newDocker(b, cli, owner))
}

func BenchmarkColdStartInproc(b *testing.B) {
	d, err := NewInproc(InprocOptions{Load: loadTwin})
	if err != nil {
		b.Fatal(err)
	}
	benchColdStart(b, d)
}

// BenchmarkSessionsMemory opens 1,000 sessions on one process twin, each with one write, and reports what they add
// over the twin's base: live heap (after a GC in the twin) and resident memory.
func BenchmarkSessionsMemory(b *testing.B) {
	const sessions = 1000
	ctx := context.Background()
	d := newProcess(b, b.TempDir())
	spec := benchSpec(b, "env_mem")
	for range b.N {
		h, err := d.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		c := rpc.NewClient(h.Addr, nil)
		base, err := c.Info(ctx, true)
		if err != nil {
			b.Fatal(err)
		}
		baseRSS := rssBytes(b, h.PID)
		var opened []time.Duration
		for i := range sessions {
			start := time.Now()
			id := "ses_" + strconv.Itoa(i)
			if _, err := c.Open(ctx, rpc.OpenRequest{ID: id, Spec: rpc.SessionSpec{Seed: int64(i)}}); err != nil {
				b.Fatal(err)
			}
			opened = append(opened, time.Since(start))
			tool, args := benchWrite(i)
			if _, err := c.Call(ctx, id, rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)}); err != nil {
				b.Fatal(err)
			}
		}
		after, err := c.Info(ctx, true)
		if err != nil {
			b.Fatal(err)
		}
		if after.Sessions != sessions {
			b.Fatalf("twin holds %d sessions, want %d", after.Sessions, sessions)
		}
		b.ReportMetric(float64(int64(after.Memory.HeapAlloc)-int64(base.Memory.HeapAlloc))/(1<<20), "MB-heap/1000sessions")
		b.ReportMetric(float64(rssBytes(b, h.PID)-baseRSS)/(1<<20), "MB-rss/1000sessions")
		b.ReportMetric(float64(base.Memory.HeapAlloc)/(1<<20), "MB-heap-base")
		reportLatencies(b, opened, "open-ms")
		if err := d.Stop(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallRPC measures one tool call through the twin RPC on loopback, to a process twin.
func BenchmarkCallRPC(b *testing.B) {
	ctx := context.Background()
	d := newProcess(b, b.TempDir())
	h, err := d.Start(ctx, benchSpec(b, "env_call"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Stop(ctx, h) })
	c := rpc.NewClient(h.Addr, nil)
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s"}); err != nil {
		b.Fatal(err)
	}
	tool, args := benchRead(0)
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := c.Call(ctx, "s", rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)}); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	reportLatencies(b, ds, "ms")
}

// BenchmarkCallRPCDockerRoute measures one tool call to one Docker twin by both routes in the same run: through its
// published loopback port (docker-proxy) and at its bridge address. Skipped when the bridge address does not answer
// from this host.
func BenchmarkCallRPCDockerRoute(b *testing.B) {
	ctx := context.Background()
	cli := dockerClient(b)
	owner := testOwner(b)
	b.Cleanup(func() { reapOwner(b, cli, owner) })
	d, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, Route: RoutePublished, ReadyTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	h, err := d.Start(ctx, benchSpec(b, "env_route"))
	if err != nil {
		b.Fatal(err)
	}
	published, direct, err := d.address(ctx, h.ID)
	if err != nil {
		b.Fatal(err)
	}
	if direct == "" || !d.answersDirect(ctx, direct) {
		b.Skipf("the bridge address %q does not answer from this host", direct)
	}
	tool, args := benchRead(0)
	for _, r := range []struct{ name, addr string }{{RoutePublished, published}, {RouteContainer, direct}} {
		c := rpc.NewClient(r.addr, nil)
		id := "s-" + r.name
		if _, err := c.Open(ctx, rpc.OpenRequest{ID: id}); err != nil {
			b.Fatal(err)
		}
		b.Run(r.name, func(b *testing.B) {
			for range 50 { // warm the connection
				if _, err := c.Call(ctx, id, rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)}); err != nil {
					b.Fatal(err)
				}
			}
			ds := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := c.Call(ctx, id, rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)}); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(start))
			}
			b.StopTimer()
			reportLatencies(b, ds, "ms")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
		c.CloseIdle()
	}
}

// rssBytes reads a process's resident set size from /proc.
func rssBytes(b *testing.B, pid int) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
