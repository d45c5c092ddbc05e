package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/pflag"

	"github.com/doppel-dev/doppel/config"
	"github.com/doppel-dev/doppel/telemetry"
)

// errHelp reports that --help was asked for and answered.
var errHelp = errors.New("help shown")

// parseConfig parses a server command's flags (every config key has one) and loads the configuration.
func parseConfig(e env, name string, extra func(*pflag.FlagSet)) (*config.Config, *pflag.FlagSet, error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	config.Flags(fs)
	if extra != nil {
		extra(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: doppel %s [flags]\n\nEvery flag is also a DOPPEL_* variable and a YAML key; see `doppel config`.\n\n%s", name, fs.FlagUsages())
	}
	if err := fs.Parse(e.args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, nil, errHelp
		}
		return nil, nil, usageError{err.Error()}
	}
	cfg, err := config.Load(fs, e.environ)
	if err != nil {
		return nil, nil, err
	}
	applyRuntime(cfg, e.environ)
	return cfg, fs, nil
}

// applyRuntime sets the Go GC target from runtime.gc_percent and the soft memory limit from
// runtime.memory_bytes, each unless the environment set it (GOGC, GOMEMLIMIT).
func applyRuntime(cfg *config.Config, environ []string) {
	gcPercent, memLimit := cfg.Runtime.Effective(environ)
	if gcPercent != 0 {
		debug.SetGCPercent(gcPercent)
	}
	if memLimit != 0 {
		debug.SetMemoryLimit(memLimit)
	}
}

// newLogger builds the process logger from the log.* keys, writing to w through a LogOutput (buffered per
// log.flush_every) that the caller closes last, to write what is buffered.
func newLogger(cfg *config.Config, w *os.File) (*slog.Logger, *telemetry.LogOutput) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.Log.Level)))
	opts := &slog.HandlerOptions{Level: level}
	out := telemetry.NewLogOutput(w, cfg.Log.FlushEvery)
	var h slog.Handler = slog.NewTextHandler(out, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(out, opts)
	}
	// Records logged with a request's context carry its trace and span ids when tracing is on.
	return slog.New(telemetry.LogHandler(telemetry.FlushOnWarn(h, out))), out
}
