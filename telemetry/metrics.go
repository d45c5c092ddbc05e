// Package telemetry holds a server's Prometheus metrics, its OpenTelemetry tracing and the log handler that ties logs to traces.
package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
)

// Call transports and the rungs that answer calls, as the metrics label them.
var (
	transports = []string{"rest", "trpc", "mcp"}
	rungs      = []struct{ rung, fidelity string }{
		{"provided", "A_executed"}, {"twin", "B_twin"}, {"replay", "B_replayed"}, {"infer", "B_inferred"},
		{"simulate", "B_simulated"},
	}
	stages = []string{"auth", "twin", "journal", "total"}
)

// latencyBuckets span a hot-path call (tens of microseconds) to a slow commit (seconds).
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Metrics is one server's metrics, on a registry of its own. Its methods are safe for concurrent use, and a nil
// *Metrics records nothing. The per-call label children are resolved once, here, so recording a call allocates
// nothing.
type Metrics struct {
	reg *prometheus.Registry

	calls    *prometheus.CounterVec
	callsBy  map[string]map[string]prometheus.Counter // transport → rung → counter
	stage    [4]prometheus.Observer                   // by stages
	builds   *prometheus.CounterVec
	started  prometheus.Counter
	succeed  prometheus.Counter
	failed   prometheus.Counter
	ingest   prometheus.Counter
	commit   prometheus.Observer
	commitN  prometheus.Observer
	commitKO prometheus.Counter
	inflight prometheus.Gauge
	refused  prometheus.Counter
}

// NewMetrics makes a registry holding doppel's metrics and the Go runtime's and process's.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{reg: reg, callsBy: map[string]map[string]prometheus.Counter{}}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "doppel_calls_total",
		Help: "Tool calls answered in sessions, by transport, fidelity label and the rung that answered."},
		[]string{"transport", "fidelity", "rung"})
	for _, tr := range transports {
		m.callsBy[tr] = map[string]prometheus.Counter{}
		for _, r := range rungs {
			m.callsBy[tr][r.rung] = m.calls.WithLabelValues(tr, r.fidelity, r.rung)
		}
	}
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "doppel_call_stage_seconds",
		Help:    "Where a session call's time went in this process: auth (credential), twin (the twin's answer, with the RPC), journal (the durable commit), total (request in to answer ready); the Server-Timing stages.",
		Buckets: latencyBuckets}, []string{"stage"})
	for i, s := range stages {
		m.stage[i] = stage.WithLabelValues(s)
	}
	m.builds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "doppel_builds_total",
		Help: "Environment builds run by this worker: started, succeeded, failed."}, []string{"outcome"})
	m.started, m.succeed, m.failed = m.builds.WithLabelValues("started"), m.builds.WithLabelValues("succeeded"), m.builds.WithLabelValues("failed")
	m.ingest = prometheus.NewCounter(prometheus.CounterOpts{Name: "doppel_ingest_bytes_total",
		Help: "Body bytes of the collect batches accepted."})
	commit := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "doppel_journal_commit_seconds",
		Help: "Time of one group commit of the call journal.", Buckets: latencyBuckets})
	commitN := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "doppel_journal_commit_calls",
		Help: "Calls per group commit of the call journal.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)})
	m.commit, m.commitN = commit, commitN
	m.commitKO = prometheus.NewCounter(prometheus.CounterOpts{Name: "doppel_journal_commit_failures_total",
		Help: "Group commits of the call journal that failed (their calls were not answered)."})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "doppel_request_body_bytes_in_flight",
		Help: "Request-body bytes the API holds now, against api.body_budget_bytes."})
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{Name: "doppel_request_body_refused_total",
		Help: "Requests refused with 503 because the body budget could not hold their body."})
	reg.MustRegister(m.calls, stage, m.builds, m.ingest, commit, commitN, m.commitKO, m.inflight, m.refused)
	return m
}

// Registry is where the metrics are registered; more collectors may be added to it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in Prometheus' text format (GET /metrics).
func (m *Metrics) Handler(log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{log}, Registry: m.reg})
}

// Call records one answered session call and its stage times.
func (m *Metrics) Call(transport, fidelity, rung string, auth, twin, journal, total time.Duration) {
	if m == nil {
		return
	}
	if c, ok := m.callsBy[transport][rung]; ok {
		c.Inc()
	} else {
		m.calls.WithLabelValues(transport, fidelity, rung).Inc()
	}
	m.stage[0].Observe(auth.Seconds())
	m.stage[1].Observe(twin.Seconds())
	m.stage[2].Observe(journal.Seconds())
	m.stage[3].Observe(total.Seconds())
}

// Collected records an accepted collect batch of n body bytes.
func (m *Metrics) Collected(n int64) {
	if m != nil {
		m.ingest.Add(float64(n))
	}
}

// BuildStarted records a build that began running.
func (m *Metrics) BuildStarted() {
	if m != nil {
		m.started.Inc()
	}
}

// BuildFinished records a build that succeeded (ok) or failed.
func (m *Metrics) BuildFinished(ok bool) {
	switch {
	case m == nil:
	case ok:
		m.succeed.Inc()
	default:
		m.failed.Inc()
	}
}

// JournalCommit records one group commit of n calls that took d (failed when err is set).
func (m *Metrics) JournalCommit(n int, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.commit.Observe(d.Seconds())
	m.commitN.Observe(float64(n))
	if err != nil {
		m.commitKO.Inc()
	}
}

// BodyBytesInFlight records the request-body bytes the API holds now.
func (m *Metrics) BodyBytesInFlight(n int64) {
	if m != nil {
		m.inflight.Set(float64(n))
	}
}

// BodyRefused records a request refused for want of body budget.
func (m *Metrics) BodyRefused() {
	if m != nil {
		m.refused.Inc()
	}
}

// States reads the gauges a scrape takes from the metadata database.
type States interface {
	OpenSessions(ctx context.Context) (int64, error)
	TwinStates(ctx context.Context) (map[string]int64, error)
}

// WatchStates adds doppel_sessions_open and doppel_twin_states, read from s at each scrape (bounded by timeout;
// a failed read leaves the gauge out of that scrape and is logged).
func (m *Metrics) WatchStates(s States, timeout time.Duration, log *slog.Logger) {
	m.reg.MustRegister(&statesCollector{s: s, timeout: timeout, log: log,
		open:  prometheus.NewDesc("doppel_sessions_open", "Sessions open now, in every workspace.", nil, nil),
		twins: prometheus.NewDesc("doppel_twin_states", "Environments by the state last recorded for their twin.", []string{"state"}, nil)})
}

type statesCollector struct {
	s           States
	timeout     time.Duration
	log         *slog.Logger
	open, twins *prometheus.Desc
}

func (c *statesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.open; ch <- c.twins }

func (c *statesCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if n, err := c.s.OpenSessions(ctx); err != nil {
		c.log.Warn("metrics: count open sessions", "error", err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(n))
	}
	states, err := c.s.TwinStates(ctx)
	if err != nil {
		c.log.Warn("metrics: count twin states", "error", err)
		return
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(c.twins, prometheus.GaugeValue, float64(n), state)
	}
}

// TemporalHandler is a Temporal SDK metrics handler whose metrics (temporal_*) land in this registry, through
// OpenTelemetry's Prometheus exporter. Close the returned provider when the client is closed.
func (m *Metrics) TemporalHandler(log *slog.Logger) (client.MetricsHandler, *sdkmetric.MeterProvider, error) {
	exp, err := otelprom.New(otelprom.WithRegisterer(m.reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	h := temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter:                mp.Meter("temporal-sdk-go"),
		OnError:              func(err error) { log.Warn("temporal metrics", "error", err) },
		UseMonotonicCounters: true, // the SDK's counters only grow: Prometheus counters (temporal_*_total)
	})
	return h, mp, nil
}

// slogPrinter is promhttp's error log on a slog.Logger.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics: serve", "error", v) }
