package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// TestE2ECLI drives the registry-derived CLI (verbs read from GET /api/registry, sent over tRPC) against a running
// doppel dev: collect tau-retail's traces, envs list, sessions open, call, transcript and close.
func TestE2ECLI(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	s := startE2EStack(t, t.TempDir(), m.Plaintext, e2eFreeAddr(t), e2eFreeAddr(t), e2eFreeAddr(t))
	environ := []string{"DOPPEL_URL=" + s.apiURL, "DOPPEL_KEY=" + s.key}
	doppel := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		err := run(ctx, args, environ, &out, &errb)
		switch {
		case err == nil:
		case errors.As(err, new(usageError)):
			code = 2
		default:
			code = 1
		}
		if err != nil {
			errb.WriteString(err.Error())
		}
		return code, out.String(), errb.String()
	}
	must := func(args ...string) string {
		t.Helper()
		code, out, errs := doppel(args...)
		if code != 0 {
			t.Fatalf("doppel %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
		return out
	}

	if out := must("collect", sampledata.File(t, e2eRetailTraces)); !strings.Contains(out, "collected") {
		t.Fatalf("collect: %s", out)
	}
	const slug = "tau2-retail"
	e2ePoll(t, e2eBuildTimeout, time.Second, "envs get "+slug+" ready", func() (bool, string) {
		var env struct {
			Status string `json:"status"`
		}
		out := must("envs", "get", slug)
		if err := json.Unmarshal([]byte(out), &env); err != nil {
			t.Fatalf("envs get: %v\n%s", err, out)
		}
		if env.Status == "failed" {
			t.Fatalf("build failed: %s", out)
		}
		return env.Status == "ready", env.Status
	})
	var builds []struct {
		ID string `json:"id"`
	}
	if out := must("builds", "list", slug, "--output", "json"); json.Unmarshal([]byte(out), &builds) != nil || len(builds) == 0 {
		t.Fatalf("builds list:\n%s", out)
	}
	if out := must("builds", "get", "--env", slug, builds[0].ID, "--wait"); !strings.Contains(out, `"status": "succeeded"`) {
		t.Fatalf("builds get --wait:\n%s", out)
	}
	if out := must("sessions", "open", "--help"); !strings.Contains(out, "--seed-instructions string") || strings.Contains(out, "--seedInstructions") ||
		strings.Contains(out, s.key) {
		t.Fatalf("sessions open --help:\n%s", out)
	}
	if out := must("envs", "list"); !strings.Contains(out, "SLUG") || !strings.Contains(out, slug) {
		t.Fatalf("envs list is not a table with %s:\n%s", slug, out)
	}

	var opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
		Seed      int64  `json:"seed"`
	}
	out := must("sessions", "open", "--env", slug, "--seed", "42", "--seed-instructions", "2 orders with status pending", "--recordOutputs")
	if err := json.Unmarshal([]byte(out), &opened); err != nil || opened.SessionID == "" || !strings.HasPrefix(opened.Token, "ms_") || opened.Seed != 42 {
		t.Fatalf("sessions open: %v\n%s", err, out)
	}

	// A call that replays a real trace's get_order_details, with the session token.
	data, err := sampledata.Read(e2eRetailTraces)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ingest.Decode(data, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var args string
	for _, tr := range parsed.Batch.Traces {
		for _, c := range trace.Calls(tr) {
			if c.Tool == "get_order_details" && args == "" {
				args = string(c.RawArgs)
			}
		}
	}
	if args == "" {
		t.Fatal("no get_order_details call in the traces")
	}
	out = must("sessions", "call", opened.SessionID, "--name", "get_order_details", "--arguments", args, "--token", opened.Token)
	var called struct {
		Fidelity string `json:"fidelity"`
		Rung     string `json:"rung"`
	}
	if err := json.Unmarshal([]byte(out), &called); err != nil || called.Fidelity == "" || called.Rung == "" {
		t.Fatalf("sessions call: %v\n%s", err, out)
	}
	if out := must("sessions", "transcript", opened.SessionID); !strings.Contains(out, "get_order_details") {
		t.Fatalf("sessions transcript lacks the call:\n%s", out)
	}
	if out := must("sessions", "close", "--session", opened.SessionID); !strings.Contains(out, `"existed": true`) {
		t.Fatalf("sessions close:\n%s", out)
	}

	// Errors: a closed session's token is refused (exit 1, envelope on stderr); a bad flag is exit 2.
	code, _, errs := doppel("sessions", "call", opened.SessionID, "--name", "get_order_details", "--arguments", args, "--token", opened.Token)
	if code != 1 || !strings.Contains(errs, "requestId") {
		t.Fatalf("call after close: exit %d: %s", code, errs)
	}
	if code, _, errs := doppel("sessions", "open", slug, "--seed", "forty-two"); code != 2 {
		t.Fatalf("bad --seed: exit %d: %s", code, errs)
	}
	if code, out, _ := doppel("help"); code != 0 || !strings.Contains(out, "sessions open SLUG") || !strings.Contains(out, "collect") {
		t.Fatalf("help:\n%s", out)
	}
}
