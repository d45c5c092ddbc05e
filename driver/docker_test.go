package driver

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// testImage is the twin image the Docker tests build from twinBinary and docker/twin.Dockerfile.
const testImage = "doppel-twin:driver-test"

var buildImageOnce struct {
	sync.Once
	err error
}

// dockerClient returns a client of the real engine named by DOPPEL_TEST_DOCKER (or skips), with the test image built.
func dockerClient(t testing.TB) *client.Client {
	t.Helper()
	host := testenv.Docker(t)
	cli, err := NewDockerClient(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	buildImageOnce.Do(func() { buildImageOnce.err = buildTestImage(cli) })
	if buildImageOnce.err != nil {
		t.Fatalf("build %s: %v", testImage, buildImageOnce.err)
	}
	return cli
}

// buildTestImage builds docker/twin.Dockerfile with twinBinary as the doppel binary.
func buildTestImage(cli *client.Client) error {
	dockerfile, err := os.ReadFile("../docker/twin.Dockerfile")
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(twinBinary)
	if err != nil {
		return err
	}
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"twin.Dockerfile", 0o644, dockerfile}, {"doppel", 0o755, bin}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The image this build replaces is removed afterwards, so test runs leave no dangling images.
	var previous string
	if old, err := cli.ImageInspect(ctx, testImage); err == nil {
		previous = old.ID
	}
	if err := imageBuild(ctx, cli, &ctxTar); err != nil {
		return err
	}
	if cur, err := cli.ImageInspect(ctx, testImage); err == nil && previous != "" && cur.ID != previous {
		_, _ = cli.ImageRemove(ctx, previous, client.ImageRemoveOptions{PruneChildren: true})
	}
	return nil
}

func imageBuild(ctx context.Context, cli *client.Client, ctxTar io.Reader) error {
	res, err := cli.ImageBuild(ctx, ctxTar, client.ImageBuildOptions{Tags: []string{testImage}, Dockerfile: "twin.Dockerfile", Remove: true, ForceRemove: true})
	if err != nil {
		return err
	}
	defer res.Body.Close()
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Error  string `json:"error"`
			Stream string `json:"stream"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if msg.Error != "" {
			return errors.New(msg.Error)
		}
	}
}

func newDocker(t testing.TB, cli DockerAPI, owner string) *Docker {
	t.Helper()
	d, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, ReadyTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// reapOwner removes every container of owner, whatever the test left.
func reapOwner(t testing.TB, cli DockerAPI, owner string) {
	t.Helper()
	d := newDocker(t, cli, owner)
	if _, err := d.Reconcile(context.Background(), nil, 0); err != nil {
		t.Errorf("cleanup of %s: %v", owner, err)
	}
}

func testOwner(t testing.TB) string { return "test-" + nameSafe(t.Name()) + "-" + randomHex(3) }

func TestDockerLifecycle(t *testing.T) {
	ctx := context.Background()
	cli := dockerClient(t)
	owner := testOwner(t)
	t.Cleanup(func() { reapOwner(t, cli, owner) })
	const memory = 256 << 20
	d, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, Env: []string{"DOPPEL_LOG_LEVEL=debug"}, MemoryBytes: memory,
		Route: RoutePublished})
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	h, err := d.Start(ctx, bankSpec("env_d1"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("docker cold start (wake → ready): %v", time.Since(start))
	if h.Driver != DockerDriverName || !strings.HasPrefix(h.Addr, "http://127.0.0.1:") {
		t.Fatalf("handle = %+v", h)
	}
	if st := mustInspect(t, d, h); st.State != StateReady {
		t.Fatalf("Inspect = %+v, want ready", st)
	}
	raw, err := cli.ContainerInspect(ctx, h.ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := raw.Container.HostConfig.Memory; got != memory {
		t.Errorf("container memory limit = %d, want %d", got, memory)
	}
	labels := raw.Container.Config.Labels
	if labels[LabelEnv] != "env_d1" || labels[LabelBuild] != "bld_1" || labels[LabelOwner] != owner {
		t.Fatalf("labels = %v", labels)
	}
	if !slices.Contains(raw.Container.Config.Env, "DOPPEL_LOG_LEVEL=debug") {
		t.Fatalf("container env = %v, want the configured variable", raw.Container.Config.Env)
	}
	hs, err := d.List(ctx)
	if err != nil || len(hs) != 1 || hs[0].ID != h.ID || hs[0].Addr != h.Addr || hs[0].EnvID != "env_d1" {
		t.Fatalf("List = %+v, %v", hs, err)
	}

	c := rpc.NewClient(h.Addr, nil)
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s1"}); err != nil {
		t.Fatal(err)
	}
	s := &session{id: "s1"}
	if res := s.call(t, c, "deposit", `{"id":"a1","amount":2}`); !strings.Contains(res.Content, "12") {
		t.Fatalf("deposit = %+v", res)
	}

	if err := d.Stop(ctx, h); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st := mustInspect(t, d, h); st.State != StateGone {
		t.Fatalf("Inspect after Stop = %+v, want gone", st)
	}
	if err := d.Stop(ctx, h); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// The container dies (kill -9 of its process): Inspect says so, and a new twin rebuilds the session from its journal
// to the same state_hash.
func TestDockerKillRebuild(t *testing.T) {
	ctx := context.Background()
	cli := dockerClient(t)
	owner := testOwner(t)
	t.Cleanup(func() { reapOwner(t, cli, owner) })
	d := newDocker(t, cli, owner)
	spec := bankSpec("env_dk")

	h, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := rpc.NewClient(h.Addr, nil)
	s := &session{id: "ses_dk", spec: rpc.SessionSpec{Seed: 9}}
	if _, err := c.Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec}); err != nil {
		t.Fatal(err)
	}
	s.call(t, c, "deposit", `{"id":"a2","amount":4}`)
	s.call(t, c, "deposit", `{"id":"a2","amount":4}`)
	before := s.lastHash()

	if _, err := cli.ContainerKill(ctx, h.ID, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, d, h, StateExited)
	if _, err := c.Session(ctx, s.id); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("after the kill: %v, want ErrUnreachable", err)
	}
	h2, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt, err := rpc.NewClient(h2.Addr, nil).Open(ctx, rpc.OpenRequest{ID: s.id, Spec: s.spec, Journal: s.journal})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if rebuilt.StateHash != before {
		t.Fatalf("rebuilt state %s, before the kill %s", rebuilt.StateHash, before)
	}
}

// A worker crashed and left its containers: a new driver of the same owner reaps those nobody owns and never
// touches another owner's.
func TestDockerReconcile(t *testing.T) {
	ctx := context.Background()
	cli := dockerClient(t)
	owner, other := testOwner(t), testOwner(t)
	t.Cleanup(func() { reapOwner(t, cli, owner); reapOwner(t, cli, other) })

	crashed := newDocker(t, cli, owner)
	orphan, err := crashed.Start(ctx, bankSpec("env_orphan"))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := crashed.Start(ctx, bankSpec("env_kept"))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := newDocker(t, cli, other).Start(ctx, bankSpec("env_orphan"))
	if err != nil {
		t.Fatal(err)
	}

	d := newDocker(t, cli, owner) // the restarted worker
	removed, err := d.Reconcile(ctx, func(h Handle) bool { return h.ID == kept.ID }, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].ID != orphan.ID || removed[0].EnvID != "env_orphan" {
		t.Fatalf("Reconcile removed %+v, want only the orphan %s", removed, orphan.ID)
	}
	if st := mustInspect(t, d, orphan); st.State != StateGone {
		t.Fatalf("orphan after Reconcile: %+v", st)
	}
	if st := mustInspect(t, d, kept); st.State != StateReady {
		t.Fatalf("kept twin after Reconcile: %+v", st)
	}
	if st := mustInspect(t, d, foreign); st.State != StateReady {
		t.Fatalf("another owner's twin after Reconcile: %+v", st)
	}
}

func TestDockerImageMissing(t *testing.T) {
	cli := dockerClient(t)
	d, err := NewDocker(DockerOptions{Client: cli, Image: "doppel-twin:no-such-tag", Owner: testOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Start(context.Background(), bankSpec("env_x"))
	if !errors.Is(err, ErrImageMissing) || !strings.Contains(err.Error(), "docker build") {
		t.Fatalf("Start with a missing image: %v, want ErrImageMissing with the build command", err)
	}
}

// An engine that does not answer is reported as such, quickly: never a hang.
func TestDockerEngineUnreachable(t *testing.T) {
	// A hung engine: accepts connections and never answers.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	hosts := []string{
		"unix://" + t.TempDir() + "/no-docker.sock", // nothing listens
		"tcp://127.0.0.1:1",                         // refused
		"tcp://192.0.2.1:2375",                      // TEST-NET-1: blackholed or unroutable
		"tcp://" + hung.Addr().String(),             // accepts, never answers
	}
	for _, host := range hosts {
		t.Run(host, func(t *testing.T) {
			cli, err := NewDockerClient(host)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			d, err := NewDocker(DockerOptions{Client: cli, Host: host, Image: testImage, Owner: "o",
				PingTimeout: 500 * time.Millisecond, APITimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			start := time.Now()
			_, err = d.Start(ctx, bankSpec("env_u"))
			elapsed := time.Since(start)
			if !errors.Is(err, ErrEngineUnreachable) || !strings.Contains(err.Error(), host) {
				t.Fatalf("Start: %v, want ErrEngineUnreachable naming %s", err, host)
			}
			if elapsed > 5*time.Second {
				t.Fatalf("Start took %v to report an unreachable engine", elapsed)
			}
			t.Logf("unreachable engine reported in %v: %v", elapsed, err)
			h := Handle{Driver: DockerDriverName, ID: "abc"}
			if _, err := d.Inspect(ctx, h); !errors.Is(err, ErrEngineUnreachable) {
				t.Fatalf("Inspect: %v", err)
			}
			if err := d.Stop(ctx, h); !errors.Is(err, ErrEngineUnreachable) {
				t.Fatalf("Stop: %v", err)
			}
			if _, err := d.List(ctx); !errors.Is(err, ErrEngineUnreachable) {
				t.Fatalf("List: %v", err)
			}
			if _, err := d.Reconcile(ctx, nil, 0); !errors.Is(err, ErrEngineUnreachable) {
				t.Fatalf("Reconcile: %v", err)
			}
		})
	}
}

func TestNewDockerRejectsBadOptions(t *testing.T) {
	cli, err := NewDockerClient("unix:///nonexistent.sock")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		opts DockerOptions
		text string
	}{
		{DockerOptions{Image: "i", Owner: "o"}, "Client"},
		{DockerOptions{Client: cli, Owner: "o"}, "Image"},
		{DockerOptions{Client: cli, Image: "i"}, "Owner"},
		{DockerOptions{Client: cli, Image: "i", Owner: "o", PublishIP: "localhost"}, "PublishIP"},
		{DockerOptions{Client: cli, Image: "i", Owner: "o", Route: "bridge"}, "Route"},
	} {
		if _, err := NewDocker(tt.opts); err == nil || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("NewDocker(%+v): %v, want an error naming %s", tt.opts, err, tt.text)
		}
	}
}

// Each route reaches the twin where it says: published through the loopback port, container at the bridge address,
// auto at the bridge address when it answers from this host. A restarted driver (a new worker) derives the same
// address from the listed container; the address answers tool calls.
func TestDockerRoutes(t *testing.T) {
	ctx := context.Background()
	cli := dockerClient(t)
	for _, route := range []string{RoutePublished, RouteContainer, RouteAuto} {
		t.Run(route, func(t *testing.T) {
			owner := testOwner(t)
			t.Cleanup(func() { reapOwner(t, cli, owner) })
			d, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, Route: route, ReadyTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			h, err := d.Start(ctx, bankSpec("env_route"))
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			_, direct, err := d.address(ctx, h.ID)
			if err != nil || direct == "" {
				t.Fatalf("bridge address: %q %v", direct, err)
			}
			want := direct
			if route == RoutePublished || route == RouteAuto && !d.answersDirect(ctx, direct) {
				want = ""
			}
			if want != "" && h.Addr != want || want == "" && !strings.HasPrefix(h.Addr, "http://127.0.0.1:") {
				t.Fatalf("route %s: handle address %s (bridge address %s)", route, h.Addr, direct)
			}
			c := rpc.NewClient(h.Addr, nil)
			if _, err := c.Open(ctx, rpc.OpenRequest{ID: "s1"}); err != nil {
				t.Fatal(err)
			}
			s := &session{id: "s1"}
			if res := s.call(t, c, "deposit", `{"id":"a1","amount":2}`); !strings.Contains(res.Content, "12") {
				t.Fatalf("deposit = %+v", res)
			}
			if st := mustInspect(t, d, h); st.State != StateReady {
				t.Fatalf("Inspect = %+v", st)
			}
			// A new worker's driver: once auto has seen a bridge address answer, it lists handles at theirs.
			d2, err := NewDocker(DockerOptions{Client: cli, Image: testImage, Owner: owner, Route: route})
			if err != nil {
				t.Fatal(err)
			}
			if route == RouteAuto {
				d2.answersDirect(ctx, direct)
			}
			hs, err := d2.List(ctx)
			if err != nil || len(hs) != 1 || hs[0].Addr != h.Addr {
				t.Fatalf("List of a new driver = %+v %v, want address %s", hs, err, h.Addr)
			}
		})
	}
}
