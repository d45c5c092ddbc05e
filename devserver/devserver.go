// Package devserver runs an in-process Temporal dev server (SQLite file persistence) with the Temporal Web UI.
package devserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uioptions "github.com/temporalio/ui-server/v2/server/server_options"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
)

// Defaults used by callers that want the familiar Temporal dev-server addresses.
const (
	DefaultFrontendAddr = "127.0.0.1:7233"
	DefaultUIAddr       = "127.0.0.1:8233"
	DefaultNamespace    = "default"
	// DBFile is the SQLite file, under Options.DataDir, that holds all Temporal state.
	DBFile = "temporal.db"
)

const clusterName = "active"

// MaxInFlightUpdates is how many updates one workflow may have in flight on the dev server (Temporal's
// history.maxInFlightUpdates, 10 by default): doppel's session openers take many opens at once.
const MaxInFlightUpdates = 128

// Options configure Start.
type Options struct {
	// DataDir holds the SQLite database (DBFile) and a lock file held while running (one server per DataDir);
	// it is created if missing. Required.
	DataDir string
	// FrontendAddr is the gRPC frontend's host:port; empty means DefaultFrontendAddr, port 0 picks a free port.
	// The host must be an IP address or "localhost".
	FrontendAddr string
	// UIAddr is where the Temporal Web UI listens; empty means no UI, port 0 picks a free port.
	// Start checks the port is free just before the UI binds it; the UI library exits the process if another
	// program takes the port in between, so prefer fixed ports nothing else races for.
	UIAddr string
	// Namespace is registered at start if missing; empty means DefaultNamespace.
	Namespace string
	// SearchAttributes are custom search attributes (name → type) registered on the namespace at start if missing
	// (with a new namespace, or added to an existing one); Start returns once workflows can be listed by them.
	SearchAttributes map[string]enumspb.IndexedValueType
	// Logger receives the server's warnings and errors (lower levels are dropped); nil discards them.
	Logger *slog.Logger
}

// Server is a running dev server.
type Server struct {
	srv          temporal.Server
	ui           *uiserver.Server
	uiDone       chan struct{}
	frontendAddr string
	uiURL        string
	namespace    string
	logLevel     *slog.LevelVar
	unlock       func()
	stopOnce     sync.Once
	stopErr      error
}

var namespaceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$`)

// Start runs the server and returns once its frontend answers DescribeNamespace for the namespace
// (and, with a UI, once the UI answers its health check). ctx bounds the start; cancel it to give up.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.DataDir == "" {
		return nil, errors.New("devserver: DataDir is empty")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if !namespaceRE.MatchString(o.Namespace) {
		return nil, fmt.Errorf("devserver: Namespace %q: use letters, digits, '.', '_' or '-' (up to 255)", o.Namespace)
	}
	if o.FrontendAddr == "" {
		o.FrontendAddr = DefaultFrontendAddr
	}
	feHost, fePort, err := resolveAddr("FrontendAddr", o.FrontendAddr)
	if err != nil {
		return nil, err
	}
	var uiHost string
	var uiPort int
	if o.UIAddr != "" {
		if uiHost, uiPort, err = resolveAddr("UIAddr", o.UIAddr); err != nil {
			return nil, err
		}
	}
	// Warnings and up while running; errors only once stopping, when pollers and dials fail by design.
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	logger := quiet(o.Logger, level)
	own := o.Logger // devserver's own phase timings, at debug level
	if own == nil {
		own = slog.New(slog.DiscardHandler)
	}
	begin := time.Now()

	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("devserver: DataDir: %w", err)
	}
	dbPath, err := filepath.Abs(filepath.Join(o.DataDir, DBFile))
	if err != nil {
		return nil, fmt.Errorf("devserver: DataDir: %w", err)
	}
	unlock, err := lockDataDir(filepath.Dir(dbPath))
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			unlock()
		}
	}()
	sqlConf, err := prepareDB(dbPath, o.Namespace, o.SearchAttributes)
	if err != nil {
		return nil, err
	}
	own.Debug("devserver: database ready", "path", dbPath, "elapsed", time.Since(begin))

	ports, err := freePorts(feHost, 4, fePort, uiPort)
	if err != nil {
		return nil, err
	}
	conf := serverConfig(sqlConf, feHost, fePort, ports)
	srv, err := newTemporal(conf, logger)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("devserver: start temporal: %w", err)
	}
	own.Debug("devserver: temporal services started", "elapsed", time.Since(begin))
	started = true // from here s.Stop releases the lock
	s := &Server{srv: srv, frontendAddr: net.JoinHostPort(feHost, strconv.Itoa(fePort)), namespace: o.Namespace,
		logLevel: level, unlock: unlock}
	if err := waitFrontend(ctx, s.frontendAddr, o.Namespace, logger); err != nil {
		_ = s.Stop()
		return nil, err
	}
	own.Debug("devserver: frontend answers", "addr", s.frontendAddr, "elapsed", time.Since(begin))
	if len(o.SearchAttributes) > 0 {
		if err := addSearchAttributes(ctx, s.frontendAddr, o.Namespace, o.SearchAttributes, logger); err != nil {
			_ = s.Stop()
			return nil, err
		}
		own.Debug("devserver: search attributes registered", "elapsed", time.Since(begin))
	}
	if o.UIAddr != "" {
		if err := s.startUI(ctx, uiHost, uiPort); err != nil {
			_ = s.Stop()
			return nil, err
		}
		own.Debug("devserver: UI answers", "url", s.uiURL, "elapsed", time.Since(begin))
	}
	return s, nil
}

// FrontendAddr returns the frontend's host:port, for client.Options.HostPort.
func (s *Server) FrontendAddr() string { return s.frontendAddr }

// UIURL returns the Web UI's base URL, or "" when the UI is off.
func (s *Server) UIURL() string { return s.uiURL }

// Namespace returns the namespace registered at start.
func (s *Server) Namespace() string { return s.namespace }

// Stop stops the UI and the server. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.logLevel.Set(slog.LevelError)
		if s.ui != nil {
			s.ui.Stop()
			<-s.uiDone
		}
		if err := s.srv.Stop(); err != nil {
			s.stopErr = fmt.Errorf("devserver: stop temporal: %w", err)
		}
		s.unlock()
	})
	return s.stopErr
}

// resolveAddr splits host:port; "localhost" becomes 127.0.0.1 (Temporal binds to IPs), port 0 a free port.
func resolveAddr(field, addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("devserver: %s %q: %w", field, addr, err)
	}
	switch host {
	case "localhost":
		host = "127.0.0.1"
	case "":
		return "", 0, fmt.Errorf("devserver: %s %q: host is empty (use an IP address such as 127.0.0.1)", field, addr)
	}
	if net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("devserver: %s %q: host must be an IP address or localhost", field, addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("devserver: %s %q: port must be 0..65535", field, addr)
	}
	// Claim-and-release: a free port for 0, and a clear error now if a fixed port is taken.
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return "", 0, fmt.Errorf("devserver: %s %q: %w", field, addr, err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return "", 0, fmt.Errorf("devserver: %s %q: %w", field, addr, err)
	}
	return host, port, nil
}

// freePorts returns n distinct free ports on host, none of them in taken.
func freePorts(host string, n int, taken ...int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10*n {
			return nil, fmt.Errorf("devserver: no %d free ports on %s", n, host)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("devserver: find a free port on %s: %w", host, err)
		}
		ls = append(ls, l) // held open until all are chosen, so they differ from each other
		if p := l.Addr().(*net.TCPAddr).Port; !slices.Contains(taken, p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// prepareDB creates the SQLite schema on first use and registers the namespace, with its custom search attributes,
// if missing.
func prepareDB(dbPath, namespace string, attrs map[string]enumspb.IndexedValueType) (*config.SQL, error) {
	sqlConf := func(path string, wal bool) *config.SQL {
		attrs := map[string]string{"mode": "rwc"}
		if wal {
			// WAL: one fsync per commit instead of two, readers do not block the writer.
			attrs["journal_mode"] = "wal"
			attrs["synchronous"] = "normal"
			attrs["busy_timeout"] = "5000"
		}
		return &config.SQL{PluginName: sqliteplugin.PluginName, DatabaseName: path, ConnectAttributes: attrs}
	}
	if _, err := os.Stat(dbPath); errors.Is(err, os.ErrNotExist) {
		// Build the schema in a temp file and rename it into place, so a crash never leaves a half-made DB.
		tmp := dbPath + ".init"
		_ = os.Remove(tmp)
		if err := sqliteschema.SetupSchema(sqlConf(tmp, false)); err != nil {
			_ = os.Remove(tmp)
			return nil, fmt.Errorf("devserver: create temporal schema in %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, dbPath); err != nil {
			return nil, fmt.Errorf("devserver: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("devserver: %w", err)
	}
	conf := sqlConf(dbPath, true)
	ns, err := sqliteschema.NewNamespaceConfig(clusterName, namespace, false, attrs)
	if err != nil {
		return nil, fmt.Errorf("devserver: namespace %q: %w", namespace, err)
	}
	if err := sqliteschema.CreateNamespaces(conf, ns); err != nil {
		return nil, fmt.Errorf("devserver: register namespace %q in %s: %w", namespace, dbPath, err)
	}
	return conf, nil
}

// serverConfig is a single-host cluster: every service in this process, on host, one history shard.
// ports holds free ports for the frontend's HTTP API and the history, matching and worker services.
func serverConfig(sqlConf *config.SQL, host string, fePort int, ports []int) *config.Config {
	hostPort := func(p int) string { return net.JoinHostPort(host, strconv.Itoa(p)) }
	rpc := func(grpc, http int) config.Service {
		return config.Service{RPC: config.RPC{GRPCPort: grpc, HTTPPort: http, BindOnIP: host}}
	}
	var c config.Config
	c.Global.Membership.MaxJoinDuration = 30 * time.Second
	c.Global.Membership.BroadcastAddress = host
	c.Persistence.DefaultStore = "sqlite"
	c.Persistence.VisibilityStore = "sqlite"
	c.Persistence.NumHistoryShards = 1
	c.Persistence.DataStores = map[string]config.DataStore{"sqlite": {SQL: sqlConf}}
	c.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    false,
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {
				Enabled:                true,
				InitialFailoverVersion: 1,
				RPCAddress:             hostPort(fePort),
				HTTPAddress:            hostPort(ports[0]),
			},
		},
	}
	c.DCRedirectionPolicy.Policy = "noop"
	c.Services = map[string]config.Service{
		string(primitives.FrontendService): rpc(fePort, ports[0]),
		string(primitives.HistoryService):  rpc(ports[1], 0),
		string(primitives.MatchingService): rpc(ports[2], 0),
		string(primitives.WorkerService):   rpc(ports[3], 0),
	}
	c.Archival.History.State = "disabled"
	c.Archival.Visibility.State = "disabled"
	c.NamespaceDefaults.Archival.History.State = "disabled"
	c.NamespaceDefaults.Archival.Visibility.State = "disabled"
	c.PublicClient.HostPort = hostPort(fePort)
	return &c
}

func newTemporal(conf *config.Config, logger *slog.Logger) (temporal.Server, error) {
	tl := serverLogger{l: logger}
	authorizer, err := authorization.GetAuthorizerFromConfig(&conf.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("devserver: authorizer: %w", err)
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&conf.Global.Authorization, tl)
	if err != nil {
		return nil, fmt.Errorf("devserver: claim mapper: %w", err)
	}
	host := func(svc primitives.ServiceName) static.Hosts {
		return static.SingleLocalHost(net.JoinHostPort(conf.Global.Membership.BroadcastAddress,
			strconv.Itoa(conf.Services[string(svc)].RPC.GRPCPort)))
	}
	dyn := dynamicconfig.StaticClient{
		// A dev box runs few workflows: cache more of them, and let the UI list freely.
		dynamicconfig.HistoryCacheHostLevelMaxSize.Key():                 8192,
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,
		// A search attribute added to an existing namespace is usable once the namespace caches refresh.
		dynamicconfig.NamespaceCacheRefreshInterval.Key():       time.Second,
		dynamicconfig.WorkflowExecutionMaxInFlightUpdates.Key(): MaxInFlightUpdates,
	}
	srv, err := temporal.NewServer(
		temporal.WithConfig(conf),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService: host(primitives.FrontendService),
			primitives.HistoryService:  host(primitives.HistoryService),
			primitives.MatchingService: host(primitives.MatchingService),
			primitives.WorkerService:   host(primitives.WorkerService),
		}),
		temporal.WithLogger(tl),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dyn),
	)
	if err != nil {
		return nil, fmt.Errorf("devserver: new temporal server: %w", err)
	}
	return srv, nil
}

// waitFrontend polls until the frontend serves DescribeNamespace for namespace.
func waitFrontend(ctx context.Context, addr, namespace string, logger *slog.Logger) error {
	var last error
	for {
		err := describe(ctx, addr, namespace, logger)
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("devserver: frontend %s not ready: %w (last error: %v)", addr, ctx.Err(), last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func describe(ctx context.Context, addr, namespace string, logger *slog.Logger) error {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := client.DialContext(dctx, client.Options{
		HostPort:  addr,
		Namespace: namespace,
		Logger:    sdklog.NewStructuredLogger(logger),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.WorkflowService().DescribeNamespace(dctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace})
	return err
}

func (s *Server) startUI(ctx context.Context, host string, port int) error {
	ui := uiserver.NewServer(uioptions.WithConfigProvider(&uiconfig.Config{
		Host:                host,
		Port:                port,
		TemporalGRPCAddress: s.frontendAddr,
		EnableUI:            true,
		DefaultNamespace:    s.namespace,
		CORS:                uiconfig.CORS{CookieInsecure: true},
		HideLogs:            true,
		DisableNewsFetch:    true,
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Start blocks until Stop; resolveAddr just checked the port is free.
		_ = ui.Start()
	}()
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port))
	hc := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		if err != nil {
			ui.Stop()
			<-done
			return fmt.Errorf("devserver: UI health check: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-ctx.Done():
			ui.Stop()
			<-done
			return fmt.Errorf("devserver: UI on %s not ready: %w", url, ctx.Err())
		case <-done:
			return fmt.Errorf("devserver: UI on %s stopped before answering", url)
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.ui, s.uiDone, s.uiURL = ui, done, url
	return nil
}
