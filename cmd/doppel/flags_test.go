package main

import (
	"slices"
	"testing"

	"github.com/doppel-dev/doppel/config"
)

// The GC target and the soft memory limit come from runtime.gc_percent and runtime.memory_bytes unless the
// environment's GOGC or GOMEMLIMIT set them; a limit of 0 leaves the runtime without one.
func TestRuntimeSettings(t *testing.T) {
	for _, tt := range []struct {
		name    string
		environ []string
		gc      int
		mem     int64
	}{
		{"defaults", nil, 400, 2 << 30},
		{"configured", []string{"DOPPEL_RUNTIME_GC_PERCENT=150", "DOPPEL_RUNTIME_MEMORY_BYTES=1073741824"}, 150, 1 << 30},
		{"no limit", []string{"DOPPEL_RUNTIME_MEMORY_BYTES=0"}, 400, 0},
		{"GOGC wins", []string{"GOGC=50"}, 0, 2 << 30},
		{"GOMEMLIMIT wins", []string{"GOMEMLIMIT=3GiB", "DOPPEL_RUNTIME_MEMORY_BYTES=1073741824"}, 400, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Load(nil, tt.environ)
			if err != nil {
				t.Fatal(err)
			}
			gc, mem := runtimeSettings(cfg, tt.environ)
			if gc != tt.gc || mem != tt.mem {
				t.Errorf("runtimeSettings = %d, %d; want %d, %d", gc, mem, tt.gc, tt.mem)
			}
		})
	}
}

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
