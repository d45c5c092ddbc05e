// Package twinstate is the one vocabulary of a twin's life: its states, the build it serves, its handle, and the
// wake requests and answers of the twin directory (the TwinWorkflow).
package twinstate

import "time"

// States of an environment's twin (spec §3), as the TwinWorkflow moves it and environment rows record it.
const (
	Stopped = "stopped"
	Booting = "booting"
	Ready   = "ready"
	// Failed: the last start failed; the next wake starts it again.
	Failed = "failed"
)

// Build names the bundle a twin serves.
type Build struct {
	BuildID    string
	BundleKey  string
	BundleHash string
}

// IsZero reports whether no build is named.
func (b Build) IsZero() bool { return b.BuildID == "" }

// Handle identifies a running twin: enough to inspect, reach and stop it, and to recover it after a restart.
type Handle struct {
	Driver    string    `json:"driver"`
	ID        string    `json:"id"`
	EnvID     string    `json:"env_id"`
	BuildID   string    `json:"build_id"`
	Owner     string    `json:"owner,omitempty"`
	Addr      string    `json:"addr"`
	PID       int       `json:"pid,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// Health is what an inspection of a running twin found.
type Health string

// Health values.
const (
	// Starting: running, not ready yet (loading its bundle).
	Starting Health = "starting"
	// Healthy: running and answering ready.
	Healthy Health = "ready"
	// Unhealthy: running but its RPC does not answer.
	Unhealthy Health = "unhealthy"
	// Exited: it ran and stopped or died; the detail says how.
	Exited Health = "exited"
	// Gone: no such twin (removed, or never started by this owner).
	Gone Health = "gone"
)

// Wake asks the twin directory for a build's twin, booting it when it is stopped.
type Wake struct {
	EnvID string
	// WorkspaceID is the environment's workspace (the TwinWorkflow's search attribute when the wake starts it).
	WorkspaceID string
	// Active is the environment's active build; it starts the environment's TwinWorkflow when none runs.
	Active Build
	// Build is the build whose twin is wanted; zero means Active.
	Build Build
	// Suspect is the handle id of a twin the caller could not reach: it is checked and restarted if dead.
	Suspect string
	// Wait answers only once the twin is ready or failed.
	Wait bool
}

// Status is a build's twin as the directory sees it.
type Status struct {
	State    string // Stopped, Booting, Ready or Failed
	Addr     string // when Ready
	BuildID  string
	HandleID string
	// Error and ErrorType say why a failed twin failed (ErrorType is one of the twin activities' error types, such
	// as EngineUnreachable).
	Error     string
	ErrorType string
}

// EngineUnreachable is the ErrorType of a twin whose engine (the Docker engine) does not answer: it can be neither
// inspected nor restarted until the engine is back.
const EngineUnreachable = "TwinEngineUnreachable"
