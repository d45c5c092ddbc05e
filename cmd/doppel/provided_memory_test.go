package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// bombHandler is provided code whose every call builds a 256 MiB string (issue 33, defect 6).
const bombHandler = `def handle(args):
    s = "a" * (256 << 20)
    return len(s)
`

// Issue 33, defect 6, through the real build path: provided code uploaded with the multipart build, built by the
// real build workflow, served by a real `doppel dev` (its twins in process) and called over REST. Each call of the
// handler that builds "a" * (256 << 20) answers the tool's own error naming the memory budget, the process does not
// grow by the string, and it keeps serving: the next call of another tool answers.
//
// DOPPEL_TEST_MEMORY_BINARY names a doppel binary to run instead of building this one (an older build, to measure
// what the calls did before the budget: the test then fails, and logs the figures).
func TestProvidedCodeMemoryBudget(t *testing.T) {
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
	srv := &crashServer{bin: bin, dir: t.TempDir(), key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t)}
	p := srv.start(t)
	pid := p.cmd.Process.Pid
	hc := &http.Client{Timeout: 5 * time.Minute}
	do := func(method, path, ctype string, body io.Reader, want int, out any) {
		t.Helper()
		req, err := http.NewRequest(method, srv.apiURL()+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+m.Plaintext)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", method, path, err, p.logTail())
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %.500s, want %d", method, path, resp.StatusCode, data, want)
		}
		if out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				t.Fatalf("%s %s: %v: %.300s", method, path, err, data)
			}
		}
	}

	// Traces, then the build with the provided code for get_order_details.
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:20]
	body, _ := json.Marshal(map[string]any{"project": "memory-bomb", "traces": traces})
	do(http.MethodPost, "/api/collect", "application/json", bytes.NewReader(body), http.StatusAccepted, nil)
	var envs []api.EnvSummary
	do(http.MethodGet, "/v1/envs", "", nil, http.StatusOK, &envs)
	if len(envs) != 1 {
		t.Fatalf("envs %+v", envs)
	}
	slug := envs[0].Slug
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="code"; filename="get_order_details.star"`)
	h.Set("Content-Type", "text/plain")
	pw, _ := mw.CreatePart(h)
	_, _ = pw.Write([]byte(bombHandler))
	_ = mw.Close()
	var started api.BuildStarted
	do(http.MethodPost, "/v1/envs/"+slug+"/builds", mw.FormDataContentType(), &buf, http.StatusAccepted, &started)
	e2ePoll(t, e2eBuildTimeout, time.Second, "build "+started.BuildID, func() (bool, string) {
		var det api.BuildDetail
		do(http.MethodGet, started.Poll, "", nil, http.StatusOK, &det)
		if det.Status == "failed" {
			t.Fatalf("build failed at %s: %s", det.Stage, det.Error)
		}
		return det.Status == "succeeded", det.Status + "/" + det.Stage
	})

	// A session; the calls of the bomb, watched.
	var open api.OpenSessionBodyOut
	do(http.MethodPost, "/v1/envs/"+slug+"/sessions", "application/json", strings.NewReader(`{}`), http.StatusCreated, &open)
	orderArgs, otherTool, otherArgs := "", "", ""
	for _, tr := range traces {
		for _, c := range trace.Calls(tr) {
			switch {
			case c.Tool == "get_order_details" && orderArgs == "":
				orderArgs = c.RawArgs
			case c.Tool == "find_user_id_by_email" && otherArgs == "":
				otherTool, otherArgs = c.Tool, c.RawArgs
			}
		}
	}
	if orderArgs == "" || otherArgs == "" {
		t.Fatal("the traces hold no get_order_details or find_user_id_by_email call")
	}
	call := func(tool, args string) api.CallResult {
		t.Helper()
		var res api.CallResult
		do(http.MethodPost, "/v1/sessions/"+open.SessionID+"/call", "application/json",
			strings.NewReader(fmt.Sprintf(`{"name":%q,"arguments":%s}`, tool, args)), http.StatusOK, &res)
		return res
	}
	call(otherTool, otherArgs) // the twin is warm before the baseline
	base := memSettle(t, pid, 0)
	var peak memPeak
	stop := peak.watch(pid)
	alloc0 := allocatedBytes(t, srv.apiURL())
	const calls = 5
	var answers []api.CallResult
	for range calls {
		answers = append(answers, call("get_order_details", orderArgs))
	}
	allocated := allocatedBytes(t, srv.apiURL()) - alloc0
	stop()
	after := call(otherTool, otherArgs)
	t.Logf("%d calls of the 256 MiB handler: %.1f MiB allocated per call; RSS %d MiB before, peak %d MiB (+%d MiB); first answer %+v",
		calls, float64(allocated)/calls/(1<<20), base>>20, peak.max>>20, (peak.max-base)>>20, answers[0])
	for i, a := range answers {
		if !a.Error || a.Fidelity != "A_executed" || !strings.Contains(a.Content, "memory budget") {
			t.Errorf("call %d: %+v, want the tool's own error naming the memory budget", i, a)
		}
	}
	if after.Error || after.Content == "" {
		t.Errorf("the next call of another tool: %+v", after)
	}
	// The string is 256 MiB; refused before it is made, the calls allocate a fraction of it.
	if allocated > 64<<20 {
		t.Errorf("the %d calls allocated %d MiB, want the string never made", calls, allocated>>20)
	}
	if grown := peak.max - base; grown > 128<<20 {
		t.Errorf("RSS grew by %d MiB over the calls, want the string never made", grown>>20)
	}
	p.term(t)
}

// allocatedBytes is the process's heap allocation so far, from its /metrics (go_memstats_alloc_bytes_total).
func allocatedBytes(t *testing.T, apiURL string) int64 {
	t.Helper()
	resp, err := http.Get(apiURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "go_memstats_alloc_bytes_total "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("go_memstats_alloc_bytes_total %q: %v", v, err)
			}
			return int64(f)
		}
	}
	t.Fatalf("no go_memstats_alloc_bytes_total in /metrics (%d bytes)", len(data))
	return 0
}
