package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cli"
)

func clientFlagSet(e env, name, usage string) (*pflag.FlagSet, *string, *string) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	url, key := clientFlags(fs, e)
	fs.Usage = func() { fmt.Fprintf(e.stderr, "Usage: doppel %s\n\n%s", usage, fs.FlagUsages()) }
	return fs, url, key
}

func parseClient(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return errHelp
		}
		return usageError{err.Error()}
	}
	return nil
}

func runKeys(ctx context.Context, e env) error {
	const usage = "keys create [--name NAME] [--kind workspace|mcp] | keys list | keys revoke KEY_ID"
	if len(e.args) == 0 {
		return usageError{"usage: doppel " + usage}
	}
	verb := e.args[0]
	fs, url, key := clientFlagSet(e, "keys "+verb, usage)
	name := fs.String("name", "cli", "label of the new key (create)")
	kind := fs.String("kind", "workspace", "workspace (mk_live_) or mcp (mcp_at_) (create)")
	switch verb {
	case "-h", "--help", "help":
		fs.Usage()
		return nil
	}
	if err := parseClient(fs, e.args[1:]); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	c, err := newAPIClient(*url, *key)
	if err != nil {
		return err
	}
	switch verb {
	case "create":
		var out api.CreatedKey
		body := map[string]string{"name": *name, "kind": *kind}
		if err := c.do(ctx, http.MethodPost, "/v1/keys", body, &out); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s\n", out.Key)
		fmt.Fprintf(e.stderr, "created %s (%s, %q): the key above is shown once; store it now\n", out.ID, out.Kind, out.Name)
		return nil
	case "list":
		var out []api.KeyInfo
		if err := c.do(ctx, http.MethodGet, "/v1/keys", nil, &out); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tNAME\tPREFIX\tCREATED\tLAST USED\tREVOKED")
		when := func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return t.UTC().Format(time.RFC3339)
		}
		for _, k := range out {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Kind, k.Name, k.Prefix,
				k.CreatedAt.UTC().Format(time.RFC3339), when(k.LastUsedAt), when(k.RevokedAt))
		}
		return tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return usageError{"usage: doppel keys revoke KEY_ID"}
		}
		var out api.KeyInfo
		if err := c.do(ctx, http.MethodDelete, "/v1/keys/"+fs.Arg(0), nil, &out); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "revoked %s (%s)\n", out.ID, out.Prefix)
		return nil
	default:
		return usageError{fmt.Sprintf("unknown keys verb %q; usage: doppel %s", verb, usage)}
	}
}

func runCollect(ctx context.Context, e env) error {
	fs, url, key := clientFlagSet(e, "collect", "collect [flags] FILE... (JSON collect bodies, JSON arrays of traces, or JSONL; - is stdin)")
	project := fs.String("project", "", "project of files that name none (arrays, JSONL); overrides a body's project")
	batch := fs.Int("batch", 50, "traces per POST")
	conc := fs.Int("concurrency", 2, "POSTs in flight at once")
	skip := fs.Bool("skip-invalid", false, "skip traces that break the format instead of stopping")
	if err := parseClient(fs, e.args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return usageError{"usage: doppel collect [flags] FILE..."}
	}
	if *key == "" {
		return usageError{"no workspace key: pass --key or set DOPPEL_KEY"}
	}
	res, err := cli.Collect(ctx, cli.CollectOptions{
		Endpoint: *url, Key: *key, Files: fs.Args(), Project: *project, BatchSize: *batch,
		Concurrency: *conc, SkipInvalid: *skip, Out: e.stderr,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "collected %d traces (%d new, %d already present) in %d batches to %v\n",
		res.Traces, res.Accepted, res.Duplicates, res.Batches, res.Envs)
	return nil
}
