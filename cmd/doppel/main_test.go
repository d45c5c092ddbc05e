package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain lets the test binary stand in for doppel when it is run as `<binary> twin …`: the process driver of an
// in-process dev stack starts twins by re-running its own executable, which under `go test` is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "twin" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "doppel:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
