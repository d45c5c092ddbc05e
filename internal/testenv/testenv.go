// Package testenv finds the real services integration tests run against, and refuses to let them skip in CI.
package testenv

import (
	"os"
	"testing"
)

// Required reports whether a missing service must fail the test rather than skip it:
// true when DOPPEL_TEST_REQUIRE=1 (set by .ci/run).
func Required() bool { return os.Getenv("DOPPEL_TEST_REQUIRE") == "1" }

func lookup(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	if Required() {
		t.Fatalf("%s is not set but DOPPEL_TEST_REQUIRE=1: the %s test must not be skipped", name, what)
	}
	t.Skipf("%s not set: skipping the real %s test", name, what)
	return ""
}

// Postgres returns the DSN of a real PostgreSQL (DOPPEL_TEST_POSTGRES), or skips.
func Postgres(t testing.TB) string { return lookup(t, "DOPPEL_TEST_POSTGRES", "PostgreSQL") }

// S3 returns the URL of a real MinIO/S3 (DOPPEL_TEST_S3, e.g. http://KEY:SECRET@127.0.0.1:9000/bucket), or skips.
func S3(t testing.TB) string { return lookup(t, "DOPPEL_TEST_S3", "MinIO/S3") }

// Docker returns the Docker host to use (DOPPEL_TEST_DOCKER, e.g. unix:///var/run/docker.sock), or skips.
func Docker(t testing.TB) string { return lookup(t, "DOPPEL_TEST_DOCKER", "Docker") }

// Temporal returns the host:port of a real Temporal frontend (DOPPEL_TEST_TEMPORAL, e.g. the dev server of a
// running `doppel dev`), or skips. Tests must use task queues and workflow ids of their own.
func Temporal(t testing.TB) string { return lookup(t, "DOPPEL_TEST_TEMPORAL", "Temporal") }

// Chromium returns the path of a headless-capable Chromium (DOPPEL_TEST_CHROMIUM, e.g. /usr/bin/chromium from
// Debian's chromium package), or skips.
func Chromium(t testing.TB) string { return lookup(t, "DOPPEL_TEST_CHROMIUM", "headless Chromium") }
