package twin_test

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

var (
	retailOnce   sync.Once
	retailBundle *twin.Bundle
	retailCalls  [][]trace.Call
	retailErr    error
)

// retail builds the tau-retail bundle once per test binary.
func retail(b testing.TB) (*twin.Bundle, [][]trace.Call) {
	b.Helper()
	retailOnce.Do(func() {
		traces, err := sampledata.Traces("retail")
		if err != nil {
			retailErr = err
			return
		}
		retailBundle, _, retailErr = infer.Build(traces, infer.Options{})
		for _, t := range traces {
			retailCalls = append(retailCalls, trace.Calls(t))
		}
	})
	if retailErr != nil {
		b.Fatal(retailErr)
	}
	return retailBundle, retailCalls
}

// cpuTime is this process's CPU time (user and system, all threads: the GC's background work included).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCall replays the retail traces' calls, each trace in a fresh session,
// and reports per-call latency percentiles (in-process, no transport) and the CPU
// time per call (which, unlike ns/op, other work on a shared machine hardly moves).
func BenchmarkCall(b *testing.B) {
	bundle, calls := retail(b)
	rt, err := twin.NewRuntime(bundle, twin.RuntimeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	cpu0 := cpuTime()
	var s *twin.Session
	ti, ci := 0, 0
	for i := 0; i < b.N; i++ {
		if s == nil || ci >= len(calls[ti]) {
			if s != nil {
				ti = (ti + 1) % len(calls)
			}
			ci = 0
			s, _, _ = rt.Open(twin.SessionSpec{})
			for len(calls[ti]) == 0 {
				ti = (ti + 1) % len(calls)
			}
		}
		c := calls[ti][ci]
		ci++
		start := time.Now()
		_, err := s.Call(ctx, c.Tool, json.RawMessage(c.RawArgs))
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(latency.Percentile(latency.Sorted(lat), 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(latency.Percentile(latency.Sorted(lat), 99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/call")
}

// BenchmarkCallLongSessions replays the retail traces' calls over 64 sessions kept open throughout, as
// `doppel bench` does (each session's overlay grows with its writes), and reports the CPU time per call.
func BenchmarkCallLongSessions(b *testing.B) {
	bundle, calls := retail(b)
	rt, err := twin.NewRuntime(bundle, twin.RuntimeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var flat []trace.Call
	for _, cs := range calls {
		flat = append(flat, cs...)
	}
	sessions := make([]*twin.Session, 64)
	next := make([]int, len(sessions))
	for i := range sessions {
		if sessions[i], _, err = rt.Open(twin.SessionSpec{}); err != nil {
			b.Fatal(err)
		}
		next[i] = i * len(flat) / len(sessions)
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		si := i % len(sessions)
		c := flat[next[si]%len(flat)]
		next[si]++
		if _, err := sessions[si].Call(ctx, c.Tool, json.RawMessage(c.RawArgs)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/call")
}

// BenchmarkOpen opens sessions on the retail bundle: unseeded, and seeded with
// plain instructions (new rows, a PRNG per seed, the world hash computed).
func BenchmarkOpen(b *testing.B) {
	bundle, _ := retail(b)
	rt, err := twin.NewRuntime(bundle, twin.RuntimeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, instr string }{
		{"unseeded", ""},
		{"seeded", "3 orders for user liam_thomas_7882 with status pending"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				start := time.Now()
				_, rc, err := rt.Open(twin.SessionSpec{Seed: int64(i), SeedInstructions: bc.instr})
				lat = append(lat, time.Since(start))
				if err != nil || (bc.instr != "" && !rc.Seeded) {
					b.Fatalf("open: %+v, %v", rc, err)
				}
			}
			b.ReportMetric(float64(latency.Percentile(latency.Sorted(lat), 50).Microseconds()), "p50-µs")
			b.ReportMetric(float64(latency.Percentile(latency.Sorted(lat), 99).Microseconds()), "p99-µs")
		})
	}
}

func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkSessionsMemory holds 1,000 sessions open on the retail bundle, each
// seeded with a few rows and after a write, and reports the heap they add over
// the base world (goal: 50 MB).
func BenchmarkSessionsMemory(b *testing.B) {
	bundle, _ := retail(b)
	rt, err := twin.NewRuntime(bundle, twin.RuntimeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		before := heapBytes()
		sessions := make([]*twin.Session, 1000)
		for j := range sessions {
			s, _, err := rt.Open(twin.SessionSpec{Seed: int64(j), SeedInstructions: "2 orders for user liam_thomas_7882 with status pending"})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Call(ctx, "cancel_pending_order", json.RawMessage(`{"order_id": "#W3295833", "reason": "no longer needed"}`)); err != nil {
				b.Fatal(err)
			}
			sessions[j] = s
		}
		after := heapBytes()
		b.ReportMetric(float64(after-before)/(1<<20), "MB/1000-sessions")
		runtime.KeepAlive(sessions)
	}
}

// BenchmarkHandlerGuard is the cost of the memory guards of provided code on the normal path: the retail bundle's
// synthesized handlers replayed on the retail traces' calls, run as synthesized code (unguarded) and the same
// source run as provided code (guarded: operators, slices and methods through the guards, a budget per call).
// Tools without a handler are left out of both.
func BenchmarkHandlerGuard(b *testing.B) {
	bundle, calls := retail(b)
	handled := map[string]bool{}
	for _, t := range bundle.Tools {
		if t.Source != "" {
			handled[t.Name] = true
		}
	}
	var run []trace.Call
	for _, cs := range calls {
		for _, c := range cs {
			if handled[c.Tool] {
				run = append(run, c)
			}
		}
	}
	provided := *bundle
	provided.Tools = append([]twin.Tool(nil), bundle.Tools...)
	for i := range provided.Tools {
		if t := &provided.Tools[i]; t.Source != "" {
			t.Provided, t.Binding, t.Rung = t.Source, twin.BindingProvided, twin.RungProvided
		}
	}
	for _, c := range []struct {
		name   string
		bundle *twin.Bundle
	}{{"synthesized", bundle}, {"provided", &provided}} {
		b.Run(c.name, func(b *testing.B) {
			rt, err := twin.NewRuntime(c.bundle, twin.RuntimeOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			s, _, _ := rt.Open(twin.SessionSpec{})
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				if i%len(run) == 0 {
					s, _, _ = rt.Open(twin.SessionSpec{})
				}
				call := run[i%len(run)]
				if _, err := s.Call(ctx, call.Tool, json.RawMessage(call.RawArgs)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/call")
		})
	}
}
