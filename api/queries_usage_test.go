package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/usage"
)

// Queries are metered from their rows (issue 16 with issue 15): the queries and model_tokens meters read what the
// queries table holds; a plan's query allowance refuses the next query with 402 and the meter, before anything is
// written; a workspace without the query entitlement gets 403 with access.
func TestQueriesMetered(t *testing.T) {
	model := newScriptedModel(t)
	plans := &usage.Plans{Default: "two", ByName: map[string]usage.Plan{"two": {Queries: 2}}}
	p := newQueryPlane(t, schema.DriverSQLite, model.URL+"/v1", queryOptions{rate: -1, plans: plans}, "")
	path := "/v1/envs/" + p.env.Slug + "/query"
	tokens := 0.0
	for i, body := range []map[string]any{
		{"input": "Where is my order?", "model": "replay", "seed": 1},
		{"input": "I placed an order by mistake, please cancel it.", "auto_seed": true, "seed": 9}, // the model runs
	} {
		code, out := p.do(http.MethodPost, path, p.key, body)
		if code != http.StatusOK {
			t.Fatalf("query %d: %d %v", i, code, out)
		}
		u := out["usage"].(map[string]any)
		tokens += u["prompt_tokens"].(float64) + u["completion_tokens"].(float64)
	}
	if tokens == 0 {
		t.Fatal("the model query reported no tokens")
	}
	code, usageOut := p.do(http.MethodGet, "/v1/usage", p.key, nil)
	if code != http.StatusOK {
		t.Fatalf("usage: %d %v", code, usageOut)
	}
	meters := map[string]map[string]any{}
	for _, m := range usageOut["meters"].([]any) {
		mm := m.(map[string]any)
		meters[mm["name"].(string)] = mm
	}
	if q := meters["queries"]; q == nil || q["used"].(float64) != 2 || q["limit"].(float64) != 2 {
		t.Errorf("queries meter = %v, want used 2 of 2", q)
	}
	if m := meters["model_tokens"]; m == nil || m["used"].(float64) != tokens {
		t.Errorf("model_tokens meter = %v, want %v (the queries' own usage)", m, tokens)
	}

	// The third is over the allowance: 402 naming the meter, and no query row written.
	p.gate.Forget(p.ws.ID) // the gate's reading is up to 1 s old: take a fresh one, with the second query's row
	code, out := p.do(http.MethodPost, path, p.key, map[string]any{"input": "Where is my order?", "model": "replay"})
	meter, _ := out["meter"].(map[string]any)
	if code != http.StatusPaymentRequired || meter["name"] != "queries" || meter["used"].(float64) != 2 || meter["limit"].(float64) != 2 ||
		out["cardWouldLift"] != false || out["requestId"] == "" {
		t.Errorf("over the allowance: %d %v", code, out)
	}
	from, to := usage.Bounds(time.Now(), usage.PeriodMonth)
	if tot, err := store.QueriesIn(context.Background(), p.db, p.ws.ID, from, to); err != nil || tot.Queries != 2 {
		t.Errorf("queries rows after the refusal: %+v, %v; want 2", tot, err)
	}

	// Without the entitlement: 403 with access.
	if _, err := store.UpdateWorkspace(context.Background(), p.db, p.ws.ID, store.WorkspaceChange{Entitlements: []string{"mcp"}}); err != nil {
		t.Fatal(err)
	}
	code, out = p.do(http.MethodPost, path, p.key, map[string]any{"input": "Where is my order?"})
	if code != http.StatusForbidden || out["access"] != "denied" {
		t.Errorf("without the query entitlement: %d %v", code, out)
	}
}
