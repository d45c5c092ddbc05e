package driver

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// rateLimits are issue 21's acceptance limits for Docker twins beside process twins at 1,000 calls/s: the Docker
// p50 at most 1.3× the process p50, the p99 at most 2×.
const (
	rateP50Limit = 1.3
	rateP99Limit = 2.0
)

// BenchmarkCallRateDockerVsProcess offers tool calls at 1,000/s over 64 sessions to a process twin and to a Docker
// twin (twin.docker_route auto, as doppel runs it) of the same bundle, in alternating half-second rounds of one run, and
// reports each driver's p50 and p99 (from each call's scheduled send, so queueing is not hidden) and the Docker to
// process ratios beside their limits. Calls of one session are serialized as the tool plane does; one call in four
// writes. The generator shares the machine's cores with both twins.
func BenchmarkCallRateDockerVsProcess(b *testing.B) {
	const (
		rate     = 1000
		sessions = 64
		rounds   = 16 // short rounds, so a burst of the machine's other load lands on both drivers alike
		round    = 500 * time.Millisecond
	)
	ctx := context.Background()
	cli := dockerClient(b)
	owner := testOwner(b)
	b.Cleanup(func() { reapOwner(b, cli, owner) })
	dock, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, Route: RouteAuto, ReadyTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	proc := newProcess(b, b.TempDir())
	type target struct {
		name string
		c    *rpc.Client
		mu   [sessions]sync.Mutex
		lat  []time.Duration
		fail int
	}
	var targets []*target
	for _, d := range []struct {
		name string
		drv  Driver
	}{{"process", proc}, {"docker", dock}} {
		h, err := d.drv.Start(ctx, benchSpec(b, "env_rate_"+d.name))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.drv.Stop(ctx, h) })
		b.Logf("%s twin at %s", d.name, h.Addr)
		t := &target{name: d.name, c: rpc.NewClient(h.Addr, nil)}
		for i := range sessions {
			if _, err := t.c.Open(ctx, rpc.OpenRequest{ID: "s" + strconv.Itoa(i), Spec: rpc.SessionSpec{Seed: int64(i)}}); err != nil {
				b.Fatal(err)
			}
		}
		targets = append(targets, t)
	}
	call := func(t *target, i int, due time.Time) (time.Duration, error) {
		tool, args := benchRead(i)
		if i%4 == 0 {
			tool, args = benchWrite(i)
		}
		s := i % sessions
		t.mu[s].Lock()
		defer t.mu[s].Unlock()
		_, err := t.c.Call(ctx, "s"+strconv.Itoa(s), rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)})
		return time.Since(due), err
	}
	for _, t := range targets { // warm each twin's connections and indexes, untimed
		latency.Offer(ctx, rate, rate/2, func(i int, due time.Time) { _, _ = call(t, i, due) })
	}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for _, t := range targets {
				var mu sync.Mutex
				rctx, cancel := context.WithTimeout(ctx, round)
				latency.Offer(rctx, rate, 0, func(i int, due time.Time) {
					d, err := call(t, r*rate*3+i, due)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.fail++
						return
					}
					t.lat = append(t.lat, d)
				})
				cancel()
			}
		}
	}
	b.StopTimer()
	p := map[string][2]time.Duration{}
	for _, t := range targets {
		if t.fail > 0 {
			b.Errorf("%s: %d calls failed", t.name, t.fail)
		}
		s := latency.Sorted(t.lat)
		p[t.name] = [2]time.Duration{latency.Percentile(s, 50), latency.Percentile(s, 99)}
		b.ReportMetric(msOf(p[t.name][0]), t.name+"-p50-ms")
		b.ReportMetric(msOf(p[t.name][1]), t.name+"-p99-ms")
	}
	r50 := float64(p["docker"][0]) / float64(p["process"][0])
	r99 := float64(p["docker"][1]) / float64(p["process"][1])
	b.ReportMetric(r50, "p50-ratio")
	b.ReportMetric(rateP50Limit, "p50-ratio-limit")
	b.ReportMetric(r99, "p99-ratio")
	b.ReportMetric(rateP99Limit, "p99-ratio-limit")
	b.ReportMetric(0, "ns/op")
	verdict := func(r, limit float64) string {
		if r <= limit {
			return "within"
		}
		return "OVER"
	}
	b.Logf("at %d calls/s, %d sessions: docker/process p50 %.2f× (limit %.1f×: %s), p99 %.2f× (limit %.1f×: %s)",
		rate, sessions, r50, rateP50Limit, verdict(r50, rateP50Limit), r99, rateP99Limit, verdict(r99, rateP99Limit))
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
