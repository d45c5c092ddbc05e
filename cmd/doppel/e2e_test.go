package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	tlog "go.temporal.io/sdk/log"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cli"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// Real traces and tool definitions shared by the e2e and crash tests: files of the repository's testdata/, read
// with internal/sampledata.
const (
	e2eRetailTraces = "tau-retail-dev.json"
	e2eRetailTools  = "tau-retail-tools.json"
)

// Bounds of the e2e waits: generous, because two busy cores run everything here.
const (
	e2eStartTimeout = 3 * time.Minute
	e2eStopTimeout  = 2 * time.Minute
	e2eBuildTimeout = 10 * time.Minute
)

// e2eStack is one `doppel dev` started in process through run.
type e2eStack struct {
	dir, key           string
	apiAddr, tempAddr  string
	uiAddr             string
	apiURL             string
	cancel             context.CancelFunc
	done               chan error
	stdout             *e2eBuffer
	http               *http.Client
	stopped            bool
	stopOnce           sync.Once
	lastReadyzResponse string
}

// e2eBuffer is a goroutine-safe writer the running command prints to.
type e2eBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *e2eBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *e2eBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// e2eFreeAddr claims a free loopback port and releases it for the stack to bind.
func e2eFreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// startE2EStack runs `doppel dev` on dir in a goroutine and waits until /readyz answers 200.
// startE2EStack runs `doppel dev` in process on dir; extra flags are appended to the command line.
func startE2EStack(t *testing.T, dir, key, apiAddr, tempAddr, uiAddr string, extra ...string) *e2eStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &e2eStack{dir: dir, key: key, apiAddr: apiAddr, tempAddr: tempAddr, uiAddr: uiAddr, apiURL: "http://" + apiAddr,
		cancel: cancel, done: make(chan error, 1), stdout: &e2eBuffer{}, http: &http.Client{Timeout: 2 * time.Minute}}
	args := []string{"dev", "--data-dir", dir, "--api-addr", apiAddr, "--temporal-dev-addr", tempAddr,
		"--temporal-ui-addr", uiAddr, "--collect-rebuild-debounce", "1s", "--log-level", "warn"}
	args = append(args, extra...)
	environ := []string{"DOPPEL_BOOTSTRAP_KEY=" + key}
	started := time.Now()
	go func() { s.done <- run(ctx, args, environ, s.stdout, io.Discard) }()
	t.Cleanup(func() { s.stop(t) })

	deadline := time.Now().Add(e2eStartTimeout)
	for {
		select {
		case err := <-s.done:
			s.stopped = true
			t.Fatalf("doppel dev exited before it was ready: %v\nstdout:\n%s", err, s.stdout.String())
		default:
		}
		if st, body := s.try(http.MethodGet, "/readyz", "", nil, ""); st == http.StatusOK {
			t.Logf("doppel dev on %s ready after %s (readyz %s)", dir, time.Since(started).Round(time.Millisecond), strings.TrimSpace(string(body)))
			return s
		} else if st != 0 {
			s.lastReadyzResponse = fmt.Sprintf("%d %s", st, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("doppel dev not ready within %s (last /readyz: %s)\nstdout:\n%s", e2eStartTimeout, s.lastReadyzResponse, s.stdout.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop cancels the command's context and requires a clean shutdown: run returns nil.
func (s *e2eStack) stop(t *testing.T) {
	t.Helper()
	s.stopOnce.Do(func() {
		s.cancel()
		if s.stopped {
			return
		}
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("doppel dev shutdown: run returned %v, want nil", err)
			}
		case <-time.After(e2eStopTimeout):
			t.Errorf("doppel dev did not stop within %s of its context ending", e2eStopTimeout)
		}
		stopProcessTwins(t, s.dir)
	})
}

// stopProcessTwins stops the twin processes a dev stack on dir started. They outlive the stack on purpose (a
// restarted worker finds them again), but not the test.
func stopProcessTwins(t *testing.T, dir string) {
	t.Helper()
	d, err := driver.NewProcess(driver.ProcessOptions{Binary: os.Args[0], StateDir: filepath.Join(dir, "twins")})
	if err != nil {
		t.Errorf("stop twins: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	handles, err := d.List(ctx)
	if err != nil {
		t.Errorf("stop twins: %v", err)
		return
	}
	for _, h := range handles {
		if err := d.Stop(ctx, h); err != nil {
			t.Errorf("stop twin %s: %v", h.ID, err)
		}
	}
}

// try sends one request; status 0 means the request itself failed.
func (s *e2eStack) try(method, path, key string, body io.Reader, contentType string) (int, []byte) {
	req, err := http.NewRequest(method, s.apiURL+path, body)
	if err != nil {
		return 0, []byte(err.Error())
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, []byte(err.Error())
	}
	return resp.StatusCode, data
}

// call sends a request with the stack's key and requires the wanted status; it decodes a JSON answer into out.
func (s *e2eStack) call(t *testing.T, method, path string, body io.Reader, contentType string, want int, out any) []byte {
	t.Helper()
	st, data := s.try(method, path, s.key, body, contentType)
	if st != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, st, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %T: %v: %s", method, path, out, err, data)
		}
	}
	return data
}

// e2ePoll calls f every interval until it reports done, failing with what f last said after timeout.
func e2ePoll(t *testing.T, timeout, interval time.Duration, what string, f func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var state string
	for {
		var done bool
		done, state = f()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not done within %s; last state: %s", what, timeout, state)
		}
		time.Sleep(interval)
	}
}

func e2eTemporalClient(t *testing.T, addr string) client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{HostPort: addr, Namespace: "default",
		Logger: tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatalf("dial temporal %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func e2eWorkflowStatus(t *testing.T, c client.Client, id string) enumspb.WorkflowExecutionStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		t.Fatalf("describe workflow %s: %v", id, err)
	}
	return d.GetWorkflowExecutionInfo().GetStatus()
}

// e2eWorkflowEnv is a workflow's DoppelEnv search attribute ("" when unset).
func e2eWorkflowEnv(t *testing.T, c client.Client, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		t.Fatalf("describe workflow %s: %v", id, err)
	}
	var env string
	if p := d.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields()[workflows.EnvAttr.GetName()]; p != nil {
		if err := converter.GetDefaultDataConverter().FromPayload(p, &env); err != nil {
			t.Fatalf("DoppelEnv of %s: %v", id, err)
		}
	}
	return env
}

// e2eScenarios is the config part of the multipart build: a scenario sessions open by name.
const e2eScenarios = `{"scenarios": {"pending": "1 order with status pending"}}`

// e2eBuildForm is a multipart body with the tool definitions as the "tools" part and e2eScenarios as "config".
func e2eBuildForm(t *testing.T, toolsName string) (*bytes.Buffer, string) {
	t.Helper()
	data, err := sampledata.Read(toolsName)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="tools"; filename="tools.json"`)
	h.Set("Content-Type", "application/json")
	pw, err := mw.CreatePart(h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := mw.WriteField("config", e2eScenarios); err != nil {
		t.Fatal(err)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

// e2eOneMoreTrace is a collect body of one retail trace under a new id.
func e2eOneMoreTrace(t *testing.T) []byte {
	t.Helper()
	data, err := sampledata.Read(e2eRetailTraces)
	if err != nil {
		t.Fatal(err)
	}
	var b trace.Batch
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	one := b.Traces[0]
	one.ID += "-again"
	return ingest.AppendBody(nil, b.Project, [][]byte{ingest.AppendTrace(nil, &one)})
}

// e2eBuildsState lists an environment's builds for a failure message.
func (s *e2eStack) e2eBuildsState(slug string) string {
	st, body := s.try(http.MethodGet, "/v1/envs/"+slug+"/builds", s.key, nil, "")
	return fmt.Sprintf("builds: %d %s", st, body)
}

// TestE2EDevStack runs the whole dev stack in process: health and readiness, the Temporal UI, key auth and the
// OpenAPI document; then real tau-bench retail traces are collected,
// the debounced rebuild and a multipart build run as workflows on the in-process Temporal, and everything —
// environment, builds, completed workflows, keys — survives a clean restart on the same data dir.
func TestE2EDevStack(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	dir := t.TempDir()
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	key := m.Plaintext
	apiAddr, tempAddr, uiAddr := e2eFreeAddr(t), e2eFreeAddr(t), e2eFreeAddr(t)
	s := startE2EStack(t, dir, key, apiAddr, tempAddr, uiAddr)

	out := s.stdout.String()
	for _, want := range []string{"doppel dev is ready", s.apiURL, "http://" + uiAddr, key, dir} {
		if !strings.Contains(out, want) {
			t.Errorf("startup banner lacks %q:\n%s", want, out)
		}
	}

	t.Run("health", func(t *testing.T) {
		var h struct{ Status string }
		s.call(t, http.MethodGet, "/healthz", nil, "", http.StatusOK, &h)
		if h.Status != "ok" {
			t.Errorf("/healthz status %q", h.Status)
		}
		var r struct {
			Status string
			Checks map[string]string
		}
		s.call(t, http.MethodGet, "/readyz", nil, "", http.StatusOK, &r)
		for _, c := range []string{"db", "blob", "temporal"} {
			if r.Checks[c] != "ok" {
				t.Errorf("/readyz check %s = %q, want ok (%+v)", c, r.Checks[c], r)
			}
		}
	})

	t.Run("temporal-ui", func(t *testing.T) {
		resp, err := s.http.Get("http://" + uiAddr + "/")
		if err != nil {
			t.Fatalf("Temporal UI: %v", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(bytes.ToLower(body), []byte("<html")) {
			t.Fatalf("Temporal UI at %s: %d, %d bytes (want 200 and an HTML page)", uiAddr, resp.StatusCode, len(body))
		}
	})

	t.Run("key-auth", func(t *testing.T) {
		other, err := cred.Mint(cred.KindWorkspace)
		if err != nil {
			t.Fatal(err)
		}
		for name, k := range map[string]string{"missing": "", "unknown key": other.Plaintext, "garbage": "not-a-key"} {
			st, body := s.try(http.MethodGet, "/v1/envs", k, nil, "")
			var env api.Envelope
			if st != http.StatusUnauthorized || json.Unmarshal(body, &env) != nil || env.Code != api.CodeUnauthorized || env.RequestID == "" {
				t.Errorf("%s key: %d %s, want 401 with the unauthorized envelope and a request id", name, st, body)
			}
		}
		var envs []api.EnvSummary
		s.call(t, http.MethodGet, "/v1/envs", nil, "", http.StatusOK, &envs)
		if len(envs) != 0 {
			t.Errorf("fresh data dir lists %d environments", len(envs))
		}
	})

	t.Run("openapi", func(t *testing.T) {
		var doc struct {
			OpenAPI string                     `json:"openapi"`
			Paths   map[string]json.RawMessage `json:"paths"`
		}
		s.call(t, http.MethodGet, "/openapi.json", nil, "", http.StatusOK, &doc)
		if !strings.HasPrefix(doc.OpenAPI, "3.1") {
			t.Errorf("openapi version %q, want 3.1.x", doc.OpenAPI)
		}
		for _, p := range []string{"/healthz", "/readyz", "/v1/envs", "/v1/envs/{slug}", "/v1/keys", "/api/collect",
			"/v1/envs/{slug}/builds", "/v1/envs/{slug}/builds/{build_id}", "/v1/envs/{slug}/builds/{build_id}/report",
			"/v1/envs/{slug}/tools/{name}/source"} {
			if _, ok := doc.Paths[p]; !ok {
				t.Errorf("/openapi.json lacks path %s", p)
			}
		}
	})

	// A key minted over the API must survive the restart too.
	var minted api.CreatedKey
	s.call(t, http.MethodPost, "/v1/keys", strings.NewReader(`{"name":"e2e","kind":"workspace"}`), "application/json", http.StatusCreated, &minted)
	if !strings.HasPrefix(minted.Key, "mk_live_") {
		t.Fatalf("minted key %q", minted.Key)
	}

	// Collect → debounced rebuild → multipart build, all on the real in-process Temporal.
	var (
		built          bool // the collect-build steps all passed
		slug, envID    string
		firstBuild     string
		providedBuild  string
		envBeforeStop  api.EnvDetail
		buildsBeforeSt []api.BuildSummary
	)
	t.Run("collect-build", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := cli.Collect(ctx, cli.CollectOptions{Endpoint: s.apiURL, Key: key, Files: []string{sampledata.File(t, e2eRetailTraces)}})
		if err != nil {
			t.Fatalf("cli.Collect %s: %v", e2eRetailTraces, err)
		}
		if res.Traces == 0 || res.Accepted != res.Traces || res.Duplicates != 0 || len(res.Envs) != 1 {
			t.Fatalf("collect result %+v: want every trace accepted once into one environment", res)
		}
		slug = res.Envs[0]

		var envs []api.EnvSummary
		s.call(t, http.MethodGet, "/v1/envs", nil, "", http.StatusOK, &envs)
		if len(envs) != 1 || envs[0].Slug != slug || envs[0].NTraces != res.Accepted || envs[0].Name != "tau2-retail" {
			t.Fatalf("GET /v1/envs = %+v, want one env %s (tau2-retail) with %d traces", envs, slug, res.Accepted)
		}
		envID = envs[0].ID

		// A resent file is acknowledged and counted once.
		again, err := cli.Collect(ctx, cli.CollectOptions{Endpoint: s.apiURL, Key: key, Files: []string{sampledata.File(t, e2eRetailTraces)}})
		if err != nil {
			t.Fatalf("collect again: %v", err)
		}
		if again.Accepted != 0 || again.Duplicates != res.Traces {
			t.Errorf("resent traces: %+v, want all %d duplicates", again, res.Traces)
		}

		// The debounced Rebuild starts Build after 1 s of quiet; wait for the environment to be ready.
		var env api.EnvDetail
		e2ePoll(t, e2eBuildTimeout, time.Second, "environment "+slug+" ready after collect", func() (bool, string) {
			env = api.EnvDetail{}
			s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
			if env.Status == "failed" {
				t.Fatalf("environment %s failed to build: headline %q; %s", slug, env.Headline, s.e2eBuildsState(slug))
			}
			return env.Status == "ready", fmt.Sprintf("status %s; %s", env.Status, s.e2eBuildsState(slug))
		})
		if env.NTools == 0 || env.CoveredPct <= 0 || env.CoveredPct > 100 || env.Headline == "" || env.ActiveBuild == nil {
			t.Fatalf("ready environment lacks its build figures: %+v", env)
		}
		if env.ActiveBuild.Status != "succeeded" || env.SchemaSource != "traces" || env.NTraces != res.Accepted {
			t.Fatalf("after the trace build: active build %+v, schema_source %q, n_traces %d", env.ActiveBuild, env.SchemaSource, env.NTraces)
		}
		firstBuild = env.ActiveBuild.ID
		t.Logf("trace build %s: %d tools, %.1f%% covered; %s", firstBuild, env.NTools, env.CoveredPct, env.Headline)

		// The multipart build with the real tool definitions.
		form, ct := e2eBuildForm(t, e2eRetailTools)
		var started api.BuildStarted
		s.call(t, http.MethodPost, "/v1/envs/"+slug+"/builds", form, ct, http.StatusAccepted, &started)
		if started.BuildID == "" || started.WorkflowID != workflows.BuildWorkflowID(started.BuildID) || started.Poll == "" {
			t.Fatalf("build started: %+v", started)
		}
		providedBuild = started.BuildID
		var det api.BuildDetail
		e2ePoll(t, e2eBuildTimeout, time.Second, "build "+providedBuild, func() (bool, string) {
			det = api.BuildDetail{}
			s.call(t, http.MethodGet, started.Poll, nil, "", http.StatusOK, &det)
			if det.Status == "failed" {
				t.Fatalf("build %s with provided tools failed at stage %s: %s", providedBuild, det.Stage, det.Error)
			}
			return det.Status == "succeeded", fmt.Sprintf("%s/%s %.2f", det.Status, det.Stage, det.Progress)
		})
		if !det.Active || det.BundleKey == "" || det.BundleHash == "" {
			t.Errorf("succeeded build detail %+v: want active with a bundle", det)
		}
		s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
		if env.SchemaSource != "provided" || env.ActiveBuild == nil || env.ActiveBuild.ID != providedBuild {
			t.Fatalf("after the provided-tools build: schema_source %q, active %+v", env.SchemaSource, env.ActiveBuild)
		}

		var rep struct {
			Build     *infer.Report          `json:"build"`
			SelfCheck *infer.SelfCheckReport `json:"self_check"`
		}
		s.call(t, http.MethodGet, started.Poll+"/report", nil, "", http.StatusOK, &rep)
		if rep.Build == nil || rep.SelfCheck == nil || len(rep.SelfCheck.Tools) == 0 || rep.SelfCheck.Calls == 0 {
			t.Fatalf("report lacks the build or per-tool self-check: %+v", rep)
		}
		found := false
		for _, tc := range rep.SelfCheck.Tools {
			if tc.AgreementPct < 0 || tc.AgreementPct > 100 || tc.Agree > tc.Calls {
				t.Errorf("tool %s agreement %.1f%% (%d of %d) out of range", tc.Name, tc.AgreementPct, tc.Agree, tc.Calls)
			}
			if tc.Name == "get_order_details" {
				found = tc.Calls > 0
			}
		}
		if !found {
			t.Errorf("self-check has no scored get_order_details line: %+v", rep.SelfCheck.Tools)
		}
		t.Logf("self-check: %.1f%% agreement over %d calls, %d tools", rep.SelfCheck.AgreementPct, rep.SelfCheck.Calls, len(rep.SelfCheck.Tools))

		var src api.ToolSource
		s.call(t, http.MethodGet, "/v1/envs/"+slug+"/tools/get_order_details/source", nil, "", http.StatusOK, &src)
		if src.Language != "starlark" || src.Build != providedBuild || strings.TrimSpace(src.Source) == "" {
			t.Fatalf("get_order_details source: %+v", src)
		}
		if err := twin.CheckHandler(src.Name, src.Source); err != nil {
			t.Errorf("get_order_details source does not compile as a Starlark handler: %v\n%s", err, src.Source)
		}

		// Issue #13: a trace collected after the upload rebuilds the environment from its uploaded inputs, so the
		// tool definitions and the scenario stay.
		s.call(t, http.MethodPost, "/api/collect", bytes.NewReader(e2eOneMoreTrace(t)), "application/json", http.StatusAccepted, nil)
		e2ePoll(t, e2eBuildTimeout, time.Second, "the rebuild after one more trace", func() (bool, string) {
			env = api.EnvDetail{}
			s.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
			if env.ActiveBuild == nil || env.ActiveBuild.ID == providedBuild {
				return false, s.e2eBuildsState(slug)
			}
			return env.ActiveBuild.Status == "succeeded", s.e2eBuildsState(slug)
		})
		if env.SchemaSource != "provided" {
			t.Errorf("after the rebuild: schema_source %q, want the uploaded tools (provided)", env.SchemaSource)
		}
		var det2 api.BuildDetail
		s.call(t, http.MethodGet, "/v1/envs/"+slug+"/builds/"+env.ActiveBuild.ID, nil, "", http.StatusOK, &det2)
		if det2.InputsKey == "" || det2.InputsKey != det.InputsKey {
			t.Errorf("rebuild used inputs %q, want the upload's %q", det2.InputsKey, det.InputsKey)
		}
		var opened api.OpenSessionBodyOut
		s.call(t, http.MethodPost, "/v1/envs/"+slug+"/sessions", strings.NewReader(`{"scenario": "pending", "seed": 1}`),
			"application/json", http.StatusCreated, &opened)
		s.call(t, http.MethodDelete, "/v1/sessions/"+opened.SessionID, nil, "", http.StatusOK, nil)
		providedBuild = env.ActiveBuild.ID // the build the restart must keep active

		envBeforeStop = env
		s.call(t, http.MethodGet, "/v1/envs/"+slug+"/builds", nil, "", http.StatusOK, &buildsBeforeSt)
		if len(buildsBeforeSt) < 2 {
			t.Fatalf("builds listed: %+v, want both builds", buildsBeforeSt)
		}
		built = true
	})

	// Clean shutdown, then the same data dir again.
	s.stop(t)
	if t.Failed() {
		return
	}
	s2 := startE2EStack(t, dir, key, apiAddr, tempAddr, uiAddr)

	t.Run("keys-survive", func(t *testing.T) {
		s2.call(t, http.MethodGet, "/v1/envs", nil, "", http.StatusOK, nil)
		if st, body := s2.try(http.MethodGet, "/v1/envs", minted.Key, nil, ""); st != http.StatusOK {
			t.Errorf("key minted before the restart: %d %s", st, body)
		}
		if !strings.Contains(s2.stdout.String(), key) {
			t.Errorf("restart banner does not print the same workspace key")
		}
	})

	t.Run("builds-survive", func(t *testing.T) {
		if !built {
			t.Fatal("the collect-build steps did not finish before the restart")
		}
		var env api.EnvDetail
		s2.call(t, http.MethodGet, "/v1/envs/"+slug, nil, "", http.StatusOK, &env)
		if env.ID != envID || env.Status != "ready" || env.NTraces != envBeforeStop.NTraces || env.NTools != envBeforeStop.NTools ||
			env.SchemaSource != "provided" || env.ActiveBuild == nil || env.ActiveBuild.ID != providedBuild {
			t.Errorf("environment after restart %+v\nbefore %+v", env, envBeforeStop)
		}
		var builds []api.BuildSummary
		s2.call(t, http.MethodGet, "/v1/envs/"+slug+"/builds", nil, "", http.StatusOK, &builds)
		if len(builds) != len(buildsBeforeSt) {
			t.Errorf("builds after restart %+v, before %+v", builds, buildsBeforeSt)
		}
		tc := e2eTemporalClient(t, tempAddr)
		for _, id := range []string{workflows.BuildWorkflowID(firstBuild), workflows.BuildWorkflowID(providedBuild), wfclient.RebuildWorkflowID(envID)} {
			if st := e2eWorkflowStatus(t, tc, id); st != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
				t.Errorf("workflow %s after restart: %s, want COMPLETED", id, st)
			}
			// doppel dev registers doppel's search attributes, so its workflows can be filtered by environment.
			if got := e2eWorkflowEnv(t, tc, id); got != envID {
				t.Errorf("workflow %s carries DoppelEnv %q, want %q", id, got, envID)
			}
		}
		var src api.ToolSource
		s2.call(t, http.MethodGet, "/v1/envs/"+slug+"/tools/get_order_details/source", nil, "", http.StatusOK, &src)
		if src.Build != providedBuild || src.Source == "" {
			t.Errorf("tool source after restart: %+v", src)
		}
	})
	s2.stop(t)
}
