// Package config loads doppel's typed configuration: defaults, then a YAML file, then DOPPEL_* env, then flags.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
)

// FieldError names the configuration key that failed validation.
type FieldError struct {
	Key    string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("config: %s: %s", e.Key, e.Reason) }

// Validate checks every key; the error names each bad key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	oneOf := func(key, v string, allowed ...string) {
		for _, a := range allowed {
			if v == a {
				return
			}
		}
		bad(key, "must be one of %s (got %q)", strings.Join(allowed, ", "), v)
	}
	addr := func(key, v string, optional bool) {
		if v == "" && optional {
			return
		}
		if _, _, err := net.SplitHostPort(v); err != nil {
			bad(key, "must be host:port (got %q)", v)
		}
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			bad(key, "must be a positive duration such as 30s (got %s)", d)
		}
	}

	if c.DataDir == "" {
		bad("data_dir", "must not be empty")
	}
	if c.BootstrapKey != "" {
		if k, err := cred.Parse(c.BootstrapKey); err != nil {
			bad("bootstrap_key", "%v", err)
		} else if k != cred.KindWorkspace {
			bad("bootstrap_key", "must be a workspace key (mk_live_…), not a %s credential", k)
		}
	}
	oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	oneOf("log.format", c.Log.Format, "text", "json")
	if c.Log.FlushEvery < 0 {
		bad("log.flush_every", "must not be negative (0: unbuffered)")
	}
	addr("api.addr", c.API.Addr, false)
	if c.API.PublicURL != "" {
		if u, err := url.Parse(c.API.PublicURL); err != nil || u.Scheme == "" || u.Host == "" {
			bad("api.public_url", "must be an absolute URL (got %q)", c.API.PublicURL)
		}
	}
	oneOf("db.driver", c.DB.Driver, "sqlite", "postgres")
	if c.DB.Driver == "postgres" && c.DB.DSN == "" {
		bad("db.dsn", "is required when db.driver is postgres")
	}
	oneOf("blob.driver", c.Blob.Driver, "local", "s3")
	if c.Blob.Driver == "s3" {
		addr("blob.endpoint", c.Blob.Endpoint, false)
		if c.Blob.Bucket == "" {
			bad("blob.bucket", "is required when blob.driver is s3")
		}
		if c.Blob.AccessKey == "" {
			bad("blob.access_key", "is required when blob.driver is s3")
		}
		if c.Blob.SecretKey == "" {
			bad("blob.secret_key", "is required when blob.driver is s3")
		}
	}
	addr("temporal.address", c.Temporal.Address, true)
	addr("temporal.dev_addr", c.Temporal.DevAddr, false)
	addr("temporal.ui_addr", c.Temporal.UIAddr, true)
	if c.Temporal.Namespace == "" {
		bad("temporal.namespace", "must not be empty")
	}
	if c.Temporal.TaskQueue == "" {
		bad("temporal.task_queue", "must not be empty")
	}
	if c.API.BodyPerCredential < 0 {
		bad("api.body_budget_per_credential_bytes", "must not be negative")
	} else if c.API.BodyPerCredential > 0 && c.API.BodyPerCredential < c.Collect.MaxRequestBytes {
		bad("api.body_budget_per_credential_bytes", "must be at least collect.max_request_bytes (%d)", c.Collect.MaxRequestBytes)
	}
	if c.API.BodyPerAddress < 0 {
		bad("api.body_budget_per_address_bytes", "must not be negative")
	}
	if c.API.BodyMinRate < 0 {
		bad("api.body_min_rate_bytes", "must not be negative")
	}
	if c.API.TRPCMaxBatch < 1 {
		bad("api.trpc_max_batch", "must be at least 1")
	}
	if c.API.BodyBudget < 0 {
		bad("api.body_budget_bytes", "must not be negative")
	} else if c.API.BodyBudget > 0 && c.API.BodyBudget < c.Collect.MaxRequestBytes {
		bad("api.body_budget_bytes", "must be at least collect.max_request_bytes (%d), or 0 for no budget", c.Collect.MaxRequestBytes)
	}
	addr("metrics.addr", c.Metrics.Addr, true)
	addr("metrics.worker_addr", c.Metrics.WorkerAddr, true)
	addr("debug.pprof_addr", c.Debug.PprofAddr, true)
	if c.OTel.Endpoint != "" {
		if u, err := url.Parse(c.OTel.Endpoint); err != nil || u.Scheme == "" || u.Host == "" {
			bad("otel.endpoint", "must be an absolute URL such as http://127.0.0.1:4318 (got %q)", c.OTel.Endpoint)
		}
	}
	if c.OTel.SampleRatio < 0 || c.OTel.SampleRatio > 1 {
		bad("otel.sample_ratio", "must be between 0 and 1 (got %g)", c.OTel.SampleRatio)
	}
	if c.Runtime.MemoryBytes < 0 {
		bad("runtime.memory_bytes", "must not be negative (0: no limit)")
	}
	if c.Runtime.ReturnMemoryEvery < 0 {
		bad("runtime.return_memory_every", "must not be negative")
	}
	if c.Collect.MaxRequestBytes <= 0 {
		bad("collect.max_request_bytes", "must be positive")
	}
	if c.Collect.MaxEnvBytes < c.Collect.MaxRequestBytes {
		bad("collect.max_env_bytes", "must be at least collect.max_request_bytes")
	}
	if c.Collect.RatePerSecond <= 0 {
		bad("collect.rate_per_second", "must be positive")
	}
	if c.Collect.RateBurst < 1 {
		bad("collect.rate_burst", "must be at least 1")
	}
	if c.Collect.RebuildDebounce < 0 {
		bad("collect.rebuild_debounce", "must not be negative")
	}
	positive("otlp.settle", c.OTLP.Settle)
	if strings.TrimSpace(c.OTLP.TaskAttribute) != c.OTLP.TaskAttribute {
		bad("otlp.task_attribute", "must not start or end with white space")
	}
	addr("otlp.grpc_addr", c.OTLP.GRPCAddr, true)
	positive("build.timeout", c.Build.Timeout)
	if c.Twin.Driver != "" {
		oneOf("twin.driver", c.Twin.Driver, "process", "docker", "inproc")
	}
	positive("twin.idle", c.Twin.Idle)
	oneOf("twin.docker_route", c.Twin.Route, "auto", "published", "container")
	if c.Twin.Driver == "docker" && c.Twin.Image == "" {
		bad("twin.image", "is required when twin.driver is docker")
	}
	if c.Twin.Owner == "" {
		bad("twin.owner", "must not be empty")
	}
	positive("twin.wait", c.Twin.Wait)
	if c.Twin.Memory < 0 {
		bad("twin.memory_bytes", "must not be negative")
	}
	positive("session.idle", c.Session.Idle)
	if c.Session.MaxGroup < 1 {
		bad("session.max_group", "must be at least 1")
	}
	positive("webhooks.retry_window", c.Webhooks.RetryWindow)
	positive("webhooks.backoff_initial", c.Webhooks.BackoffInitial)
	positive("webhooks.backoff_max", c.Webhooks.BackoffMax)
	positive("webhooks.attempt_timeout", c.Webhooks.AttemptTimeout)
	positive("webhooks.sweep_every", c.Webhooks.SweepEvery)
	if c.Webhooks.Retention < 0 {
		bad("webhooks.retention", "must not be negative")
	}
	if c.Uploads.MaxFileBytes < 1 {
		bad("uploads.max_file_bytes", "must be at least 1")
	}
	if _, err := c.Webhooks.AllowedCIDRs(); err != nil {
		bad("webhooks.allow_cidrs", "%v", err)
	}
	positive("mcp.token_ttl", c.MCP.TokenTTL)
	positive("mcp.refresh_token_ttl", c.MCP.RefreshTokenTTL)
	if _, err := c.MCP.Origins(); err != nil {
		bad("mcp.allowed_origins", "%v", err)
	}
	if c.Console.Secret != "" && len(c.Console.Secret) < 32 {
		bad("console.secret", "must be at least 32 characters (e.g. openssl rand -hex 32)")
	}
	if c.Console.SessionTTL <= 0 {
		bad("console.session_ttl", "must be positive")
	}
	if c.Admin.Key != "" && len(c.Admin.Key) < 32 {
		bad("admin.key", "must be at least 32 characters (e.g. openssl rand -hex 32)")
	}
	oneOf("usage.period", c.Usage.Period, "month", "day")
	positive("usage.refresh", c.Usage.Refresh)
	if c.Usage.DefaultPlan != "" {
		if _, ok := c.Plans[c.Usage.DefaultPlan]; !ok {
			bad("usage.default_plan", "names no plan under plans (got %q)", c.Usage.DefaultPlan)
		}
	}
	for name, p := range c.Plans {
		key := "plans." + name
		if p.TaskMinutes < 0 || p.ToolCalls < 0 || p.Queries < 0 || p.ModelTokens < 0 || p.OpenSessions < 0 {
			bad(key, "limits must not be negative (0: no limit)")
		}
		for _, e := range p.Entitlements {
			if e != schema.EntitlementMCP && e != schema.EntitlementQuery {
				bad(key+".entitlements", "must hold only mcp and query (got %q)", e)
			}
		}
	}
	if c.Runtime.GCPercent < 1 {
		bad("runtime.gc_percent", "must be at least 1")
	}
	if c.Model.BaseURL != "" {
		if u, err := url.Parse(c.Model.BaseURL); err != nil || u.Scheme == "" || u.Host == "" {
			bad("model.base_url", "must be an absolute URL (got %q)", c.Model.BaseURL)
		}
		if c.Model.Name == "" {
			bad("model.name", "is required when model.base_url is set")
		}
	}
	positive("model.timeout", c.Model.Timeout)
	positive("query.wait", c.Query.Wait)
	positive("query.deadline", c.Query.Deadline)
	if c.Query.MaxSteps < 1 {
		bad("query.max_steps", "must be at least 1")
	}
	if c.Query.Burst < 1 {
		bad("query.burst", "must be at least 1")
	}
	if c.Query.RatePerSecond == 0 {
		bad("query.rate_per_second", "must not be 0 (negative turns the limit off)")
	}
	return errors.Join(errs...)
}
