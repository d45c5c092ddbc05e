// Command doppel builds working doubles of AI agents' tool backends from their traces and serves them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/doppel-dev/doppel/cli"
	"github.com/doppel-dev/doppel/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintln(os.Stderr, "doppel:", err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "doppel:", err)
		os.Exit(1)
	}
}

// usageError is a mistake in the command line itself.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// env is what every subcommand gets: its arguments, the process environment and where to write.
type env struct {
	args    []string
	environ []string
	stdout  io.Writer
	stderr  io.Writer
}

type command struct {
	summary string
	run     func(ctx context.Context, e env) error
}

func commands() map[string]command {
	return map[string]command{
		"dev":     {"run everything in one process on embedded defaults (SQLite, local blobs, in-process Temporal)", runDev},
		"serve":   {"run the HTTP API against the configured database, blob store and Temporal", runServe},
		"worker":  {"run the Temporal worker (workflows and activities)", runWorker},
		"twin":    {"run the twin runtime for one bundle (the process inside a twin container)", runTwin},
		"migrate": {"apply database migrations (idempotent, safe to run concurrently)", runMigrate},
		"openapi": {"print the OpenAPI 3.1 document", runOpenAPI},
		"keys":    {"manage workspace keys: keys create|list|revoke", runKeys},
		"usage":   {"show this period's usage: task-minutes and every meter against the plan, with bars", runUsage},
		"collect": {"send trace files (JSON or JSONL) to /api/collect", runCollect},
		"bench":   {"measure the tool plane of a running doppel: session opens and replayed calls, p50/p99 and calls/s", runBench},
		"config":  {"print the configuration reference (keys, env vars, flags, defaults)", runConfig},
		"version": {"print the version", runVersion},
	}
}

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmds := commands()
	e := env{environ: environ, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || (args[0] == "help" && len(args) == 1) {
		usage(stdout, cmds)
		o := verbOptions(e)
		o.HTTP = &http.Client{Timeout: 5 * time.Second}
		if err := cli.VerbHelp(ctx, o, stdout); err != nil {
			fmt.Fprintf(stdout, "\nRegistry verbs (envs, sessions, builds, …) are listed when a doppel API answers: %v\n", err)
		}
		return nil
	}
	if args[0] == "help" { // doppel help <group> [verb]: the command's own --help
		args = append(args[1:len(args):len(args)], "--help")
	}
	c, ok := cmds[args[0]]
	if !ok {
		// Not a local command: a verb of the server's registry (GET /api/registry), sent over tRPC.
		err := cli.RunVerb(ctx, verbOptions(e), args)
		var u *cli.UsageError
		if errors.As(err, &u) {
			return usageError{u.Msg}
		}
		return err
	}
	e.args = args[1:]
	return c.run(ctx, e)
}

// verbOptions are the defaults of a registry verb's --url and --key: DOPPEL_URL, DOPPEL_KEY (or DOPPEL_BOOTSTRAP_KEY).
func verbOptions(e env) cli.VerbOptions {
	o := cli.VerbOptions{URL: config.Lookup(e.environ, "DOPPEL_URL"), Stdout: e.stdout, Stderr: e.stderr,
		Width: terminalWidth(e)}
	for _, n := range []string{"DOPPEL_KEY", "DOPPEL_BOOTSTRAP_KEY"} {
		if o.Key = config.Lookup(e.environ, n); o.Key != "" {
			break
		}
	}
	return o
}

// terminalWidth is the width tables fit: the terminal's when stdout is one, else COLUMNS, else 0 (the default).
func terminalWidth(e env) int {
	if f, ok := e.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 {
			return w
		}
	}
	if n, err := strconv.Atoi(config.Lookup(e.environ, "COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("doppel: working doubles of agents' tool backends, built from their traces.\n\nUsage: doppel <command> [flags]\n       doppel <group> <verb> [args] [flags]   (a verb of the server's registry, e.g. doppel envs list)\n\nLocal commands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-8s %s\n", n, cmds[n].summary)
	}
	b.WriteString("\nRun `doppel <command> --help` for a command's flags; `doppel config` lists every setting.\n")
	fmt.Fprint(w, b.String())
}
