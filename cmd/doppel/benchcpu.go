package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMark is the CPU time spent so far by the server (its process_cpu_seconds_total from GET /metrics; negative
// when the server does not serve it), by this process, the load generator, which shares the machine with it, and
// by this machine as a whole.
type cpuMark struct {
	server  float64
	gen     time.Duration
	machine machineCPU
	at      time.Time
}

// machineCPU is this machine's CPU time in clock ticks from the first line of Linux's /proc/stat: all of it, the
// idle part (iowait included) and the part its hypervisor gave other machines (steal). ok is false elsewhere.
type machineCPU struct {
	total, idle, steal uint64
	ok                 bool
}

// parseProcStat reads the machine's line ("cpu user nice system idle iowait irq softirq steal …") of /proc/stat.
// Guest time is counted in user already, so the first eight fields are the whole.
func parseProcStat(data []byte) machineCPU {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return machineCPU{}
		}
		v[i] = n
	}
	m := machineCPU{idle: v[3] + v[4], steal: v[7], ok: true}
	for _, n := range v {
		m.total += n
	}
	return m
}

// readCPU marks the CPU time of the server at base, of this process and of this machine now.
func readCPU(ctx context.Context, hc *http.Client, base string) cpuMark {
	m := cpuMark{server: -1, at: time.Now()}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		m.machine = parseProcStat(data)
	}
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
// core to itself. With /proc/stat it adds this machine's idle and stolen shares: a peak reached with idle CPU left
// was bound by waits (the journal's commits), and stolen CPU is what a shared VM's neighbours took. Empty when the
// server's CPU time is unknown.
func (m cpuMark) since(end cpuMark, n int) string {
	if m.server < 0 || end.server < 0 || n == 0 {
		return ""
	}
	wall := end.at.Sub(m.at).Seconds()
	srv := end.server - m.server
	gen := (end.gen - m.gen).Seconds()
	cores := float64(runtime.NumCPU())
	perCall := srv / float64(n)
	machine := ""
	if m.machine.ok && end.machine.ok && end.machine.total > m.machine.total {
		all := float64(end.machine.total - m.machine.total)
		machine = fmt.Sprintf("; this machine %.0f%% idle, %.1f%% stolen", 100*float64(end.machine.idle-m.machine.idle)/all,
			100*float64(end.machine.steal-m.machine.steal)/all)
	}
	return fmt.Sprintf("  [cpu: server %.2f s = %.0f%% of %d cores, %.0f µs/request with its background work (%.0f/s if it had them all); generator %.2f s = %.0f%%%s]",
		srv, 100*srv/wall/cores, int(cores), perCall*1e6, cores/perCall, gen, 100*gen/wall/cores, machine)
}
