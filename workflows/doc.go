// Package workflows holds doppel's durable orchestration: thin, deterministic Temporal workflows over activities.
package workflows
