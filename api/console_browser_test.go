package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/usage"
)

// consoleEnv serves the tau-retail twin (built from tau-retail-dev.json) with the session, build, wake and query
// routes, its active build carrying the inference report and the leave-one-out self-check, as a build leaves them.
func consoleEnv(t *testing.T) (*plane, string) {
	t.Helper()
	bundle, traces := retailBundle(t)
	reports, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wake := &api.WakeRoutes{}
	builds := &api.BuildRoutes{Blobs: reports}
	plans := &usage.Plans{Default: "team", ByName: map[string]usage.Plan{"team": {TaskMinutes: 600, ToolCalls: 10000, OpenSessions: 20}}}
	p := newPlane(t, schema.DriverSQLite, bundle, planeOptions{local: true, plans: plans,
		routes: []func(huma.API, *api.Deps){builds.Register, wake.Register}})
	wake.Plane = p.tp
	ctx := context.Background()
	put := func(prefix string, v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		key, err := blob.PutContent(ctx, reports, prefix, data, "application/json")
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	if err := reports.Put(ctx, p.build.BundleKey, bytes.NewReader(bundle), int64(len(bundle)), ""); err != nil {
		t.Fatal(err)
	}
	defs := retailToolDefs(t)
	_, rep, err := infer.Build(traces, infer.Options{Tools: defs})
	if err != nil {
		t.Fatal(err)
	}
	chk, err := infer.SelfCheck(traces, infer.Options{Tools: defs})
	if err != nil {
		t.Fatal(err)
	}
	fig := schema.BuildFigures{
		Inferred: schema.InferredFigures{BundleKey: p.build.BundleKey, BundleHash: p.build.BundleHash, ReportKey: put("reports/build/", rep),
			NTools: len(rep.Tools), SchemaSource: rep.SchemaSource, CoveredPct: rep.CoveredPct, SimulatedPct: rep.SimulatedPct, Headline: rep.Headline},
		SelfCheck: schema.SelfCheckFigures{ReportKey: put("reports/selfcheck/", chk), AgreementPct: chk.AgreementPct, Calls: chk.Calls},
	}
	raw, _ := json.Marshal(fig)
	done := schema.Now()
	p.build.Report, p.build.ReportKey, p.build.Stage, p.build.Progress, p.build.FinishedAt = raw, fig.SelfCheck.ReportKey, "succeeded", 1, &done
	if err := store.UpdateBuild(ctx, p.db, p.build, "report", "report_key", "stage", "progress", "finished_at"); err != nil {
		t.Fatal(err)
	}
	p.env.NTraces, p.env.NTools, p.env.SchemaSource = int64(len(traces)), int64(len(rep.Tools)), rep.SchemaSource
	p.env.CoveredPct, p.env.SimulatedPct, p.env.Headline = rep.CoveredPct, rep.SimulatedPct, rep.Headline
	if err := store.UpdateEnv(ctx, p.db, p.env, "n_traces", "n_tools", "schema_source", "covered_pct", "simulated_pct", "headline"); err != nil {
		t.Fatal(err)
	}
	return p, firstArg(traces, "get_user_details", "user_id")
}

func retailToolDefs(t *testing.T) []infer.ToolDef {
	t.Helper()
	raw, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	defs, err := infer.ParseToolDefs(raw)
	if err != nil {
		t.Fatal(err)
	}
	return defs
}

// firstArg is the value of arg in the first recorded call of tool.
func firstArg(traces []trace.Trace, tool, arg string) string {
	for _, tr := range traces {
		for _, m := range tr.Messages {
			for _, c := range m.ToolCalls {
				if c.Function.Name != tool {
					continue
				}
				var args map[string]any
				if json.Unmarshal([]byte(c.Function.Arguments), &args) == nil {
					if s, ok := args[arg].(string); ok {
						return s
					}
				}
			}
		}
	}
	return ""
}

// TestConsoleInBrowser drives real headless Chromium (DOPPEL_TEST_CHROMIUM) through the console: sign in with the
// workspace key (keyboard only) → environments → the environment (report, tools, sessions) → open a seeded session →
// call get_user_details from the form generated from its input schema → the transcript shows the call with its
// fidelity → close; then the environment page at 390 px wide. Any browser console error, uncaught exception or failed
// request fails it. Screenshots go to DOPPEL_TEST_ARTIFACTS (default: the test's temp dir).
func TestConsoleInBrowser(t *testing.T) {
	bin := testenv.Chromium(t)
	p, userID := consoleEnv(t)
	if userID == "" {
		t.Fatal("no recorded get_user_details call in tau-retail-dev.json")
	}
	srv := httptest.NewServer(p.h)
	t.Cleanup(srv.Close)
	// A rebuild in flight: the environment page polls the build history while it runs.
	live := &schema.Build{EnvID: p.env.ID, Status: schema.BuildRunning, Stage: "self-checking", Progress: 0.6}
	if err := store.CreateBuild(context.Background(), p.db, live); err != nil {
		t.Fatal(err)
	}
	liveRow := `[aria-label="Builds"] tbody tr:has(code[data-id="` + live.ID + `"])`

	ctx, console := browser(t, bin)
	dir := artifacts(t)
	tctx, cancel := context.WithTimeout(ctx, 4*time.Minute) // a guard, not a measure: a busy 2-core machine makes Chromium slow
	defer cancel()
	shot := func(name string) {
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(90))
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Error(err)
		}
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#signin #key`))); err != nil {
		t.Fatalf("load /: %v", err)
	}
	envLink := `a.envlink[href="#/env/` + p.env.Slug + `"]`
	steps := []struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{
		{"focus the key field", chromedp.Focus(chromedp.CSS(`#key`))},
		{"type the key and Enter", chromedp.KeyEvent(p.key + "\r")},
		{"the environments list", chromedp.WaitVisible(chromedp.CSS(envLink))},
		{"open the environment", chromedp.Click(chromedp.CSS(envLink))},
		{"its tools", chromedp.WaitVisible(chromedp.CSS(`ul.tools li summary`))},
		{"its build report", chromedp.WaitVisible(chromedp.CSS(`[aria-label="Per-tool self-check agreement"] tbody tr`))},
		{"its sessions", chromedp.WaitVisible(chromedp.CSS(`[aria-label="Sessions"]`))},
		{"wake the twin", chromedp.Click(chromedp.CSS(`#wake`))},
		{"the twin is ready", chromedp.WaitVisible(chromedp.JSPath(`Array.from(document.querySelectorAll('.facts .badge')).find(b => b.textContent === 'ready' && b.closest('dd').querySelector('#wake'))`))},
		{"type a seed", chromedp.SendKeys(chromedp.CSS(`#open-seed`), "42")},
		{"open the session", chromedp.Click(chromedp.CSS(`#open-session`))},
		{"the playground", chromedp.WaitVisible(chromedp.CSS(`#playground #tool`))},
		{"pick get_user_details", chromedp.SetValue(chromedp.CSS(`#tool`), "get_user_details")},
	}
	run := func(st struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}) {
		t.Helper()
		sctx, cancel := context.WithTimeout(tctx, time.Minute)
		err := chromedp.Do(sctx, st.a)
		cancel()
		if err != nil {
			shot("console-failed.jpg")
			t.Fatalf("%s: %v (screenshot console-failed.jpg in %s; console: %q)", st.name, err, dir, console.seen())
		}
	}
	// Keyboard and screen reader reach: every field has a label, nothing interactive is taken out of the tab order.
	unreachable := func(page string) {
		t.Helper()
		bad, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[
			...[...document.querySelectorAll('input, select, textarea')].filter(e => e.labels.length === 0).map(e => 'unlabelled ' + (e.name || e.id)),
			...[...document.querySelectorAll('a[href], button, input, select, textarea, summary')].filter(e => e.tabIndex < 0).map(e => 'untabbable ' + e.outerHTML.slice(0, 60)),
		]`))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Errorf("%s page: %s", page, b)
		}
	}
	for i, st := range steps {
		run(st)
		if i == 2 {
			unreachable("environments")
		}
		if i == 6 {
			unreachable("environment")
			// The running build shows its progress, and the page follows it as it finishes.
			run(struct {
				name string
				a    chromedp.Action[chromedp.Void]
			}{"the running build", chromedp.WaitVisible(chromedp.CSS(liveRow + ` .badge.running`))})
			live.Status, live.Stage, live.Progress = schema.BuildSucceeded, "succeeded", 1
			if err := store.UpdateBuild(context.Background(), p.db, live, "status", "stage", "progress"); err != nil {
				t.Fatal(err)
			}
			run(struct {
				name string
				a    chromedp.Action[chromedp.Void]
			}{"the build finishing, polled", chromedp.WaitVisible(chromedp.CSS(liveRow + ` .badge.succeeded`))})
			shot("console-environment.jpg")
		}
	}
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.querySelector('#tool').dispatchEvent(new Event('change'))`)); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{
		{"the generated user_id field", chromedp.WaitVisible(chromedp.CSS(`#playground fieldset.schema input[name="user_id"]`))},
		{"type the user id", chromedp.SendKeys(chromedp.CSS(`#playground input[name="user_id"]`), userID)},
		{"call", chromedp.Click(chromedp.CSS(`#call`))},
		{"the answer", chromedp.WaitVisible(chromedp.CSS(`#call-answer .badge.fidelity`))},
		{"the transcript row", chromedp.WaitVisible(chromedp.CSS(`#transcript tbody tr.call`))},
	} {
		run(st)
	}
	unreachable("session")
	row, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`#transcript tbody tr.call`)))
	if err != nil {
		t.Fatal(err)
	}
	shown, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`#call-answer .badge.fidelity`)))
	if err != nil {
		t.Fatal(err)
	}
	answer, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`#call-answer pre`)))
	if err != nil {
		t.Fatal(err)
	}
	shot("console-transcript.jpg")
	sessID, err := chromedp.Run(tctx, chromedp.Evaluate[string](`location.hash.split('/session/')[1]`))
	if err != nil {
		t.Fatal(err)
	}
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"close", chromedp.Click(chromedp.CSS(`#close-session`))})
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"closed", chromedp.WaitVisible(chromedp.JSPath(`Array.from(document.querySelectorAll('#answer .ok')).find(p => p.textContent.includes('closed'))`))})

	// Usage: the meters as bars, the tool call counted. Keys: a new key is shown once and listed.
	for _, st := range []struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{
		{"usage", chromedp.Click(chromedp.CSS(`nav a[href="#/usage"]`))},
		{"the meters", chromedp.WaitVisible(chromedp.CSS(`svg.meter[aria-label^="tool_calls: 1 calls of 10000"]`))},
		{"keys", chromedp.Click(chromedp.CSS(`nav a[href="#/keys"]`))},
		{"name a key", chromedp.SendKeys(chromedp.CSS(`#keyname`), "browser-made")},
		{"create it", chromedp.Click(chromedp.CSS(`form.card.row button[type="submit"]`))},
		{"shown once", chromedp.WaitVisible(chromedp.CSS(`code.secret`))},
	} {
		run(st)
	}
	minted, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`code.secret`)))
	if err != nil {
		t.Fatal(err)
	}
	if k, _, err := store.ResolveKey(context.Background(), p.db, strings.TrimSpace(minted)); err != nil || k.WorkspaceID != p.ws.ID || k.Name != "browser-made" {
		t.Errorf("the key the page showed (%.12s…) is not the workspace's new key: %v", minted, err)
	}

	// The same page on a phone: nothing wider than the screen.
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"390 px", chromedp.EmulateViewport(390, 844)})
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"back to the environment", chromedp.Navigate(srv.URL + "/#/env/" + p.env.Slug)})
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"the closed session listed", chromedp.WaitVisible(chromedp.CSS(`[aria-label="Sessions"] tbody a`))})
	width, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	if err != nil {
		t.Fatal(err)
	}
	shot("console-390.jpg")
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"sign out", chromedp.Click(chromedp.CSS(`#signout`))})
	run(struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{"signed out", chromedp.WaitVisible(chromedp.CSS(`#signin #key`))})
	problems := console.finish()

	// What the page showed is what the server recorded.
	sess, err := store.GetSession(context.Background(), p.db, p.ws.ID, sessID)
	if err != nil {
		t.Fatalf("session %q from the page: %v", sessID, err)
	}
	calls := p.journaled(sess.ID)
	var call schema.Call
	if err := p.db.NewSelect().Model(&call).Where("session_id = ?", sess.ID).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sess.Seed != 42 || sess.Status != schema.SessionClosed || calls != 1 {
		t.Errorf("session: seed %d, status %s, %d calls; want seed 42, closed, 1 call", sess.Seed, sess.Status, calls)
	}
	if call.Tool != "get_user_details" || !strings.Contains(string(call.Arguments), userID) {
		t.Errorf("journaled call %s %s; want get_user_details for %s", call.Tool, call.Arguments, userID)
	}
	if strings.TrimSpace(shown) != call.Fidelity || !strings.Contains(row, call.Fidelity) || !strings.Contains(row, "get_user_details") ||
		!strings.Contains(row, userID) {
		t.Errorf("the page showed fidelity %q and transcript row %q; the journal has %s", shown, row, call.Fidelity)
	}
	if !strings.Contains(answer, userID) || call.Error {
		t.Errorf("answer %.200q (error %v); want the user's details", answer, call.Error)
	}
	if width > 390 {
		t.Errorf("at 390 px the page is %d px wide", width)
	}
	for _, pr := range problems {
		t.Errorf("browser console: %s", pr)
	}
	t.Logf("screenshots in %s", dir)
}
