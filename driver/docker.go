package driver

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/doppel-dev/doppel/twin/rpc"
)

// DockerDriverName is Handle.Driver of twins run as Docker containers.
const DockerDriverName = "docker"

// Labels every twin container carries.
const (
	LabelEnv   = "dev.doppel.env"
	LabelBuild = "dev.doppel.build"
	LabelOwner = "dev.doppel.owner"
)

// TwinPort is the port the twin listens on inside its container.
const TwinPort = 7070

// BundleInContainer is where the bundle is copied in the container.
const BundleInContainer = "/bundle.json"

// ImageBuildHint says how to build the twin image, for errors about a missing one.
const ImageBuildHint = `build it with "task twin-image" (CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/image/doppel ./cmd/doppel && docker build -f docker/twin.Dockerfile -t doppel-twin:dev bin/image)`

// DockerAPI is the part of the Docker engine client (github.com/moby/moby/client.Client) the driver uses.
type DockerAPI interface {
	Ping(ctx context.Context, options client.PingOptions) (client.PingResult, error)
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	CopyToContainer(ctx context.Context, id string, options client.CopyToContainerOptions) (client.CopyToContainerResult, error)
	ContainerStart(ctx context.Context, id string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerInspect(ctx context.Context, id string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerList(ctx context.Context, options client.ContainerListOptions) (client.ContainerListResult, error)
	ContainerLogs(ctx context.Context, id string, options client.ContainerLogsOptions) (client.ContainerLogsResult, error)
	ContainerRemove(ctx context.Context, id string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
}

var _ DockerAPI = (*client.Client)(nil)

// NewDockerClient returns an engine client for host ("unix:///var/run/docker.sock", "tcp://host:2375"; empty means
// DOCKER_HOST or the platform default), negotiating the API version with the engine.
func NewDockerClient(host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	c, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("driver: docker client for %q: %w", host, err)
	}
	return c, nil
}

// DockerOptions configures the Docker driver.
type DockerOptions struct {
	// Client talks to the engine (NewDockerClient). Required.
	Client DockerAPI
	// Host names the engine in error messages.
	Host string
	// Image is the twin image (docker/twin.Dockerfile). Required.
	Image string
	// Owner marks this deployment's containers (label dev.doppel.owner); List and Reconcile touch only these.
	// Required.
	Owner string
	// Blobs resolves Spec.BundleKey.
	Blobs BlobGetter
	// Network, when set, attaches twins to this Docker network and reaches them at their address on it (a worker
	// running in a container on the same network). Otherwise the twin's port is published on PublishIP.
	Network string
	// PublishIP is the host address twin ports are published on (default 127.0.0.1).
	PublishIP string
	// Route is how a twin on the default bridge (no Network) is reached: RoutePublished through its published port
	// (docker-proxy), RouteContainer at its bridge address (the worker must route to it: Linux, same host), or
	// RouteAuto (the default): the bridge address when it answers from this host, else the published port. The
	// port is published in every case, as the fallback.
	Route string
	// MemoryBytes limits each twin container's memory (zero: no limit).
	MemoryBytes int64
	// Env is the twin containers' environment ("KEY=value"), e.g. the DOPPEL_MODEL_* settings of the simulate rung.
	Env []string
	// APITimeout bounds each engine call (default 10s); PingTimeout the first reachability check (default 3s).
	APITimeout  time.Duration
	PingTimeout time.Duration
	// ReadyTimeout bounds Start's wait for ready (zero: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	Logger       *slog.Logger
}

// Routes of DockerOptions.Route.
const (
	RouteAuto      = "auto"
	RoutePublished = "published"
	RouteContainer = "container"
)

// directProbeTimeout bounds RouteAuto's check that a container's bridge address answers from this host.
const directProbeTimeout = 500 * time.Millisecond

// Docker runs twins as labelled containers of the twin image.
type Docker struct {
	opts  DockerOptions
	api   DockerAPI
	probe *http.Client
	log   *slog.Logger
	// direct is RouteAuto's verdict on bridge addresses: directUnknown until a started twin's was probed.
	direct atomic.Int32
}

const (
	directUnknown = iota
	directYes
	directNo
)

var (
	_ Driver     = (*Docker)(nil)
	_ Reconciler = (*Docker)(nil)
)

// NewDocker returns a Docker driver.
func NewDocker(opts DockerOptions) (*Docker, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("driver: docker: Client is required")
	case opts.Image == "":
		return nil, errors.New("driver: docker: Image is required")
	case opts.Owner == "":
		return nil, errors.New("driver: docker: Owner is required")
	}
	if opts.PublishIP == "" {
		opts.PublishIP = "127.0.0.1"
	}
	if _, err := netip.ParseAddr(opts.PublishIP); err != nil {
		return nil, fmt.Errorf("driver: docker: PublishIP: %w", err)
	}
	switch opts.Route {
	case "":
		opts.Route = RouteAuto
	case RouteAuto, RoutePublished, RouteContainer:
	default:
		return nil, fmt.Errorf("driver: docker: Route %q: want %s, %s or %s", opts.Route, RouteAuto, RoutePublished, RouteContainer)
	}
	if opts.APITimeout <= 0 {
		opts.APITimeout = 10 * time.Second
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = 3 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Docker{opts: opts, api: opts.Client, probe: newProbeClient(), log: log}, nil
}

// engineErr classifies an engine call's failure: an engine that does not answer wraps ErrEngineUnreachable.
func (d *Docker) engineErr(what string, err error) error {
	if client.IsErrConnectionFailed(err) || errors.Is(err, context.DeadlineExceeded) || isNetErr(err) {
		host := d.opts.Host
		if host == "" {
			host = "the configured Docker host"
		}
		return fmt.Errorf("%w (%s): %s: %w", ErrEngineUnreachable, host, what, err)
	}
	return fmt.Errorf("driver: docker: %s: %w", what, err)
}

func isNetErr(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || errors.As(err, &ne)
}

func (d *Docker) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.opts.APITimeout)
}

// Ping checks the engine answers, within PingTimeout.
func (d *Docker) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.PingTimeout)
	defer cancel()
	if _, err := d.api.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return d.engineErr("ping", err)
	}
	return nil
}

// Start creates a labelled container of the twin image, copies the bundle in, starts it and waits until it is
// ready. On failure the container is removed.
func (d *Docker) Start(ctx context.Context, spec Spec) (Handle, error) {
	if err := spec.Validate(); err != nil {
		return Handle{}, err
	}
	if err := d.Ping(ctx); err != nil {
		return Handle{}, err
	}
	bundle, err := readBundle(ctx, spec, d.opts.Blobs)
	if err != nil {
		return Handle{}, err
	}
	archive, err := tarFile(strings.TrimPrefix(BundleInContainer, "/"), bundle)
	if err != nil {
		return Handle{}, err
	}

	port := network.MustParsePort(strconv.Itoa(TwinPort) + "/tcp")
	cfg := &container.Config{
		Image:        d.opts.Image,
		Cmd:          []string{"twin", "--listen", "0.0.0.0:" + strconv.Itoa(TwinPort), "--bundle", BundleInContainer},
		User:         "65534:65534",
		Env:          d.opts.Env,
		Labels:       map[string]string{LabelEnv: spec.EnvID, LabelBuild: spec.BuildID, LabelOwner: d.opts.Owner},
		ExposedPorts: network.PortSet{port: {}},
	}
	host := &container.HostConfig{
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges"},
		Resources:   container.Resources{Memory: d.opts.MemoryBytes},
	}
	if d.opts.Network != "" {
		host.NetworkMode = container.NetworkMode(d.opts.Network)
	} else {
		host.PortBindings = network.PortMap{port: {{HostIP: netip.MustParseAddr(d.opts.PublishIP)}}}
	}
	name := "doppel-twin-" + nameSafe(spec.EnvID) + "-" + randomHex(4)

	cctx, cancel := d.call(ctx)
	created, err := d.api.ContainerCreate(cctx, client.ContainerCreateOptions{Config: cfg, HostConfig: host, Name: name})
	cancel()
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return Handle{}, fmt.Errorf("%w: %s is not in the engine (no registry is used): %s: %w", ErrImageMissing, d.opts.Image, ImageBuildHint, err)
		}
		return Handle{}, d.engineErr("create container", err)
	}
	h := Handle{Driver: DockerDriverName, ID: created.ID, EnvID: spec.EnvID, BuildID: spec.BuildID, Owner: d.opts.Owner,
		StartedAt: time.Now().UTC()}
	fail := func(err error) (Handle, error) {
		if logs := d.logTail(context.WithoutCancel(ctx), h.ID); logs != "" {
			err = fmt.Errorf("%w\ntwin log:\n%s", err, logs)
		}
		if rerr := d.Stop(context.WithoutCancel(ctx), h); rerr != nil {
			d.log.Warn("remove failed twin container", "id", h.ID, "err", rerr)
		}
		return Handle{}, err
	}

	cctx, cancel = d.call(ctx)
	_, err = d.api.CopyToContainer(cctx, h.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: bytes.NewReader(archive)})
	cancel()
	if err != nil {
		return fail(d.engineErr("copy the bundle in", err))
	}
	cctx, cancel = d.call(ctx)
	_, err = d.api.ContainerStart(cctx, h.ID, client.ContainerStartOptions{})
	cancel()
	if err != nil {
		return fail(d.engineErr("start container", err))
	}
	addr, direct, err := d.address(ctx, h.ID)
	if err != nil {
		return fail(err)
	}
	h.Addr = addr
	if d.opts.Route == RouteContainer {
		if direct == "" {
			return fail(fmt.Errorf("driver: docker: container %s has no bridge address (twin.docker_route=container)", h.ID))
		}
		h.Addr = direct
	}

	lastCheck := time.Now()
	died := func() error {
		if time.Since(lastCheck) < 100*time.Millisecond {
			return nil
		}
		lastCheck = time.Now()
		st, err := d.Inspect(ctx, h)
		if err != nil {
			return err
		}
		if !st.Running() {
			return fmt.Errorf("container %s: %s", st.State, st.Detail)
		}
		return nil
	}
	if err := waitReady(ctx, d.probe, h.Addr, d.opts.ReadyTimeout, died); err != nil {
		return fail(err)
	}
	if err := checkBundle(ctx, d.probe, h.Addr, spec.BundleHash); err != nil {
		return fail(err)
	}
	if d.opts.Route == RouteAuto && direct != "" && d.answersDirect(ctx, direct) {
		h.Addr = direct
	}
	d.log.Info("twin started", "driver", DockerDriverName, "id", h.ID, "name", name, "env", spec.EnvID, "build", spec.BuildID, "addr", h.Addr)
	return h, nil
}

// address finds the twin's RPC address — its published port, or its IP on Network — and, without Network, its
// bridge address (direct; empty when it has none).
func (d *Docker) address(ctx context.Context, id string) (addr, direct string, err error) {
	cctx, cancel := d.call(ctx)
	res, err := d.api.ContainerInspect(cctx, id, client.ContainerInspectOptions{})
	cancel()
	if err != nil {
		return "", "", d.engineErr("inspect container", err)
	}
	ns := res.Container.NetworkSettings
	if ns == nil {
		return "", "", fmt.Errorf("driver: docker: container %s has no network settings", id)
	}
	if d.opts.Network != "" {
		ep := ns.Networks[d.opts.Network]
		if ep == nil || !ep.IPAddress.IsValid() {
			return "", "", fmt.Errorf("driver: docker: container %s has no address on network %s", id, d.opts.Network)
		}
		return twinURL(ep.IPAddress), "", nil
	}
	direct = bridgeAddr(ns.Networks)
	for _, b := range ns.Ports[network.MustParsePort(strconv.Itoa(TwinPort)+"/tcp")] {
		if b.HostPort != "" {
			return "http://" + net.JoinHostPort(d.reachIP(), b.HostPort), direct, nil
		}
	}
	return "", "", fmt.Errorf("driver: docker: container %s publishes no port for %d/tcp", id, TwinPort)
}

// bridgeAddr is the twin's RPC address on its bridge network ("bridge", else the first by name that has one),
// or "" when it has none.
func bridgeAddr(nets map[string]*network.EndpointSettings) string {
	if ep := nets["bridge"]; ep != nil && ep.IPAddress.IsValid() {
		return twinURL(ep.IPAddress)
	}
	names := make([]string, 0, len(nets))
	for n := range nets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if ep := nets[n]; ep != nil && ep.IPAddress.IsValid() {
			return twinURL(ep.IPAddress)
		}
	}
	return ""
}

func twinURL(ip netip.Addr) string {
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(TwinPort))
}

// answersDirect reports whether a twin's bridge address answers from this host, probing it once per driver (the
// verdict holds for every twin on the bridge) and keeping the answer for handleOf.
func (d *Docker) answersDirect(ctx context.Context, direct string) bool {
	switch d.direct.Load() {
	case directYes:
		return true
	case directNo:
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, directProbeTimeout)
	defer cancel()
	ok := rpc.NewClient(direct, d.probe).Ready(ctx) == nil
	verdict := int32(directNo)
	if ok {
		verdict = directYes
	}
	d.direct.Store(verdict)
	d.log.Info("twin route", "driver", DockerDriverName, "bridge_address_answers", ok)
	return ok
}

// reachIP is the address a published port is reached at: PublishIP, or loopback when that is unspecified.
func (d *Docker) reachIP() string {
	if ip := netip.MustParseAddr(d.opts.PublishIP); ip.IsUnspecified() {
		if ip.Is6() {
			return "::1"
		}
		return "127.0.0.1"
	}
	return d.opts.PublishIP
}

func (d *Docker) logTail(ctx context.Context, id string) string {
	cctx, cancel := d.call(ctx)
	defer cancel()
	rc, err := d.api.ContainerLogs(cctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "30"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var buf bytes.Buffer
	_, _ = stdcopy.StdCopy(&buf, &buf, io.LimitReader(rc, 64<<10))
	return strings.TrimSpace(buf.String())
}

// Inspect reports the container's state and, when it runs, whether the twin answers ready.
func (d *Docker) Inspect(ctx context.Context, h Handle) (Status, error) {
	if h.Driver != DockerDriverName {
		return foreignHandle(h, DockerDriverName), nil
	}
	cctx, cancel := d.call(ctx)
	res, err := d.api.ContainerInspect(cctx, h.ID, client.ContainerInspectOptions{})
	cancel()
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return Status{State: StateGone, Detail: "no container " + h.ID}, nil
		}
		return Status{}, d.engineErr("inspect container", err)
	}
	st := res.Container.State
	if st == nil {
		return Status{State: StateUnhealthy, Detail: "the engine reports no state"}, nil
	}
	if !st.Running || st.Paused || st.Restarting {
		detail := fmt.Sprintf("container %s, exit code %d", st.Status, st.ExitCode)
		if st.OOMKilled {
			detail += ", killed: out of memory"
		}
		if st.Error != "" {
			detail += ": " + st.Error
		}
		return Status{State: StateExited, Detail: detail}, nil
	}
	if h.Addr == "" {
		return Status{State: StateStarting, Detail: "no address yet"}, nil
	}
	return inspectReady(ctx, d.probe, h.Addr), nil
}

// Stop removes the container (killing it). A container already gone is not an error.
func (d *Docker) Stop(ctx context.Context, h Handle) error {
	if h.Driver != DockerDriverName {
		return fmt.Errorf("docker: handle of driver %q: %w", h.Driver, ErrForeignHandle)
	}
	cctx, cancel := d.call(ctx)
	_, err := d.api.ContainerRemove(cctx, h.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	cancel()
	if err != nil && !cerrdefs.IsNotFound(err) {
		return d.engineErr("remove container "+h.ID, err)
	}
	return nil
}

// containers lists this owner's twin containers, running or not.
func (d *Docker) containers(ctx context.Context) ([]container.Summary, error) {
	cctx, cancel := d.call(ctx)
	defer cancel()
	res, err := d.api.ContainerList(cctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", LabelOwner+"="+d.opts.Owner)})
	if err != nil {
		return nil, d.engineErr("list containers", err)
	}
	return res.Items, nil
}

// handleOf derives a listed container's handle, its address by the same route Start chose: on Network, the
// bridge address (RouteContainer, or RouteAuto once it was seen to answer), else the published port.
func (d *Docker) handleOf(c container.Summary) Handle {
	h := Handle{Driver: DockerDriverName, ID: c.ID, EnvID: c.Labels[LabelEnv], BuildID: c.Labels[LabelBuild],
		Owner: c.Labels[LabelOwner], StartedAt: time.Unix(c.Created, 0).UTC()}
	if d.opts.Network != "" {
		if c.NetworkSettings != nil {
			if ep := c.NetworkSettings.Networks[d.opts.Network]; ep != nil && ep.IPAddress.IsValid() {
				h.Addr = twinURL(ep.IPAddress)
			}
		}
		return h
	}
	if c.NetworkSettings != nil && (d.opts.Route == RouteContainer || d.opts.Route == RouteAuto && d.direct.Load() == directYes) {
		if direct := bridgeAddr(c.NetworkSettings.Networks); direct != "" {
			h.Addr = direct
			return h
		}
	}
	for _, p := range c.Ports {
		if p.PrivatePort == TwinPort && p.PublicPort != 0 {
			h.Addr = "http://" + net.JoinHostPort(d.reachIP(), strconv.Itoa(int(p.PublicPort)))
		}
	}
	return h
}

// List returns this owner's running twin containers.
func (d *Docker) List(ctx context.Context) ([]Handle, error) {
	cs, err := d.containers(ctx)
	if err != nil {
		return nil, err
	}
	var out []Handle
	for _, c := range cs {
		if c.State == container.StateRunning {
			out = append(out, d.handleOf(c))
		}
	}
	return out, nil
}

// Reconcile removes this owner's containers that keep rejects (older than grace), and every stopped one.
func (d *Docker) Reconcile(ctx context.Context, keep func(Handle) bool, grace time.Duration) ([]Handle, error) {
	cs, err := d.containers(ctx)
	if err != nil {
		return nil, err
	}
	var removed []Handle
	var errs []error
	for _, c := range cs {
		h := d.handleOf(c)
		running := c.State == container.StateRunning || c.State == container.StateCreated
		if running && ((keep != nil && keep(h)) || time.Since(h.StartedAt) < grace) {
			continue
		}
		if err := d.Stop(ctx, h); err != nil {
			errs = append(errs, err)
			continue
		}
		d.log.Info("reaped twin container", "id", h.ID, "env", h.EnvID, "build", h.BuildID, "state", c.State)
		removed = append(removed, h)
	}
	return removed, errors.Join(errs...)
}

// tarFile returns a tar archive holding one read-only file.
func tarFile(name string, data []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o444, Size: int64(len(data)), Typeflag: tar.TypeReg,
		ModTime: time.Unix(0, 0)}); err != nil {
		return nil, fmt.Errorf("driver: docker: archive bundle: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return nil, fmt.Errorf("driver: docker: archive bundle: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("driver: docker: archive bundle: %w", err)
	}
	return buf.Bytes(), nil
}
