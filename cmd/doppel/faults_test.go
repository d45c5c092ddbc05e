package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/internal/testenv"
)

// The fault suite on the production shape (issue 13): `doppel serve` and `doppel worker` as containers of the
// service image (docker/service.Dockerfile, built by docker/service-image.sh as `task service-image` builds it)
// on a real PostgreSQL, MinIO, Temporal server and Docker engine, with Docker twins. The worker is killed (-9) in
// the middle of a build and the API in the middle of a stream of session calls; each comes back and nothing
// acknowledged is lost. The figures go to the test log and, when DOPPEL_FAULT_REPORT names a file, to it
// (.ci/run prints it).

// faultStack is the production shape's two processes, each restartable on the same configuration: containers of
// image when it is set (on the host's network, so they reach the services the tests were given on loopback, as
// processes would), else processes of bin.
type faultStack struct {
	t        *testing.T
	bin      string
	image    string
	label    string // dev.doppel.test=<label> on the containers, for the cleanup
	dir      string
	key      string
	apiAddr  string
	temporal string
	env      []string
	runs     int
	api      *crashProc
	worker   *crashProc
}

// figure logs one of the fault suite's figures and, when DOPPEL_FAULT_REPORT names a file, appends it there.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := t.Name() + ": " + fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv("DOPPEL_FAULT_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("fault report: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Errorf("fault report: %v", err)
	}
}

func (s *faultStack) url() string { return "http://" + s.apiAddr }

// dockerRun is the docker CLI's arguments to run a container of the service image named name on the host's
// network with the stack's environment (a variable set twice takes its last value, as for a process), removed when
// it exits.
func (s *faultStack) dockerRun(name string, args ...string) []string {
	run := []string{"run", "--rm", "--name", name, "--network", "host", "--label", "dev.doppel.test=" + s.label}
	last := map[string]int{}
	for i, kv := range s.env {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	for i, kv := range s.env {
		if k, _, _ := strings.Cut(kv, "="); last[k] == i {
			run = append(run, "-e", kv)
		}
	}
	return append(append(run, s.image), args...)
}

// faultServiceImage builds the service image with docker/service-image.sh, the script `task service-image` runs
// (no registry: FROM scratch around the static binary).
func faultServiceImage(t *testing.T) string {
	t.Helper()
	const image = "doppel-service:fault-test"
	began := time.Now()
	out, err := exec.Command("bash", filepath.Join("..", "..", "docker", "service-image.sh"), image).CombinedOutput()
	if err != nil {
		t.Fatalf("docker/service-image.sh: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", image, time.Since(began).Round(time.Millisecond))
	return image
}

// reapProcessTwins stops the process twins recorded under a stack's data directory dir and clears their records, as a
// worker's reconciler would for twins no deployment keeps.
func reapProcessTwins(t testing.TB, dir string) {
	t.Helper()
	d, err := driver.NewProcess(driver.ProcessOptions{StateDir: filepath.Join(dir, "twins")})
	if err != nil {
		t.Errorf("process twins under %s: %v", dir, err)
		return
	}
	reaped, err := d.Reconcile(context.Background(), nil, 0)
	if err != nil {
		t.Errorf("stop the process twins left under %s: %v", dir, err)
	}
	for _, h := range reaped {
		t.Logf("stopped process twin %s (pid %d) left by the stack", h.ID, h.PID)
	}
}

// start runs `doppel <cmd>` and waits until it says it is up (the API: /readyz 200; the worker: polling).
func (s *faultStack) start(cmd string) *crashProc {
	t := s.t
	t.Helper()
	s.runs++
	logPath := filepath.Join(s.dir, fmt.Sprintf("%s-%d.log", cmd, s.runs))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var c *exec.Cmd
	var container string
	if s.image != "" {
		// The docker CLI stays attached (its output is the container's, its exit status the container's); signals go
		// to the container (crashProc.signal). The container keeps its own /data: with PostgreSQL and S3 nothing
		// of the stack's state is on local disk.
		container = fmt.Sprintf("%s-%s-%d", s.label, cmd, s.runs)
		c = exec.Command("docker", s.dockerRun(container, cmd, "--api-addr", s.apiAddr, "--log-level", "info")...)
	} else {
		c = exec.Command(s.bin, cmd, "--api-addr", s.apiAddr, "--log-level", "info", "--data-dir", s.dir)
		c.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}, s.env...)
	}
	c.Stdout, c.Stderr = logf, logf
	p := &crashProc{cmd: c, container: container, logPath: logPath, exited: make(chan struct{})}
	began := time.Now()
	if err := c.Start(); err != nil {
		logf.Close()
		t.Fatalf("start doppel %s: %v", cmd, err)
	}
	go func() {
		p.waitErr = c.Wait()
		logf.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { p.kill(t) })
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(e2eStartTimeout)
	for {
		select {
		case <-p.exited:
			t.Fatalf("doppel %s exited at start: %v\n%s", cmd, p.waitErr, p.logTail())
		default:
		}
		if cmd == "worker" {
			if data, _ := os.ReadFile(logPath); bytes.Contains(data, []byte("doppel worker polling")) {
				p.ready = time.Since(began)
				return p
			}
		} else if resp, err := hc.Get(s.url() + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Since(began)
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("doppel %s not up within %s\n%s", cmd, e2eStartTimeout, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// do sends one API request with the workspace key (or token) and decodes a JSON answer into out.
func (s *faultStack) do(method, path, token string, body any, out any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, s.url()+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, data, fmt.Errorf("decode %s: %w", data, err)
		}
	}
	return resp.StatusCode, data, nil
}

// must is do that fails the test on a transport error or an unexpected status.
func (s *faultStack) must(method, path, token string, body any, want int, out any) {
	s.t.Helper()
	st, data, err := s.do(method, path, token, body, out)
	if err != nil || st != want {
		s.t.Fatalf("%s %s: %d %s (%v), want %d", method, path, st, data, err, want)
	}
}

type faultBuild struct {
	ID       string  `json:"id"`
	Status   string  `json:"status"`
	Stage    string  `json:"stage"`
	Progress float64 `json:"progress"`
	Error    string  `json:"error"`
}

func (s *faultStack) builds(slug string) []faultBuild {
	var out []faultBuild
	if st, data, err := s.do(http.MethodGet, "/v1/envs/"+slug+"/builds", s.key, nil, &out); err != nil || st != http.StatusOK {
		s.t.Logf("list builds: %d %s %v", st, data, err)
	}
	return out
}

// faultImage builds the twin image with the docker CLI (no registry: FROM scratch) around a static twin-only
// binary, built as the driver tests build theirs so the two share the build cache.
func faultImage(t *testing.T) string {
	t.Helper()
	ctxDir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(ctxDir, "doppel"), "../../driver/internal/twinmain")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the twin binary: %v\n%s", err, out)
	}
	const image = "doppel-twin:fault-test"
	out, err := exec.Command("docker", "build", "-q", "-f", filepath.Join("..", "..", "docker", "twin.Dockerfile"), "-t", image, ctxDir).CombinedOutput()
	if err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	return image
}

func TestFaultsProductionShape(t *testing.T) {
	if testing.Short() {
		t.Skip("faults: builds the binary and kills serve and worker processes")
	}
	temporalAddr := testenv.Temporal(t)
	dockerHost := testenv.Docker(t)
	if !strings.HasPrefix(dockerHost, "unix://") {
		t.Fatalf("DOPPEL_TEST_DOCKER=%s: the fault suite cuts the engine with a proxy in front of its unix socket", dockerHost)
	}
	engine := newCrashProxy(t, dockerHost) // doppel reaches the engine through it, so the suite can cut it
	be := realBackend(t, nil, nil)

	dir := t.TempDir()
	serviceImage := faultServiceImage(t)
	image := faultImage(t)
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	s := &faultStack{t: t, image: serviceImage, label: "faults-" + suffix, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t),
		temporal: temporalAddr,
		env: append([]string{
			"DOPPEL_BOOTSTRAP_KEY=" + m.Plaintext,
			"DOPPEL_TEMPORAL_ADDRESS=" + temporalAddr,
			"DOPPEL_TEMPORAL_TASK_QUEUE=faults-" + suffix,
			"DOPPEL_TWIN_DRIVER=docker", "DOPPEL_TWIN_IMAGE=" + image, "DOPPEL_TWIN_OWNER=faults-" + suffix,
			"DOPPEL_TWIN_DOCKER_HOST=tcp://" + engine.addr(),
			"DOPPEL_COLLECT_REBUILD_DEBOUNCE=1s",
			"DOPPEL_COLLECT_RATE_PER_SECOND=100000", "DOPPEL_COLLECT_RATE_BURST=100000",
			// On the host's network the image's 0.0.0.0:9464 would be every worker's: a free loopback port instead.
			"DOPPEL_METRICS_WORKER_ADDR=" + e2eFreeAddr(t),
		}, be.env...)}
	t.Cleanup(func() {
		// The twins this suite started (its owner label names only them), and any service container a killed test
		// left (dev.doppel.test).
		for _, label := range []string{"dev.doppel.owner=faults-" + suffix, "dev.doppel.test=" + s.label} {
			out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label="+label).Output()
			if ids := strings.Fields(string(out)); len(ids) > 0 {
				_ = exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run()
			}
		}
	})
	if out, err := exec.Command("docker", s.dockerRun(s.label+"-migrate", "migrate")...).CombinedOutput(); err != nil {
		t.Fatalf("doppel migrate (container of %s): %v\n%s", serviceImage, err, out)
	}
	s.api = s.start("serve")
	s.worker = s.start("worker")
	figure(t, "production shape (serve and worker as containers of the service image, host network): serve up in %s, worker polling in %s",
		s.api.ready.Round(time.Millisecond), s.worker.ready.Round(time.Millisecond))

	// The first build, undisturbed: the retail traces.
	corpus := crashTraces(t)
	body, err := json.Marshal(map[string]any{"project": "faults-retail", "traces": corpus})
	if err != nil {
		t.Fatal(err)
	}
	var accepted struct {
		Env string `json:"env"`
	}
	req, _ := http.NewRequest(http.MethodPost, s.url()+"/api/collect", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &accepted) != nil || accepted.Env == "" {
		t.Fatalf("collect: %d %s", resp.StatusCode, data)
	}
	slug := accepted.Env
	began := time.Now()
	e2ePoll(t, 10*time.Minute, 200*time.Millisecond, "the first build", func() (bool, string) {
		bs := s.builds(slug)
		if len(bs) > 0 && bs[0].Status == "failed" {
			t.Fatalf("first build failed: %s", bs[0].Error)
		}
		return len(bs) > 0 && bs[0].Status == "succeeded", fmt.Sprintf("%+v", bs)
	})
	figure(t, "build of %d retail traces, undisturbed: %s from collect to succeeded", len(corpus), time.Since(began).Round(100*time.Millisecond))

	t.Run("worker-kill-during-build", func(t *testing.T) { faultWorkerKill(t, s, slug, corpus) })
	t.Run("api-kill-during-calls", func(t *testing.T) { faultAPIKill(t, s, slug) })
	t.Run("wake-after-container-removed", func(t *testing.T) { faultWakeContainerRemoved(t, s, slug, suffix) })
	t.Run("docker-engine-down", func(t *testing.T) { faultEngineDown(t, s, slug, engine, suffix) })
	t.Run("api-kill-during-ingest", func(t *testing.T) { faultIngestKill(t, s, be, corpus) })
	s.api.term(t)
	s.worker.term(t)
}
