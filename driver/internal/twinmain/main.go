// Command twinmain runs one twin the way "doppel twin" does (same arguments, same announce line), without the rest
// of doppel linked in: the driver tests' twin binary and image when no doppel binary is given.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "twinmain:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "twin" {
		return errors.New(`usage: twinmain twin --listen ADDR --bundle FILE`)
	}
	fs := flag.NewFlagSet("twin", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	bundle := fs.String("bundle", "", "bundle file")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *bundle == "" {
		return errors.New("--bundle: required")
	}
	return rpc.Serve(ctx, rpc.ServeOptions{
		Listen:   *listen,
		Load:     rpc.BundleFile(*bundle, twin.RuntimeOptions{}),
		Announce: os.Stdout,
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}
