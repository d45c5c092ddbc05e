package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCPUMark: readCPU reads process_cpu_seconds_total from GET /metrics, and since turns two marks into the
// server's share of the cores and its CPU per request; without the metric it says nothing.
func TestCPUMark(t *testing.T) {
	cpu := 1.5
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"+
			"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\ngo_goroutines 7\n", cpu)
	}))
	defer srv.Close()
	ctx := context.Background()
	a := readCPU(ctx, srv.Client(), srv.URL)
	if a.server != 1.5 {
		t.Fatalf("server CPU read %g, want 1.5", a.server)
	}
	cpu = 3.5
	b := readCPU(ctx, srv.Client(), srv.URL+"/")
	b.at = a.at.Add(2 * time.Second)
	got := a.since(b, 10000) // 2 s of server CPU over 10,000 requests in 2 s
	cores := runtime.NumCPU()
	for _, want := range []string{"server 2.00 s", fmt.Sprintf("= %.0f%% of %d cores", 100/float64(cores), cores),
		"200 µs/request", fmt.Sprintf("(%d/s if it had them all)", cores*5000)} {
		if !strings.Contains(got, want) {
			t.Errorf("since: %q lacks %q", got, want)
		}
	}

	none := readCPU(ctx, srv.Client(), srv.URL+"/nowhere")
	if none.server >= 0 || none.since(b, 10) != "" || a.since(none, 10) != "" || a.since(b, 0) != "" {
		t.Errorf("without the metric or requests: %+v, %q", none, none.since(b, 10))
	}
}

// TestParseProcStat: the machine's line of /proc/stat gives its total, idle (with iowait) and stolen ticks, and
// since turns two readings into shares; other text gives nothing and since leaves the machine out.
func TestParseProcStat(t *testing.T) {
	a := parseProcStat([]byte("cpu  100 0 50 800 20 0 5 25 0 0\ncpu0 50 0 25 400 10 0 2 12 0 0\n"))
	if want := (machineCPU{total: 1000, idle: 820, steal: 25, ok: true}); a != want {
		t.Fatalf("parsed %+v, want %+v", a, want)
	}
	b := parseProcStat([]byte("cpu  400 0 150 1100 20 0 5 125 0 0\n"))
	at := time.Now()
	from := cpuMark{server: 1, machine: a, at: at}
	to := cpuMark{server: 2, machine: b, at: at.Add(time.Second)}
	if got := from.since(to, 100); !strings.Contains(got, "this machine 38% idle, 12.5% stolen") {
		t.Errorf("since: %q lacks the machine's idle and stolen shares", got)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 2 3\n", "cpu a b c d e f g h\n"} {
		if m := parseProcStat([]byte(bad)); m.ok {
			t.Errorf("parseProcStat(%q) = %+v, want nothing", bad, m)
		}
	}
	from.machine = machineCPU{}
	if got := from.since(to, 100); strings.Contains(got, "this machine") {
		t.Errorf("since without /proc/stat: %q", got)
	}
}
