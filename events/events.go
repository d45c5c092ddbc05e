// Package events names the events doppel records and delivers to webhooks, and their payloads.
package events

import (
	"slices"
	"strings"
	"time"
)

// Event types. Each is recorded where its change happens, in the change's transaction when it has one.
const (
	// BuildSucceeded: a build finished and became its environment's active build (BuildData).
	BuildSucceeded = "build.succeeded"
	// BuildFailed: a build failed; the previous active build stays (BuildData with error).
	BuildFailed = "build.failed"
	// EnvReady: an environment entered status ready — its first successful build, or one after it had failed
	// with none active (BuildData).
	EnvReady = "env.ready"
	// TwinReady: a twin finished booting and answers (TwinData).
	TwinReady = "twin.ready"
	// TwinStopped: a twin was stopped — idle, replaced by a new build's twin with no sessions left, dead and
	// being restarted, or its environment stopping (TwinData).
	TwinStopped = "twin.stopped"
	// SessionOpened: a session opened (SessionData with seed, world_hash, expires_at).
	SessionOpened = "session.opened"
	// SessionClosed: a session was closed by its caller (SessionData).
	SessionClosed = "session.closed"
	// SessionExpired: a session idle past session.idle was expired by the reaper (SessionData).
	SessionExpired = "session.expired"
	// UsageThreshold: a workspace's period meter (task_minutes, tool_calls, queries, model_tokens) reached 80% or
	// 100% of its plan's limit; once per workspace, period, meter and threshold (UsageData).
	UsageThreshold = "usage.threshold"
	// WebhookTest: sent by webhooks.test to one endpoint only; never recorded for others.
	WebhookTest = "webhook.test"
)

// Types lists the event types an endpoint may subscribe to, in a fixed order.
func Types() []string {
	return []string{BuildSucceeded, BuildFailed, EnvReady, TwinReady, TwinStopped, SessionOpened, SessionClosed,
		SessionExpired, UsageThreshold, WebhookTest}
}

// Known reports whether t is an event type.
func Known(t string) bool { return slices.Contains(Types(), t) }

// Matches reports whether an endpoint whose filter is the comma-separated list filter (empty: all) takes type t.
// A test event goes only where it is sent, so no filter matches it.
func Matches(filter, t string) bool {
	if t == WebhookTest {
		return false
	}
	if filter == "" {
		return true
	}
	for f := range strings.SplitSeq(filter, ",") {
		if f == t {
			return true
		}
	}
	return false
}

// Message is the body of a webhook request: the event's id (also the webhook-id header), type, time and data, as
// Standard Webhooks suggests ({type, timestamp, data}).
type Message struct {
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	Timestamp   time.Time `json:"timestamp"`
	WorkspaceID string    `json:"workspace_id"`
	Data        any       `json:"data"`
}

// BuildData is the data of build.succeeded, build.failed and env.ready.
type BuildData struct {
	EnvID        string  `json:"env_id"`
	Env          string  `json:"env" doc:"Environment slug."`
	BuildID      string  `json:"build_id"`
	BundleHash   string  `json:"bundle_hash,omitempty"`
	CoveredPct   float64 `json:"covered_pct,omitempty"`
	SimulatedPct float64 `json:"simulated_pct,omitempty"`
	Headline     string  `json:"headline,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// TwinData is the data of twin.ready and twin.stopped.
type TwinData struct {
	EnvID   string `json:"env_id"`
	Env     string `json:"env"`
	BuildID string `json:"build_id"`
	// TwinID names the twin (its driver handle); a restarted twin has a new one.
	TwinID string `json:"twin_id"`
}

// SessionData is the data of session.opened, session.closed and session.expired.
type SessionData struct {
	SessionID string     `json:"session_id"`
	EnvID     string     `json:"env_id"`
	Env       string     `json:"env"`
	BuildID   string     `json:"build_id"`
	Seed      *int64     `json:"seed,omitempty"`
	WorldHash string     `json:"world_hash,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// ForkedFrom names the session a fork was forked from (session.opened of a fork).
	ForkedFrom string `json:"forked_from,omitempty"`
}

// TestData is the data of webhook.test.
type TestData struct {
	EndpointID string `json:"endpoint_id"`
	Note       string `json:"note"`
}

// UsageData is a usage.threshold event's payload.
type UsageData struct {
	Meter       string    `json:"meter"`
	Percent     int       `json:"percent"` // 80 or 100
	Used        float64   `json:"used"`
	Limit       float64   `json:"limit"`
	Unit        string    `json:"unit"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
}
