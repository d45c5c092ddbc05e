// Package config loads doppel's typed configuration: defaults, then a YAML file, then DOPPEL_* env, then flags.
package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/doppel-dev/doppel/usage"
	"github.com/doppel-dev/doppel/webhook"
)

// Config is the whole of doppel's configuration, read once at start and passed down.
type Config struct {
	DataDir      string   `koanf:"data_dir"`
	BootstrapKey string   `koanf:"bootstrap_key"`
	Log          Log      `koanf:"log"`
	API          API      `koanf:"api"`
	DB           DB       `koanf:"db"`
	Blob         Blob     `koanf:"blob"`
	Temporal     Temporal `koanf:"temporal"`
	Collect      Collect  `koanf:"collect"`
	OTLP         OTLP     `koanf:"otlp"`
	Build        Build    `koanf:"build"`
	Twin         Twin     `koanf:"twin"`
	Session      Session  `koanf:"session"`
	MCP          MCP      `koanf:"mcp"`
	Model        Model    `koanf:"model"`
	Query        Query    `koanf:"query"`
	Runtime      Runtime  `koanf:"runtime"`
	Metrics      Metrics  `koanf:"metrics"`
	Debug        Debug    `koanf:"debug"`
	OTel         OTel     `koanf:"otel"`
	Admin        Admin    `koanf:"admin"`
	Console      Console  `koanf:"console"`
	Usage        Usage    `koanf:"usage"`
	// Plans are the plans by name (plans.<name>.task_minutes, …), from the configuration file.
	Plans    map[string]usage.Plan `koanf:"plans"`
	Webhooks Webhooks              `koanf:"webhooks"`
	Uploads  Uploads               `koanf:"uploads"`
}

// Admin configures the admin credential of the admin verbs (workspaces, plans, access).
type Admin struct {
	Key string `koanf:"key"`
}

// Console configures the web console's sessions.
type Console struct {
	// Secret signs web session JWTs; empty: one generated once and kept in the metadata database.
	Secret     string        `koanf:"secret"`
	SessionTTL time.Duration `koanf:"session_ttl"`
}

// Usage configures metering and its enforcement.
type Usage struct {
	Period      string        `koanf:"period"`
	DefaultPlan string        `koanf:"default_plan"`
	Refresh     time.Duration `koanf:"refresh"`
	Enforce     bool          `koanf:"enforce"`
}

// Webhooks configures webhook delivery.
type Webhooks struct {
	AllowCIDRs     string        `koanf:"allow_cidrs"`
	RetryWindow    time.Duration `koanf:"retry_window"`
	BackoffInitial time.Duration `koanf:"backoff_initial"`
	BackoffMax     time.Duration `koanf:"backoff_max"`
	AttemptTimeout time.Duration `koanf:"attempt_timeout"`
	SweepEvery     time.Duration `koanf:"sweep_every"`
	Retention      time.Duration `koanf:"retention"`
}

// Uploads caps POST /api/uploads.
type Uploads struct {
	MaxFileBytes int64 `koanf:"max_file_bytes"`
}

// Metrics configures GET /metrics (Prometheus text format).
type Metrics struct {
	Enabled    bool   `koanf:"enabled"`
	Addr       string `koanf:"addr"`
	WorkerAddr string `koanf:"worker_addr"`
}

// Debug configures diagnostics that are off unless asked for.
type Debug struct {
	// PprofAddr is where net/http/pprof's handlers listen (/debug/pprof/…); empty: nowhere.
	PprofAddr string `koanf:"pprof_addr"`
}

// OTel configures OpenTelemetry tracing; off unless Endpoint or OTEL_EXPORTER_OTLP_ENDPOINT is set.
type OTel struct {
	Endpoint    string  `koanf:"endpoint"`
	ServiceName string  `koanf:"service_name"`
	SampleRatio float64 `koanf:"sample_ratio"`
}

// Runtime tunes the Go runtime of doppel's processes.
type Runtime struct {
	GCPercent int `koanf:"gc_percent"`
	// MemoryBytes is the process's soft memory limit (Go's GOMEMLIMIT); 0: none.
	MemoryBytes       int64         `koanf:"memory_bytes"`
	ReturnMemoryEvery time.Duration `koanf:"return_memory_every"`
}

// Effective answers what a process applies of r: the GC percent and the soft memory limit, 0 for one it leaves as
// the Go runtime has it (set by GOGC or GOMEMLIMIT in environ, or a memory limit of 0: none).
func (r Runtime) Effective(environ []string) (gcPercent int, memLimit int64) {
	gcPercent, memLimit = r.GCPercent, r.MemoryBytes
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOGC=") {
			gcPercent = 0
		}
		if strings.HasPrefix(kv, "GOMEMLIMIT=") {
			memLimit = 0
		}
	}
	return gcPercent, memLimit
}

// Log configures logging.
type Log struct {
	Level      string        `koanf:"level"`
	Format     string        `koanf:"format"`
	FlushEvery time.Duration `koanf:"flush_every"`
}

// API configures the HTTP server.
type API struct {
	Addr       string `koanf:"addr"`
	PublicURL  string `koanf:"public_url"`
	BodyBudget int64  `koanf:"body_budget_bytes"`
	// BodyPerCredential and BodyPerAddress are the shares of the body budget one workspace, and one address
	// without a resolving credential, may hold at once.
	BodyPerCredential int64 `koanf:"body_budget_per_credential_bytes"`
	BodyPerAddress    int64 `koanf:"body_budget_per_address_bytes"`
	// BodyReadGrace and BodyMinRate: after the grace, a body must arrive at BodyMinRate bytes a second on average.
	BodyReadGrace time.Duration `koanf:"body_read_grace"`
	BodyMinRate   int64         `koanf:"body_min_rate_bytes"`
	// ReadHeaderTimeout and IdleTimeout bound a request's headers and a keep-alive connection's wait.
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	IdleTimeout       time.Duration `koanf:"idle_timeout"`
	// FailedCredentialsPerMinute and FailedCredentialBurst budget each address's credentials that do not resolve.
	FailedCredentialsPerMinute float64 `koanf:"failed_credentials_per_minute"`
	FailedCredentialBurst      int     `koanf:"failed_credential_burst"`
	// TRPCMaxBatch caps the procedures of one tRPC batch.
	TRPCMaxBatch int `koanf:"trpc_max_batch"`
}

// DB selects the metadata database.
type DB struct {
	Driver string `koanf:"driver"`
	DSN    string `koanf:"dsn"`
}

// Blob selects the blob store for trace batches and bundles.
type Blob struct {
	Driver    string `koanf:"driver"`
	Dir       string `koanf:"dir"`
	Endpoint  string `koanf:"endpoint"`
	AccessKey string `koanf:"access_key"`
	SecretKey string `koanf:"secret_key"`
	Bucket    string `koanf:"bucket"`
	Region    string `koanf:"region"`
	UseSSL    bool   `koanf:"use_ssl"`
}

// Temporal locates the Temporal frontend (empty Address in dev mode: an in-process dev server).
type Temporal struct {
	Address   string `koanf:"address"`
	Namespace string `koanf:"namespace"`
	TaskQueue string `koanf:"task_queue"`
	DevAddr   string `koanf:"dev_addr"`
	UIAddr    string `koanf:"ui_addr"`
}

// Collect bounds trace ingest.
type Collect struct {
	MaxRequestBytes int64         `koanf:"max_request_bytes"`
	MaxEnvBytes     int64         `koanf:"max_env_bytes"`
	RatePerSecond   float64       `koanf:"rate_per_second"`
	RateBurst       int           `koanf:"rate_burst"`
	RebuildDebounce time.Duration `koanf:"rebuild_debounce"`
}

// OTLP configures OpenTelemetry trace ingest (POST /v1/traces, and OTLP/gRPC when GRPCAddr is set); its caps and
// rate limit are collect's.
type OTLP struct {
	Settle        time.Duration `koanf:"settle"`
	TaskAttribute string        `koanf:"task_attribute"`
	GRPCAddr      string        `koanf:"grpc_addr"`
}

// Build bounds environment builds.
type Build struct {
	Timeout time.Duration `koanf:"timeout"`
}

// Twin selects how twins run and when they stop.
type Twin struct {
	Driver     string        `koanf:"driver"`
	Idle       time.Duration `koanf:"idle"`
	Image      string        `koanf:"image"`
	Binary     string        `koanf:"binary"`
	Owner      string        `koanf:"owner"`
	DockerHost string        `koanf:"docker_host"`
	Network    string        `koanf:"docker_network"`
	Route      string        `koanf:"docker_route"`
	Memory     int64         `koanf:"memory_bytes"`
	Wait       time.Duration `koanf:"wait"`
}

// Session bounds sessions.
type Session struct {
	Idle time.Duration `koanf:"idle"`
	// MaxGroup is the most sessions one group open or group fork (`n`) makes.
	MaxGroup int `koanf:"max_group"`
}

// MCP configures the MCP server and its OAuth.
type MCP struct {
	// TokenTTL is how long an mcp_at_ token issued through OAuth lives.
	TokenTTL time.Duration `koanf:"token_ttl"`
	// RefreshTokenTTL is how long an OAuth refresh token lives (each refresh issues a new one).
	RefreshTokenTTL time.Duration `koanf:"refresh_token_ttl"`
	// AllowedOrigins lists, comma-separated, the browser origins besides api.public_url's that may call the MCP
	// server.
	AllowedOrigins string `koanf:"allowed_origins"`
}

// Origins parses mcp.allowed_origins: each an origin scheme://host[:port], without a path.
func (m MCP) Origins() ([]string, error) {
	var out []string
	for _, o := range strings.Split(m.AllowedOrigins, ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
			u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("%q is not an origin: want scheme://host[:port], e.g. http://localhost:6274", o)
		}
		out = append(out, u.Scheme+"://"+u.Host)
	}
	return out, nil
}

// Model is the OpenAI-compatible chat endpoint behind the simulate rung and seeding; empty BaseURL means none.
type Model struct {
	BaseURL string        `koanf:"base_url"`
	APIKey  string        `koanf:"api_key"`
	Name    string        `koanf:"name"`
	Timeout time.Duration `koanf:"timeout"`
}

// Query bounds one-shot queries (POST /v1/envs/{slug}/query).
type Query struct {
	RatePerSecond float64       `koanf:"rate_per_second"`
	Burst         int           `koanf:"burst"`
	Wait          time.Duration `koanf:"wait"`
	MaxSteps      int           `koanf:"max_steps"`
	Deadline      time.Duration `koanf:"deadline"`
}

// Key describes one configuration key: its dotted name, default and meaning.
type Key struct {
	Name    string
	Default any
	Help    string
}

// Env is the key's environment variable name.
func (k Key) Env() string { return "DOPPEL_" + strings.ToUpper(strings.ReplaceAll(k.Name, ".", "_")) }

// Flag is the key's command-line flag name.
func (k Key) Flag() string {
	return strings.ReplaceAll(strings.ReplaceAll(k.Name, ".", "-"), "_", "-")
}

// Keys lists every configuration key with its default, in documentation order.
func Keys() []Key {
	return []Key{
		{"data_dir", "./doppel-data", "directory for embedded state: SQLite metadata, local blobs, the dev Temporal database"},
		{"bootstrap_key", "", "fixes the first workspace key (mk_live_…) so scripts can use it; empty: minted once and printed"},
		{"log.level", "info", "debug, info, warn or error"},
		{"log.format", "text", "text or json"},
		{"log.flush_every", 100 * time.Millisecond, "info and debug lines (one a request) are buffered and written at least this often, or when 64 KiB gather; a warning or error writes at once with what is buffered (a crash loses at most that long of info lines); 0: each line written as it comes (a line then costs about 3.5× the CPU, a write(2) each: 7.7 µs instead of 2.2 µs to a file, of a session call's ~150 µs at the API's peak)"},
		{"api.addr", "127.0.0.1:8080", "address the HTTP API listens on"},
		{"api.public_url", "", "URL clients reach the API at (printed, used in links); empty: derived from api.addr"},
		{"api.body_budget_bytes", int64(256 << 20), "most request-body bytes the API holds at once over all requests (collect, builds, REST and tRPC bodies); a request over it answers 503 with Retry-After; 0: no budget"},
		{"api.body_budget_per_credential_bytes", int64(64 << 20), "most request-body bytes the requests of one workspace (any of its credentials) hold at once; over it: 429 with Retry-After, or 413 for one body larger than it"},
		{"api.body_budget_per_address_bytes", int64(1 << 20), "most request-body bytes the requests of one client address hold at once while they carry no credential that resolves (OAuth, console sign-in); over it: 429 with Retry-After, or 413 for one body larger than it"},
		{"api.body_read_grace", "10s", "how long a request body may take before api.body_min_rate_bytes applies to it"},
		{"api.body_min_rate_bytes", int64(16 << 10), "least average rate, in bytes a second, a request body must arrive at once api.body_read_grace has passed; a slower one answers 408 and its connection closes; 0: no minimum"},
		{"api.read_header_timeout", "10s", "longest a request's headers may take to arrive; the connection closes after it"},
		{"api.idle_timeout", "60s", "a keep-alive connection (HTTP, or OTLP/gRPC) that sends no next request for this long is closed; streams in flight (MCP SSE, streamed tRPC batches) are not cut by it"},
		{"api.failed_credentials_per_minute", 30.0, "credentials that do not resolve allowed per client address a minute, on every route (REST, tRPC, MCP, /oauth/authorize); past api.failed_credential_burst every credential from that address answers 429 with Retry-After; negative: no limit"},
		{"api.failed_credential_burst", 30, "burst of failed credentials allowed per client address before api.failed_credentials_per_minute applies"},
		{"api.trpc_max_batch", 100, "most procedures in one tRPC batch; a larger batch answers 413 PAYLOAD_TOO_LARGE before any runs"},
		{"db.driver", "sqlite", "metadata database: sqlite (embedded) or postgres"},
		{"db.dsn", "", "database DSN; empty with sqlite: <data_dir>/doppel.db"},
		{"blob.driver", "local", "blob store: local (a directory) or s3 (MinIO or any S3)"},
		{"blob.dir", "", "local blob directory; empty: <data_dir>/blobs"},
		{"blob.endpoint", "", "S3 endpoint host:port (blob.driver=s3)"},
		{"blob.access_key", "", "S3 access key"},
		{"blob.secret_key", "", "S3 secret key"},
		{"blob.bucket", "doppel", "S3 bucket (created if missing)"},
		{"blob.region", "", "S3 region"},
		{"blob.use_ssl", false, "use TLS to reach the S3 endpoint"},
		{"temporal.address", "", "Temporal frontend host:port; empty in `doppel dev`: an in-process dev server"},
		{"temporal.namespace", "default", "Temporal namespace"},
		{"temporal.task_queue", "doppel", "task queue the worker polls"},
		{"temporal.dev_addr", "127.0.0.1:7233", "frontend address of the in-process dev server (doppel dev)"},
		{"temporal.ui_addr", "127.0.0.1:8233", "Temporal Web UI address in doppel dev; empty: no UI"},
		{"collect.max_request_bytes", int64(32 << 20), "largest collect request body in bytes (413 above)"},
		{"collect.max_env_bytes", int64(4 << 30), "most collected bytes per environment (413 above)"},
		{"collect.rate_per_second", 50.0, "collect requests per second allowed per client address (429 above)"},
		{"collect.rate_burst", 100, "burst of collect requests allowed per client address"},
		{"collect.rebuild_debounce", "30s", "quiet time after the last collected batch before an environment rebuilds"},
		{"otlp.settle", "1m", "OTLP spans: a conversation becomes a trace once none of its spans arrived for this long; a later span makes a new version of it"},
		{"otlp.task_attribute", "doppel.task", "OTLP spans: the span attribute naming a trace's task (task-N or N); it leads the trace id so the self-check holds a task's trials out together"},
		{"otlp.grpc_addr", "", "address OTLP/gRPC trace export listens on (e.g. 127.0.0.1:4317); empty: off (OTLP/HTTP is served at /v1/traces on api.addr)"},
		{"build.timeout", "30m", "longest an environment build may run"},
		{"twin.driver", "", "how twins run: inproc (in this process, reached without HTTP), process (child processes) or docker; empty: inproc in `doppel dev`, process elsewhere"},
		{"twin.idle", "15m", "idle time after which a twin stops"},
		{"twin.image", "doppel-twin:dev", "Docker image of the twin (twin.driver=docker)"},
		{"twin.binary", "", "doppel binary the process driver launches; empty: this executable"},
		{"twin.owner", "doppel", "names this deployment's twins (container label dev.doppel.owner); the reaper removes only its own"},
		{"twin.docker_host", "", "Docker engine address for twin.driver=docker; empty: DOCKER_HOST or the local socket"},
		{"twin.docker_network", "", "Docker network twins join, for a worker that itself runs in a container on it; empty: ports published on loopback"},
		{"twin.docker_route", "auto", "how Docker twins on the default bridge are reached: container (their bridge address, no docker-proxy), published (their loopback port) or auto (the bridge address when it answers from the worker's host, else the port)"},
		{"twin.memory_bytes", int64(1 << 30), "memory limit of one twin: a hard cgroup limit for Docker twins, and the soft limit (GOMEMLIMIT) of every twin's Go runtime; 0: none"},
		{"twin.wait", "2m", "longest a session open waits for a cold twin"},
		{"session.idle", "1h", "idle time after which a session expires"},
		{"session.max_group", 256, "most sessions one group open or group fork (sessions.open or sessions.fork with n) makes; a larger n is refused naming body.n"},
		{"mcp.token_ttl", "1h", "lifetime of an MCP access token (mcp_at_) issued through OAuth at /oauth/token"},
		{"mcp.refresh_token_ttl", "720h", "lifetime of an OAuth refresh token (mcp_rt_); each refresh rotates it and issues a new one with this lifetime, so a client used at least this often is not sent back to the browser"},
		{"mcp.allowed_origins", "", "comma-separated browser origins (scheme://host[:port]) besides api.public_url's that may call /mcp and /mcp/envs/*; a request with another Origin header is refused 403, one without Origin (a non-browser client) is let through; e.g. http://localhost:6274 for the MCP Inspector"},
		{"model.base_url", "", "OpenAI-compatible chat endpoint for the simulate rung and seeding; empty: none"},
		{"model.api_key", "", "API key for model.base_url"},
		{"model.name", "", "model name sent to model.base_url"},
		{"model.timeout", "30s", "time limit of one model request"},
		{"query.rate_per_second", 1.0, "query requests a workspace may make per second, on average (token bucket); negative: no limit"},
		{"query.burst", 10, "query requests a workspace may make at once before query.rate_per_second applies"},
		{"query.wait", "60s", "longest a query request waits for the result before answering 202 with the id to poll"},
		{"query.max_steps", 30, "most model turns (or replayed calls) one query runs"},
		{"query.deadline", "5m", "longest one query's agent loop runs"},
		{"runtime.gc_percent", 400, "Go GC target (as GOGC) of doppel's processes and the twins they start: above Go's 100 it trades memory for fewer collections, which stall tool calls; GOGC in the environment wins"},
		{"runtime.memory_bytes", int64(1920 << 20), "soft memory limit of doppel's own process (as GOMEMLIMIT): near it the Go runtime collects more often instead of letting the heap grow to gc_percent's target, so a large build's heap stays near its live size (a 100,000-trace build stays under 2 GiB: the default leaves 128 MiB of it for what the collector lets past the limit while it marks); a live heap past it costs up to half the CPU in collection, so raise it for larger worlds; twins get twin.memory_bytes instead; 0: none; GOMEMLIMIT in the environment wins"},
		{"runtime.return_memory_every", "10s", "after large request bodies (1 MiB and up) finish, and after twins drop session worlds (closes, expiry), free memory is returned to the OS at most this often; 0: left to the Go runtime"},
		{"metrics.enabled", true, "serve Prometheus metrics at GET /metrics (unauthenticated) and record them"},
		{"metrics.addr", "", "address of a listener of its own for GET /metrics; empty: the API listener serves it (`doppel worker`, which has none, uses metrics.worker_addr)"},
		{"metrics.worker_addr", "127.0.0.1:9464", "where `doppel worker` serves GET /metrics when metrics.addr is empty; empty: nowhere"},
		{"debug.pprof_addr", "", "address of a listener of its own serving Go's profiles at /debug/pprof/ (CPU, heap, goroutines; unauthenticated: keep it on loopback); empty: off"},
		{"otel.endpoint", "", "OTLP/HTTP base URL spans are sent to (<endpoint>/v1/traces), e.g. http://127.0.0.1:4318; empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing"},
		{"otel.service_name", "doppel", "service.name of this process's spans"},
		{"otel.sample_ratio", 1.0, "share of new traces recorded (0 to 1); requests with a sampled traceparent are always recorded"},
		{"admin.key", "", "the admin credential: the admin verbs (admin.workspaces.*) take it and nothing else; at least 32 characters; empty: admin verbs refuse everyone"},
		{"console.secret", "", "HMAC key signing the console's web session JWTs, at least 32 characters; empty: a random key generated once and kept in the metadata database, so restarts and every API process keep sessions valid"},
		{"console.session_ttl", "12h", "how long a console sign-in lasts"},
		{"usage.period", "month", "metering period: month (calendar month, UTC) or day (calendar day, UTC)"},
		{"usage.default_plan", "", "plan of workspaces that name none (plans are set in the configuration file under plans.<name>); empty: no limits"},
		{"usage.refresh", "1s", "how stale the enforcement's reading of a workspace's meters may grow before it is read again"},
		{"usage.enforce", true, "refuse opens and calls past the plan's limits (402); false: meter only"},
		{"webhooks.allow_cidrs", "", "comma-separated CIDRs webhook URLs may reach beyond public addresses (e.g. 127.0.0.0/8 for a receiver on this machine); empty: loopback, private, link-local and metadata addresses are refused"},
		{"webhooks.retry_window", "24h", "how long a webhook delivery is retried (exponential backoff) before it is marked failed"},
		{"webhooks.backoff_initial", "5s", "wait before a webhook delivery's second attempt; it doubles after each failure"},
		{"webhooks.backoff_max", "1h", "longest wait between two attempts of a webhook delivery"},
		{"webhooks.attempt_timeout", "15s", "time limit of one webhook POST"},
		{"webhooks.sweep_every", "10s", "how often deliveries recorded but never started (their process died first) are started"},
		{"webhooks.retention", "720h", "how long events and their delivery logs are kept (GET /v1/events, webhooks.deliveries); events with a delivery still pending stay; 0: for ever"},
		{"uploads.max_file_bytes", int64(32 << 20), "largest file POST /api/uploads stores (413 above)"},
	}
}

// Flags registers a flag for every key on fs, plus --config.
func Flags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML configuration file")
	for _, k := range Keys() {
		// pflag takes a `quoted` word of the help for the flag's value type; the help quotes commands that way.
		help := strings.ReplaceAll(k.Help, "`", "'")
		switch d := k.Default.(type) {
		case bool:
			fs.Bool(k.Flag(), d, help)
		case int:
			fs.Int(k.Flag(), d, help)
		case int64:
			fs.Int64(k.Flag(), d, help)
		case float64:
			fs.Float64(k.Flag(), d, help)
		default:
			fs.String(k.Flag(), fmt.Sprint(d), help)
		}
	}
}

// Load reads the configuration: defaults, then the file named by --config (or DOPPEL_CONFIG), then DOPPEL_*
// variables from environ, then flags set on fs. It validates the result; errors name the bad key.
func Load(fs *pflag.FlagSet, environ []string) (*Config, error) {
	k := koanf.New(".")
	defaults := map[string]any{}
	byEnv := map[string]string{}
	byFlag := map[string]string{}
	for _, key := range Keys() {
		defaults[key.Name] = key.Default
		byEnv[key.Env()] = key.Name
		byFlag[key.Flag()] = key.Name
	}
	if err := k.Load(confmap.Provider(defaults, "."), nil); err != nil {
		return nil, fmt.Errorf("config: defaults: %w", err)
	}

	path := Lookup(environ, "DOPPEL_CONFIG")
	if fs != nil {
		if f := fs.Lookup("config"); f != nil && f.Changed {
			path = f.Value.String()
		}
	}
	if path != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
			return nil, fmt.Errorf("config: file %s: %w", path, err)
		}
		for _, name := range fk.Keys() {
			if _, ok := defaults[name]; !ok && !planKey(name) {
				return nil, fmt.Errorf("config: file %s: unknown key %q", path, name)
			}
		}
		if err := k.Merge(fk); err != nil {
			return nil, fmt.Errorf("config: file %s: %w", path, err)
		}
	}

	envProvider := env.Provider(".", env.Opt{
		Prefix:      "DOPPEL_",
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, v string) (string, any) {
			return byEnv[name], v // unknown DOPPEL_* names (e.g. DOPPEL_TEST_*) map to "" and are ignored
		},
	})
	if err := k.Load(envProvider, nil); err != nil {
		return nil, fmt.Errorf("config: environment: %w", err)
	}

	if fs != nil {
		flags := posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			name, ok := byFlag[f.Name]
			if !ok || !f.Changed {
				return "", nil
			}
			return name, posflag.FlagVal(fs, f)
		})
		if err := k.Load(flags, nil); err != nil {
			return nil, fmt.Errorf("config: flags: %w", err)
		}
	}

	var c Config
	if err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{Tag: "koanf"}); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c.fill()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// planKey reports whether a file key sets a plan field: plans.<name>.<field>.
func planKey(name string) bool {
	rest, ok := strings.CutPrefix(name, "plans.")
	if !ok {
		return false
	}
	_, field, ok := strings.Cut(rest, ".")
	return ok && slices.Contains(planFields(), field)
}

// planFields are usage.Plan's koanf names, read from the struct so that a field added there is a key here too.
func planFields() []string {
	t := reflect.TypeFor[usage.Plan]()
	fields := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		if name := f.Tag.Get("koanf"); name != "" {
			fields = append(fields, name)
		}
	}
	return fields
}

// Lookup returns the value of the variable name in environ (os.Environ's form), "" when it is not set.
func Lookup(environ []string, name string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// fill derives defaults that depend on other keys.
func (c *Config) fill() {
	if c.DB.Driver == "sqlite" && c.DB.DSN == "" {
		c.DB.DSN = "file:" + filepath.Join(c.DataDir, "doppel.db")
	}
	if c.Blob.Driver == "local" && c.Blob.Dir == "" {
		c.Blob.Dir = filepath.Join(c.DataDir, "blobs")
	}
	if c.API.PublicURL == "" {
		host, port, err := net.SplitHostPort(c.API.Addr)
		if err == nil {
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "127.0.0.1"
			}
			c.API.PublicURL = "http://" + net.JoinHostPort(host, port)
		}
	}
}

// Reference renders the configuration keys as a Markdown table (for docs/configuration.md and `doppel config`).
func Reference() string {
	var b strings.Builder
	b.WriteString("| key | env | flag | default | meaning |\n|---|---|---|---|---|\n")
	for _, k := range Keys() {
		fmt.Fprintf(&b, "| `%s` | `%s` | `--%s` | `%v` | %s |\n", k.Name, k.Env(), k.Flag(), k.Default, k.Help)
	}
	return b.String()
}

// AllowedCIDRs parses webhooks.allow_cidrs.
func (w Webhooks) AllowedCIDRs() ([]netip.Prefix, error) {
	return webhook.ParseCIDRs(strings.Split(w.AllowCIDRs, ","))
}
