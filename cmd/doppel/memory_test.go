package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
)

// Bounds of TestBodyBudgetMemory, in bytes over the RSS doppel dev settles at before the burst. With the default
// body budget (256 MiB) at most eight 30 MB bodies are read at once; each costs about three times its size while
// read and parsed (huma's growing read buffer, the parsed traces, garbage the collector has not yet freed).
const (
	memPeakOverBaseline  = 1 << 30   // 1 GiB
	memAfterOverBaseline = 150 << 20 // what is left once the burst's memory is returned
	memBodies            = 50
	memBodyBytes         = 30 << 20
)

// refused reports a body the budget refused: 503 (the server's budget) or 429 (the workspace's share of it,
// api.body_budget_per_credential_bytes, issue 33).
func refused(status int) bool {
	return status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests
}

// Issue #13, defect 7: 50 concurrent 30 MB collect bodies (valid JSON whose last trace is invalid, so each is read
// and parsed whole, then refused with 422) against a real `doppel dev` process. The bytes in flight are bounded by
// the body budget: the bodies it cannot hold are refused at once with 503 or 429 + Retry-After (sent with
// Expect: 100-continue, as large uploads should be, so a refused body is never sent). RSS, read from /proc, stays
// under a bound while they run and returns near its level before the burst afterwards.
//
// DOPPEL_TEST_MEMORY_BINARY names a doppel binary to run instead of building this one (e.g. an older build, to
// measure the figures before the budget); DOPPEL_TEST_MEMORY_ENV adds space-separated NAME=value settings to its
// environment (e.g. DOPPEL_RUNTIME_RETURN_MEMORY_EVERY=0 GOMEMLIMIT=512MiB, to compare ways of returning memory).
func TestBodyBudgetMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("memory: builds and runs the real binary")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("memory: needs /proc")
	}
	bin := os.Getenv("DOPPEL_TEST_MEMORY_BINARY")
	if bin == "" {
		bin = crashBuild(t, t.TempDir())
	}
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv := &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t),
		env: strings.Fields(os.Getenv("DOPPEL_TEST_MEMORY_ENV"))}
	p := srv.start(t)
	pid := p.cmd.Process.Pid

	body := memBody(t)
	hc := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{ExpectContinueTimeout: time.Minute, MaxIdleConnsPerHost: memBodies}}
	post := func() (int, string, string, error) {
		req, err := http.NewRequest(http.MethodPost, srv.apiURL()+"/api/collect", bytes.NewReader(body))
		if err != nil {
			return 0, "", "", err
		}
		req.Header.Set("Authorization", "Bearer "+m.Plaintext)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Expect", "100-continue")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", "", err
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(data), nil
	}
	// One body first, so the baseline holds the code paths and pools a collect warms.
	if st, _, ans, err := post(); err != nil || st != http.StatusUnprocessableEntity {
		t.Fatalf("warm-up collect: %d %v %.300s, want 422", st, err, ans)
	}
	baseline := memSettle(t, pid, 0)
	t.Logf("RSS before the burst: %d MiB", baseline>>20)

	var peak memPeak
	stop := peak.watch(pid)
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	var failures []string
	for range memBodies {
		wg.Go(func() {
			st, retry, ans, err := post()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				failures = append(failures, err.Error())
			case refused(st) && (retry == "" || !strings.Contains(ans, `"requestId"`)):
				failures = append(failures, fmt.Sprintf("%d without Retry-After or envelope: %q %.300s", st, retry, ans))
			case !refused(st) && st != http.StatusUnprocessableEntity:
				failures = append(failures, fmt.Sprintf("%d %.300s", st, ans))
			}
			statuses[st]++
		})
	}
	wg.Wait()
	stop()
	after := memSettle(t, pid, baseline+memAfterOverBaseline)
	t.Logf("%d bodies of %d MiB: answers %v; RSS before %d MiB, peak %d MiB, after %d MiB",
		memBodies, memBodyBytes>>20, statuses, baseline>>20, peak.max>>20, after>>20)
	if len(failures) > 0 {
		t.Errorf("%d bodies were neither parsed (422) nor refused (503 or 429 + Retry-After), e.g. %s", len(failures), failures[0])
	}
	if statuses[http.StatusServiceUnavailable]+statuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("no body was refused for want of budget: %v", statuses)
	}
	if peak.max > baseline+memPeakOverBaseline {
		t.Errorf("peak RSS %d MiB, want at most %d MiB over the %d MiB before", peak.max>>20, memPeakOverBaseline>>20, baseline>>20)
	}
	if after > baseline+memAfterOverBaseline {
		t.Errorf("RSS after the burst %d MiB, want at most %d MiB over the %d MiB before", after>>20, memAfterOverBaseline>>20, baseline>>20)
	}
	p.term(t)
}

// memBody is a collect body of about memBodyBytes: 500 real traces with fresh ids, each led by a long system
// message, then one trace with an invalid role.
func memBody(t *testing.T) []byte {
	corpus := crashTraces(t)
	const n = 500
	base := 0
	for i := range n {
		for _, v := range corpus[i%len(corpus)] {
			base += len(v)
		}
	}
	pad := strings.Repeat("memory ", max(memBodyBytes-base, 0)/n/7)
	var traces []json.RawMessage
	for i := range n {
		tr := make(map[string]json.RawMessage, len(corpus[0]))
		for k, v := range corpus[i%len(corpus)] {
			tr[k] = v
		}
		tr["id"], _ = json.Marshal(fmt.Sprintf("mem-%d", i))
		var msgs []json.RawMessage
		if err := json.Unmarshal(tr["messages"], &msgs); err != nil {
			t.Fatal(err)
		}
		sys, _ := json.Marshal(map[string]string{"role": "system", "content": pad})
		tr["messages"], _ = json.Marshal(append([]json.RawMessage{sys}, msgs...))
		data, err := json.Marshal(tr)
		if err != nil {
			t.Fatal(err)
		}
		traces = append(traces, data)
	}
	traces = append(traces, json.RawMessage(`{"id":"mem-bad","messages":[{"role":"bogus","content":"x"}]}`))
	body, err := json.Marshal(map[string]any{"project": "memory", "traces": traces})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// memRSS is the resident set size of process pid, from /proc.
func memRSS(t *testing.T, pid int) int64 {
	v, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func readRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// memSettle waits until RSS is at most target (0: until it stops falling) for up to 30 s, and answers it.
func memSettle(t *testing.T, pid int, target int64) int64 {
	last := memRSS(t, pid)
	for range 60 {
		time.Sleep(500 * time.Millisecond)
		cur := memRSS(t, pid)
		if (target > 0 && cur <= target) || (target == 0 && cur >= last-(1<<20)) {
			return cur
		}
		last = cur
	}
	return last
}

// memPeak samples RSS until stopped and keeps the largest.
type memPeak struct {
	max int64
}

func (m *memPeak) watch(pid int) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if v, err := readRSS(pid); err == nil && v > m.max {
				m.max = v
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-finished }
}
