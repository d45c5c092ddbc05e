package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/doppel-dev/doppel/config"
	"github.com/doppel-dev/doppel/internal/osmem"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// runTwin hosts one bundle's sessions over the twin RPC: the process inside a twin container or a child process.
func runTwin(ctx context.Context, e env) error {
	var listen, bundleFile, bundleKey, addrFile *string
	cfg, _, err := parseConfig(e, "twin", func(fs *pflag.FlagSet) {
		listen = fs.String("listen", "127.0.0.1:0", "address the twin RPC listens on (port 0: any free port, announced on stdout)")
		bundleFile = fs.String("bundle", "", "bundle file to serve")
		bundleKey = fs.String("bundle-key", "", "blob key of the bundle to serve (read from the configured blob store)")
		addrFile = fs.String("addr-file", "", "file that receives the bound host:port once listening")
	})
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if (*bundleFile == "") == (*bundleKey == "") {
		return usageError{"twin: give exactly one of --bundle FILE or --bundle-key KEY"}
	}
	logger, logOut := newLogger(cfg, os.Stderr)
	defer logOut.Close()
	logger = logger.With("component", "twin")
	opts, err := twinRuntimeOptions(cfg)
	if err != nil {
		return err
	}
	load := rpc.BundleFile(*bundleFile, opts)
	if *bundleKey != "" {
		blobs, err := openBlobs(ctx, cfg)
		if err != nil {
			return err
		}
		load = rpc.BundleBlob(blobs, *bundleKey, opts)
	}
	return rpc.Serve(ctx, rpc.ServeOptions{
		Listen: *listen, Load: load, AddrFile: *addrFile, Announce: e.stdout, Logger: logger, Memory: memoryReturner(cfg),
	})
}

// memoryReturner is what gives the memory of dropped session worlds back to the OS, at most once per
// runtime.return_memory_every (nil when it is 0: left to the Go runtime).
func memoryReturner(cfg *config.Config) *osmem.Returner {
	if cfg.Runtime.ReturnMemoryEvery <= 0 {
		return nil
	}
	return osmem.New(cfg.Runtime.ReturnMemoryEvery, nil)
}

// seedBudget bounds a model seeding request inside the session-open workflow's 30 s twin call.
const seedBudget = 25 * time.Second

// twinRuntimeOptions gives the twin its simulate rung and model seeding when a model is configured; without one the
// ladder stops at infer and seed instructions go through the twin's own parser only.
func twinRuntimeOptions(cfg *config.Config) (twin.RuntimeOptions, error) {
	var opts twin.RuntimeOptions
	if cfg.Model.BaseURL == "" {
		return opts, nil
	}
	c, err := llm.New(llm.Options{BaseURL: cfg.Model.BaseURL, APIKey: cfg.Model.APIKey, Model: cfg.Model.Name, Timeout: cfg.Model.Timeout})
	if err != nil {
		return opts, fmt.Errorf("model: %w", err)
	}
	opts.Simulator = llm.TwinSimulator{S: llm.NewSimulator(c, nil)}
	opts.Seeder = llm.TwinSeeder{S: llm.NewSeeder(c, nil)}
	opts.SeedBudget = seedBudget
	return opts, nil
}
