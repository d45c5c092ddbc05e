package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/trace"
)

func TestToolListingFormats(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	get := func(q string) []map[string]any {
		t.Helper()
		res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools"+q, "Authorization: Bearer "+p.key)
		if res.Code != 200 {
			t.Fatalf("tools%s: %d %s", q, res.Code, res.Body)
		}
		var out []map[string]any
		if err := json.Unmarshal(res.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	keys := func(m map[string]any) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return strings.Join(ks, ",")
	}
	schemaOf := `{"properties":{"order_id":{"type":"string"}},"required":["order_id"],"type":"object"}`
	for _, q := range []string{"", "?format=native"} {
		nat := get(q)
		if len(nat) != 2 || nat[0]["name"] != "cancel_pending_order" || nat[1]["name"] != "get_order_details" {
			t.Fatalf("native%s = %v", q, nat)
		}
		if k := keys(nat[1]); k != "answerable,attention,binding,description,descriptionFrom,inputSchema,name,rung,scores,twin" {
			t.Fatalf("native entry keys = %s", k)
		}
		if b, _ := json.Marshal(nat[1]["inputSchema"]); string(b) != schemaOf || nat[1]["binding"] != "provided" || nat[1]["rung"] != "provided" {
			t.Fatalf("native entry = %v", nat[1])
		}
		tw := nat[1]["twin"].(map[string]any)
		if tw["kind"] != "read" || tw["entity"] != "orders" || tw["keyArg"] != "order_id" || tw["provided"] != true || tw["buildId"] != p.build.ID {
			t.Fatalf("twin facts = %v", tw)
		}
	}
	oa := get("?format=openai")
	if k := keys(oa[0]); k != "function,type" || oa[0]["type"] != "function" {
		t.Fatalf("openai entry = %v", oa[0])
	}
	fn := oa[1]["function"].(map[string]any)
	if k := keys(fn); k != "description,name,parameters" || fn["name"] != "get_order_details" || fn["description"] != "Get an order." {
		t.Fatalf("openai function = %v", fn)
	}
	if b, _ := json.Marshal(fn["parameters"]); string(b) != schemaOf {
		t.Fatalf("openai parameters = %s", b)
	}
	an := get("?format=anthropic")
	if k := keys(an[1]); k != "description,input_schema,name" || an[1]["name"] != "get_order_details" {
		t.Fatalf("anthropic entry = %v", an[1])
	}
	if b, _ := json.Marshal(an[1]["input_schema"]); string(b) != schemaOf {
		t.Fatalf("anthropic input_schema = %s", b)
	}
	res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools?format=xml", "Authorization: Bearer "+p.key)
	if res.Code != 422 || !strings.Contains(res.Body.String(), "format") {
		t.Fatalf("format=xml: %d %s", res.Code, res.Body)
	}
}

// TestWorldHashGolden pins the world hashes of a fixed bundle: the same seed and instructions give the same
// world_hash in any session, after a twin restart, and on any machine (the constants below were computed
// once; a change means the determinism contract broke, or the hashing changed on purpose).
func TestWorldHashGolden(t *testing.T) {
	const (
		goldenUnseeded = "sha256:be0a7e5eb6c87b18c5e1074f28b953a30cebed5d9d313079dd8211b12b26f3ac"
		goldenSeeded   = "sha256:6074eb5313c6b09f203b9b37e3a22c7d6fcc16f09c95ac53d59347f58b6b650d"
	)
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	body := map[string]any{"seedInstructions": "2 orders with status pending", "seed": 42, "clock": "2025-06-01T12:00:00Z"}
	first := p.open(body)
	second := p.open(body)
	p.stopTwin()
	p.startTwin()
	third := p.open(body)
	for i, s := range []session{first, second, third} {
		if s.Open["world_hash"] != goldenSeeded {
			t.Errorf("session %d: world_hash %v, want %s", i, s.Open["world_hash"], goldenSeeded)
		}
	}
	if got := p.unseededHash(42); got != goldenUnseeded {
		t.Errorf("unseeded world_hash %s, want %s", got, goldenUnseeded)
	}
	if fmt.Sprint(first.Open["pinned"]) != fmt.Sprint(third.Open["pinned"]) {
		t.Errorf("pinned ids differ across a restart: %v, %v", first.Open["pinned"], third.Open["pinned"])
	}
}

// sameAnswer compares a twin answer with the recorded one: JSON-equal when both parse as JSON, else text-equal.
func sameAnswer(got, want string) bool {
	g, gerr := jsonvalue.ParseString(got)
	w, werr := jsonvalue.ParseString(want)
	if gerr == nil && werr == nil {
		return jsonvalue.Equal(g, w)
	}
	return strings.TrimSpace(got) == strings.TrimSpace(want)
}

type toolTally struct {
	calls, agree, errs int
	fidelity           map[string]int
}

// TestReplayTauRetail opens a session per recorded trace of tau-retail-dev, replays the trace's tool calls in
// order through the API, and reports exact agreement with the recorded answers per tool and the fidelity mix.
// The twin is built from all the traces (the leave-one-out figure is the build's self-check).
func TestReplayTauRetail(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 960 calls")
	}
	bundle, traces := retailBundle(t)
	eachTransport(t, func(t *testing.T, local bool) { replayTauRetail(t, bundle, traces, local) })
}

func replayTauRetail(t *testing.T, bundle []byte, traces []trace.Trace, local bool) {
	p := newPlane(t, schema.DriverSQLite, bundle, planeOptions{local: local})
	tally := map[string]*toolTally{}
	mix := map[string]int{}
	total, agree, failed := 0, 0, 0
	for _, tr := range traces {
		s := p.open(map[string]any{"seed": 0})
		n := 0
		for _, c := range trace.Calls(tr) {
			if !c.Answered {
				continue
			}
			var args any = c.Args
			if c.Args == nil {
				args = json.RawMessage(c.RawArgs)
			}
			code, r := p.call(s, c.Tool, args)
			tt := tally[c.Tool]
			if tt == nil {
				tt = &toolTally{fidelity: map[string]int{}}
				tally[c.Tool] = tt
			}
			tt.calls++
			total++
			if code != http.StatusOK {
				failed++
				tt.fidelity[fmt.Sprintf("HTTP %d", code)]++
				mix[fmt.Sprintf("HTTP %d", code)]++
				continue
			}
			n++
			tt.fidelity[str(r["fidelity"])]++
			mix[str(r["fidelity"])]++
			if r["error"] == true {
				tt.errs++
			}
			if sameAnswer(str(r["content"]), c.Result) {
				tt.agree++
				agree++
			}
		}
		if got := p.journaled(s.ID); got != n {
			t.Fatalf("trace %s: %d calls answered, %d journaled", tr.ID, n, got)
		}
		if code, _ := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, s.Token, nil); code != 200 {
			t.Fatalf("close: %d", code)
		}
	}
	names := make([]string, 0, len(tally))
	for n := range tally {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "tau-retail-dev replay: %d traces, %d calls, %d agree (%.1f%%), %d not answered 200\n",
		len(traces), total, agree, 100*float64(agree)/float64(max(total, 1)), failed)
	fmt.Fprintf(&b, "%-32s %6s %6s %7s  %s\n", "tool", "calls", "agree", "pct", "fidelity")
	for _, n := range names {
		tt := tally[n]
		fmt.Fprintf(&b, "%-32s %6d %6d %6.1f%%  %v\n", n, tt.calls, tt.agree, 100*float64(tt.agree)/float64(tt.calls), tt.fidelity)
	}
	fmt.Fprintf(&b, "fidelity mix: %v\n", mix)
	t.Log("\n" + b.String())
	if total < 900 {
		t.Fatalf("replayed %d calls, want the data's ~960", total)
	}
	if failed > 0 {
		t.Errorf("%d recorded calls were not answered with 200", failed)
	}
	// A regression floor, well under what the twin measured when this test was written (99.0%).
	if pct := 100 * float64(agree) / float64(total); pct < 95 {
		t.Errorf("agreement %.1f%% is under the 95%% floor", pct)
	}
	p.checkTransport(t, local)
}

func TestSessionTokensCache(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seed": 1})
	c := toolplane.NewTokens(p.db, time.Hour)
	ctx := context.Background()
	got, ws, err := c.Resolve(ctx, s.Token)
	if err != nil || got.ID != s.ID || ws.ID != p.ws.ID || got.Status != schema.SessionOpen {
		t.Fatalf("Resolve = %+v, %+v, %v", got, ws, err)
	}
	// Ended behind the cache's back: the cached resolution stands until forgotten (or TTL).
	if _, err := store.EndSession(ctx, p.db, s.ID, schema.SessionClosed); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := c.Resolve(ctx, s.Token); got.Status != schema.SessionOpen {
		t.Fatalf("cached status = %s", got.Status)
	}
	c.Forget(s.ID)
	if got, _, err := c.Resolve(ctx, s.Token); err != nil || got.Status != schema.SessionClosed {
		t.Fatalf("after Forget: %+v, %v", got, err)
	}
	if _, _, err := c.Resolve(ctx, "ms_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
	short := toolplane.NewTokens(p.db, time.Millisecond)
	s2 := p.open(map[string]any{"seed": 2})
	if _, _, err := short.Resolve(ctx, s2.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := store.EndSession(ctx, p.db, s2.ID, schema.SessionExpired); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Millisecond)
	if got, _, _ := short.Resolve(ctx, s2.Token); got.Status != schema.SessionExpired {
		t.Fatalf("after TTL: %s", got.Status)
	}
}

// TestRevokedKeyEndsItsSessionsTokens: a session token's life ends with its session or with the key that opened
// it (issue 13 defect 12: revoking the key left the token working). The session itself stays readable and
// closable by the workspace's other keys.
func TestRevokedKeyEndsItsSessionsTokens(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{})
		ctx := context.Background()
		k, plain, err := store.CreateKey(ctx, p.db, p.ws.ID, cred.KindWorkspace, "short-lived")
		if err != nil {
			t.Fatal(err)
		}
		code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", plain, map[string]any{"seed": 3})
		if code != http.StatusCreated {
			t.Fatalf("open: %d %v", code, out)
		}
		s := session{ID: out["sessionId"].(string), Token: out["token"].(string)}
		if code, _ := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK {
			t.Fatalf("call before the revoke: %d", code)
		}
		if _, err := store.RevokeKey(ctx, p.db, p.ws.ID, k.ID); err != nil {
			t.Fatal(err)
		}
		p.tp.Tokens().Forget(s.ID) // as another process would see it once its cache entry lapses (≤ 5 s)
		if code, _ := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusUnauthorized {
			t.Fatalf("token of a session whose opening key was revoked: %d, want 401", code)
		}
		if code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key2, nil); code != http.StatusOK || v["n_calls"] != float64(1) {
			t.Fatalf("another key reads it: %d %v", code, v)
		}
		if code, v := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, p.key2, nil); code != http.StatusOK || v["existed"] != true {
			t.Fatalf("another key closes it: %d %v", code, v)
		}
	})
}
