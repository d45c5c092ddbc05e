package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/mattn/go-runewidth"
)

// Answers shaped like the server's lists (GET /v1/envs, sessions, the native tools listing, keys) and a
// transcript: wide rows of long text and nested objects.
func renderFixtures() map[string]json.RawMessage {
	var envs, sessions, tools, keys []map[string]any
	for i := 0; i < 4; i++ {
		envs = append(envs, map[string]any{"id": fmt.Sprintf("env_%016d", i), "slug": fmt.Sprintf("tau2-retail-%d", i), "name": "tau2-retail",
			"status": "ready", "n_traces": 1200 + i, "n_tools": 15, "covered_pct": 93.5, "schema_source": "traces",
			"headline":     "15 tools twinned from 1,200 traces: 13 synthesized handlers, 2 replayed; 95 % of recorded calls reproduced exactly",
			"active_build": map[string]any{"id": "bld_0123456789abcdef", "status": "succeeded", "bundle_hash": "sha256:d849668136f633c4db6f66b3caf7dbd617a3e1c2daa68d4c897b09a67eab7abb"},
			"created_at":   "2026-11-28T07:28:59Z", "updated_at": "2026-11-28T07:29:59Z", "collected_bytes": 12345678, "world": "open"})
		sessions = append(sessions, map[string]any{"id": fmt.Sprintf("ses_%016d", i), "env": "tau2-retail", "status": "open", "seed": 42,
			"seed_instructions": "3 orders for user liam_thomas_7882 with status pending, one of them with two items",
			"world_hash":        "sha256:be0a7e5eb6c87b18c5e1074f28b953a30cebed5d9d313079dd8211b12b26f3ac", "n_calls": 12, "n_errors": 0,
			"opened_at": "2026-11-28T07:28:59Z", "expires_at": "2026-11-28T07:58:59Z"})
		tools = append(tools, map[string]any{"name": "get_order_details", "description": "Get the status and details of an order, with its items, payment and fulfilment history.",
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"order_id": map[string]any{"type": "string"}}},
			"binding":     "synthesized", "rung": "twin", "attention": []string{}, "scores": map[string]any{"calls": 121, "errors": 3, "fit": 0.98, "fitCalls": 118},
			"twin": map[string]any{"kind": "read", "entity": "orders", "keyArg": "order_id", "handler": true}, "answerable": true})
		keys = append(keys, map[string]any{"id": fmt.Sprintf("key_%d", i), "name": "ci", "kind": "workspace", "display": "mk_live_abcd…wxyz", "created_at": "2026-11-28T07:28:59Z", "last_used_at": nil})
	}
	// In the server's field order (TranscriptEntry's).
	transcript := json.RawMessage(`{"sessionId":"ses_0123456789abcdef","recordOutputs":true,"calls":[
	 {"callId":"call_0123456789abcdef","seq":1,"name":"get_order_details","arguments":{"order_id":"#W0000001"},"fidelity":"B_twin","rung":"twin","downgraded":false,"error":false,"ms":3,"requestor":"assistant","stateHash":"sha256:be0a7e5eb6c87b18c5e1074f28b953a30cebed5d9d313079dd8211b12b26f3ac","createdAt":"2026-11-28T07:29:01Z","result":"{\"order_id\": \"#W0000001\", \"status\": \"pending\", \"items\": [{\"item_id\": \"it_1\", \"price\": 11}]}"},
	 {"callId":"call_1123456789abcdef","seq":2,"name":"cancel_pending_order","arguments":{"order_id":"#W0000001","reason":"no longer needed"},"fidelity":"B_twin","rung":"twin","downgraded":false,"error":false,"ms":4,"requestor":"assistant","stateHash":"sha256:6074eb5313c6b09f203b9b37e3a22c7d6fcc16f09c95ac53d59347f58b6b650d","createdAt":"2026-11-28T07:29:02Z","result":"{\"order_id\": \"#W0000001\", \"status\": \"cancelled\"}"}]}`)
	out := map[string]json.RawMessage{}
	for name, v := range map[string]any{"envs list": envs, "sessions list": sessions, "envs tools": tools, "keys list": keys, "sessions transcript": transcript} {
		b, _ := json.Marshal(v)
		out[name] = b
	}
	return out
}

// Every list, and a transcript with --output table, fits 80 and 200 columns; --output wide shows every column.
func TestTablesFitTheWidth(t *testing.T) {
	for name, data := range renderFixtures() {
		for _, width := range []int{80, 200} {
			output := ""
			if name == "sessions transcript" {
				output = "table"
			}
			var buf bytes.Buffer
			if err := render(&buf, data, output, width); err != nil {
				t.Fatal(err)
			}
			widest := 0
			for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
				widest = max(widest, runewidth.StringWidth(line))
			}
			if widest > width {
				t.Errorf("%s at %d columns: a line of %d columns:\n%s", name, width, widest, buf.String())
			}
			if !strings.Contains(buf.String(), "┌") {
				t.Errorf("%s at %d columns: no table:\n%s", name, width, buf.String())
			}
			t.Logf("%s at %d columns: widest line %d", name, width, widest)
		}
	}

	// The transcript's calls are a table of their own: one row a call, the tool's name readable.
	var buf bytes.Buffer
	if err := render(&buf, renderFixtures()["sessions transcript"], "table", 80); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); !strings.Contains(s, "CALLS") || !strings.Contains(s, "get_order_details") || !strings.Contains(s, "cancel_pending_order") {
		t.Errorf("transcript table does not list the calls by name:\n%s", s)
	}

	// --output wide keeps every column of the widest list.
	buf.Reset()
	if err := render(&buf, renderFixtures()["envs list"], "wide", 80); err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"SLUG", "HEADLINE", "COLLECTED_BYTES", "WORLD"} {
		if !strings.Contains(buf.String(), col) {
			t.Errorf("--output wide lacks column %s", col)
		}
	}
	// A fitted table says what it left out.
	buf.Reset()
	_ = render(&buf, renderFixtures()["envs list"], "", 80)
	if !strings.Contains(buf.String(), "more column(s): --output wide") {
		t.Errorf("fitted envs list does not name its hidden columns:\n%s", buf.String())
	}
}
