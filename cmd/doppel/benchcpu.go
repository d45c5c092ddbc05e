package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMark is the CPU time spent so far by the server (its process_cpu_seconds_total from GET /metrics; negative
// when the server does not serve it) and by this process, the load generator, which shares the machine with it.
type cpuMark struct {
	server float64
	gen    time.Duration
	at     time.Time
}

// readCPU marks the CPU time of the server at base and of this process now.
func readCPU(ctx context.Context, hc *http.Client, base string) cpuMark {
	m := cpuMark{server: -1, at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		m.gen = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return m
	}
	resp, err := hc.Do(req)
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				m.server = f
			}
			break
		}
	}
	return m
}

// since describes the CPU the server and the generator spent between m and end over n answered requests: the
// server's share of the machine's cores, and its CPU per request, which bounds what it could answer with every
// core to itself. Empty when the server's CPU time is unknown.
func (m cpuMark) since(end cpuMark, n int) string {
	if m.server < 0 || end.server < 0 || n == 0 {
		return ""
	}
	wall := end.at.Sub(m.at).Seconds()
	srv := end.server - m.server
	gen := (end.gen - m.gen).Seconds()
	cores := float64(runtime.NumCPU())
	perCall := srv / float64(n)
	return fmt.Sprintf("  [cpu: server %.2f s = %.0f%% of %d cores, %.0f µs/request with its background work (%.0f/s if it had them all); generator %.2f s = %.0f%%]",
		srv, 100*srv/wall/cores, int(cores), perCall*1e6, cores/perCall, gen, 100*gen/wall/cores)
}
