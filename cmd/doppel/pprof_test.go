package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/config"
)

// TestServePprof: debug.pprof_addr off serves nothing; on, its own listener answers the profile index and a heap
// profile, and stop closes it.
func TestServePprof(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	off := &stack{cfg: &config.Config{}, log: log}
	stop, err := servePprof(off)
	if err != nil {
		t.Fatal(err)
	}
	stop()

	// Port 0 would hide the address: take a free port first.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.Addr().String()
	l.Close()
	on := &stack{cfg: &config.Config{Debug: config.Debug{PprofAddr: ln}}, log: log}
	stop, err = servePprof(on)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1"} {
		resp, err := http.Get("http://" + ln + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap") {
			t.Errorf("GET %s: %d %.200s", path, resp.StatusCode, body)
		}
	}
	stop()
	if _, err := http.Get("http://" + ln + "/debug/pprof/"); err == nil {
		t.Error("the pprof listener still answers after stop")
	}

	busy := &stack{cfg: &config.Config{Debug: config.Debug{PprofAddr: "256.0.0.1:1"}}, log: log}
	if _, err := servePprof(busy); err == nil || !strings.Contains(err.Error(), "debug.pprof_addr") {
		t.Errorf("a bad address: err %v, want one naming debug.pprof_addr", err)
	}
}
