package devserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/devserver"
	"github.com/doppel-dev/doppel/internal/latency"
)

const (
	taskQueue    = "devserver-test"
	workflowName = "devserver-test.Greet"
	activityName = "devserver-test.Greeting"
)

// greeter holds the activity's dependencies.
type greeter struct{ prefix string }

func (g *greeter) Greeting(_ context.Context, name string) (string, error) {
	return g.prefix + name, nil
}

func greetWorkflow(ctx workflow.Context, name string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
	var out string
	err := workflow.ExecuteActivity(ctx, activityName, name).Get(ctx, &out)
	return out, err
}

// testLogger sends warnings and errors to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func start(t testing.TB, o devserver.Options) (*devserver.Server, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	s, err := devserver.Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	took := time.Since(begin)
	t.Cleanup(func() { _ = s.Stop() })
	return s, took
}

func dial(t testing.TB, s *devserver.Server) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{
		HostPort:  s.FrontendAddr(),
		Namespace: s.Namespace(),
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		t.Fatalf("dial %s: %v", s.FrontendAddr(), err)
	}
	t.Cleanup(c.Close)
	return c
}

func startWorker(t testing.TB, c client.Client) {
	t.Helper()
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(greetWorkflow, workflow.RegisterOptions{Name: workflowName})
	g := &greeter{prefix: "hello, "}
	w.RegisterActivityWithOptions(g.Greeting, activity.RegisterOptions{Name: activityName})
	if err := w.Start(); err != nil {
		t.Fatalf("worker start: %v", err)
	}
	t.Cleanup(w.Stop)
}

func runGreet(ctx context.Context, c client.Client, id, name string) (string, error) {
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: taskQueue}, workflowName, name)
	if err != nil {
		return "", err
	}
	var out string
	err = run.Get(ctx, &out)
	return out, err
}

// TestRoundTripAndRestart runs a workflow with an activity, restarts the server on the same data dir, and finds
// the completed workflow (and its result) still there.
func TestRoundTripAndRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	s, cold := start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", UIAddr: "127.0.0.1:0", Logger: testLogger(t)})
	t.Logf("cold start (new data dir): %v", cold)
	if s.Namespace() != devserver.DefaultNamespace {
		t.Fatalf("Namespace() = %q, want %q", s.Namespace(), devserver.DefaultNamespace)
	}

	c := dial(t, s)
	startWorker(t, c)
	begin := time.Now()
	got, err := runGreet(ctx, c, "greet-1", "doppel")
	if err != nil {
		t.Fatalf("workflow: %v", err)
	}
	t.Logf("first workflow round trip (incl. worker warm-up): %v", time.Since(begin))
	if got != "hello, doppel" {
		t.Fatalf("workflow result = %q, want %q", got, "hello, doppel")
	}

	// The UI serves its app and reaches the frontend through its API proxy.
	checkUI(t, s)

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// The old frontend is gone.
	if conn, err := net.DialTimeout("tcp", s.FrontendAddr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("frontend %s still accepts connections after Stop", s.FrontendAddr())
	}

	s2, warm := start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", Logger: testLogger(t)})
	t.Logf("warm start (existing data dir): %v", warm)
	if s2.UIURL() != "" {
		t.Fatalf("UIURL() = %q with no UIAddr, want empty", s2.UIURL())
	}
	c2 := dial(t, s2)
	desc, err := c2.DescribeWorkflowExecution(ctx, "greet-1", "")
	if err != nil {
		t.Fatalf("DescribeWorkflowExecution after restart: %v", err)
	}
	info := desc.GetWorkflowExecutionInfo()
	if st := info.GetStatus(); st != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		t.Fatalf("workflow status after restart = %v, want COMPLETED", st)
	}
	if info.GetType().GetName() != workflowName {
		t.Fatalf("workflow type after restart = %q, want %q", info.GetType().GetName(), workflowName)
	}
	var again string
	if err := c2.GetWorkflow(ctx, "greet-1", "").Get(ctx, &again); err != nil || again != "hello, doppel" {
		t.Fatalf("result after restart = %q, %v; want %q", again, err, "hello, doppel")
	}
	// And the restarted server runs new work.
	startWorker(t, c2)
	if got, err := runGreet(ctx, c2, "greet-2", "again"); err != nil || got != "hello, again" {
		t.Fatalf("workflow after restart = %q, %v", got, err)
	}
}

func checkUI(t *testing.T, s *devserver.Server) {
	t.Helper()
	if s.UIURL() == "" {
		t.Fatal("UIURL() is empty with a UIAddr set")
	}
	body := httpGet(t, s.UIURL()+"/")
	if !strings.Contains(strings.ToLower(body), "<html") {
		t.Fatalf("UI root is not an HTML page: %.200q", body)
	}
	var ns struct {
		NamespaceInfo struct{ Name string } `json:"namespaceInfo"`
	}
	raw := httpGet(t, s.UIURL()+"/api/v1/namespaces/"+s.Namespace())
	if err := json.Unmarshal([]byte(raw), &ns); err != nil || ns.NamespaceInfo.Name != s.Namespace() {
		t.Fatalf("UI API did not describe namespace %q (%v): %.300q", s.Namespace(), err, raw)
	}
	var wf struct {
		WorkflowExecutionInfo struct {
			Type   struct{ Name string }
			Status string
		} `json:"workflowExecutionInfo"`
	}
	raw = httpGet(t, s.UIURL()+"/api/v1/namespaces/"+s.Namespace()+"/workflows/greet-1")
	if err := json.Unmarshal([]byte(raw), &wf); err != nil || wf.WorkflowExecutionInfo.Type.Name != workflowName ||
		wf.WorkflowExecutionInfo.Status != "WORKFLOW_EXECUTION_STATUS_COMPLETED" {
		t.Fatalf("UI API did not show completed workflow greet-1 (%v): %.400q", err, raw)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %.300q", url, resp.Status, b)
	}
	return string(b)
}

func TestCustomNamespace(t *testing.T) {
	s, _ := start(t, devserver.Options{DataDir: t.TempDir(), FrontendAddr: "localhost:0", Namespace: "doppel-test"})
	if !strings.HasPrefix(s.FrontendAddr(), "127.0.0.1:") {
		t.Fatalf("FrontendAddr() = %q, want 127.0.0.1:<port>", s.FrontendAddr())
	}
	c := dial(t, s)
	resp, err := c.WorkflowService().DescribeNamespace(context.Background(),
		&workflowservice.DescribeNamespaceRequest{Namespace: "doppel-test"})
	if err != nil {
		t.Fatalf("DescribeNamespace(doppel-test): %v", err)
	}
	if got := resp.GetNamespaceInfo().GetName(); got != "doppel-test" {
		t.Fatalf("namespace name = %q", got)
	}
}

func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0"})
	s, err := devserver.Start(context.Background(), devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0"})
	if err == nil {
		s.Stop()
		t.Fatal("second Start on the same DataDir succeeded")
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Start error = %v, want DataDir in use", err)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	tests := []struct {
		name string
		o    devserver.Options
		want string
	}{
		{"no data dir", devserver.Options{FrontendAddr: "127.0.0.1:0"}, "DataDir"},
		{"bad namespace", devserver.Options{DataDir: dir, Namespace: "has space"}, "Namespace"},
		{"frontend no port", devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1"}, "FrontendAddr"},
		{"frontend hostname", devserver.Options{DataDir: dir, FrontendAddr: "example.com:7233"}, "FrontendAddr"},
		{"frontend bad port", devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:70000"}, "FrontendAddr"},
		{"frontend in use", devserver.Options{DataDir: dir, FrontendAddr: busy.Addr().String()}, "FrontendAddr"},
		{"ui in use", devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", UIAddr: busy.Addr().String()}, "UIAddr"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := devserver.Start(context.Background(), tc.o)
			if err == nil {
				s.Stop()
				t.Fatalf("Start succeeded, want an error naming %s", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start error = %v, want it to name %s", err, tc.want)
			}
		})
	}
}

// BenchmarkStart measures start-to-ready (frontend answering) on a new and on an existing data dir.
func BenchmarkStart(b *testing.B) {
	for _, mode := range []string{"cold", "warm"} {
		b.Run(mode, func(b *testing.B) {
			warmDir := b.TempDir()
			if mode == "warm" {
				s, _ := start(b, devserver.Options{DataDir: warmDir, FrontendAddr: "127.0.0.1:0"})
				s.Stop()
			}
			var durs []time.Duration
			for b.Loop() {
				dir := warmDir
				if mode == "cold" {
					dir = b.TempDir()
				}
				begin := time.Now()
				s, err := devserver.Start(context.Background(), devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0"})
				if err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(begin))
				b.StopTimer()
				if err := s.Stop(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			reportPercentiles(b, durs)
		})
	}
}

// BenchmarkWorkflowRoundTrip measures start-to-result of a workflow running one activity, client and worker
// in process, against the dev server.
func BenchmarkWorkflowRoundTrip(b *testing.B) {
	s, _ := start(b, devserver.Options{DataDir: b.TempDir(), FrontendAddr: "127.0.0.1:0"})
	c := dial(b, s)
	startWorker(b, c)
	ctx := context.Background()
	if _, err := runGreet(ctx, c, "warmup", "x"); err != nil {
		b.Fatal(err)
	}
	var durs []time.Duration
	i := 0
	for b.Loop() {
		i++
		begin := time.Now()
		if _, err := runGreet(ctx, c, fmt.Sprintf("bench-%d", i), "x"); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(begin))
	}
	reportPercentiles(b, durs)
}

func reportPercentiles(b *testing.B, durs []time.Duration) {
	if len(durs) == 0 {
		return
	}
	slices.Sort(durs)
	pct := func(p float64) time.Duration { return latency.Percentile(durs, p) }
	b.ReportMetric(float64(pct(50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(99).Microseconds())/1000, "p99-ms")
}

// TestSearchAttributes: the custom search attributes asked for are registered at start (on SQLite visibility), a
// workflow started with them can be listed by them, a restart with the same ones is fine, and one already
// registered with another type is refused.
func TestSearchAttributes(t *testing.T) {
	for _, existing := range []bool{false, true} {
		t.Run(map[bool]string{false: "new namespace", true: "existing namespace"}[existing], func(t *testing.T) {
			testSearchAttributes(t, existing)
		})
	}
}

// testSearchAttributes runs TestSearchAttributes on a new data dir, or on one whose namespace a start without the
// attributes made.
func testSearchAttributes(t *testing.T, existing bool) {
	dir := t.TempDir()
	if existing {
		first, _ := start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0"})
		if err := first.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	attrs := map[string]enumspb.IndexedValueType{"DoppelTestEnv": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"DoppelTestBuild": enumspb.INDEXED_VALUE_TYPE_KEYWORD}
	s, _ := start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", SearchAttributes: attrs})
	c := dial(t, s)
	ctx := context.Background()
	list, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	for name, typ := range attrs {
		if got := list.GetCustomAttributes()[name]; got != typ {
			t.Errorf("%s registered as %v, want %v", name, got, typ)
		}
	}
	startWorker(t, c)
	env := temporal.NewSearchAttributeKeyKeyword("DoppelTestEnv")
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "tagged", TaskQueue: taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(env.ValueSet("env_1"))}, workflowName, "tag")
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: s.Namespace(), Query: `DoppelTestEnv = "env_1"`})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Executions) == 1 && res.Executions[0].Execution.WorkflowId == "tagged" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listing by the attribute found %d executions", len(res.Executions))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	again, _ := start(t, devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", SearchAttributes: attrs})
	if err := again.Stop(); err != nil {
		t.Fatal(err)
	}
	other := map[string]enumspb.IndexedValueType{"DoppelTestEnv": enumspb.INDEXED_VALUE_TYPE_TEXT}
	bad, err := devserver.Start(context.Background(), devserver.Options{DataDir: dir, FrontendAddr: "127.0.0.1:0", SearchAttributes: other})
	if err == nil {
		_ = bad.Stop()
		t.Fatal("a search attribute registered with another type was accepted")
	}
	if !strings.Contains(err.Error(), "DoppelTestEnv") {
		t.Fatalf("error does not name the attribute: %v", err)
	}
}
