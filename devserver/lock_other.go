//go:build !unix

package devserver

// lockDataDir is a no-op where flock is unavailable.
func lockDataDir(string) (func(), error) { return func() {}, nil }
