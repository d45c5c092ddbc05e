package main

import (
	"slices"
	"testing"

	"github.com/doppel-dev/doppel/config"
)

// A twin's soft memory limit is its own twin.memory_bytes, not the limit of the process that starts it.
func TestTwinEnvMemoryLimit(t *testing.T) {
	cfg, err := config.Load(nil, []string{"DOPPEL_TWIN_MEMORY_BYTES=536870912", "DOPPEL_RUNTIME_MEMORY_BYTES=4294967296"})
	if err != nil {
		t.Fatal(err)
	}
	env := twinEnv(cfg)
	if !slices.Contains(env, "DOPPEL_RUNTIME_MEMORY_BYTES=536870912") {
		t.Errorf("twinEnv = %q, want DOPPEL_RUNTIME_MEMORY_BYTES=536870912", env)
	}
	if !slices.Contains(twinProcessEnv(cfg), "GOMEMLIMIT=536870912") {
		t.Errorf("twinProcessEnv = %q, want GOMEMLIMIT=536870912", twinProcessEnv(cfg))
	}
}
