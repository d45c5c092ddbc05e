package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/doppel-dev/doppel/config"
)

func runConfig(_ context.Context, e env) error {
	fmt.Fprintln(e.stdout, "Configuration: defaults, then a YAML file (--config or DOPPEL_CONFIG), then DOPPEL_* variables, then flags.")
	fmt.Fprintln(e.stdout)
	fmt.Fprint(e.stdout, config.Reference())
	return nil
}

func runVersion(_ context.Context, e env) error {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	fmt.Fprintln(e.stdout, "doppel", v)
	return nil
}
