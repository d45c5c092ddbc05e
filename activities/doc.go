// Package activities holds the side effects doppel's workflows call: blob I/O, database writes, builds, twins.
package activities

// ErrTypeBadInput marks an application error that retrying cannot fix (bad traces, bad uploads).
const ErrTypeBadInput = "BadInput"
