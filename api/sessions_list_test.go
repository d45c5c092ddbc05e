package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestSessionsList(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{local: true})
		a := p.open(map[string]any{"seed": 1})
		b := p.open(map[string]any{"seed": 2, "recordOutputs": true})
		if code, out := p.call(b, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK {
			t.Fatalf("call: %d %v", code, out)
		}
		if code, _ := p.do(http.MethodDelete, "/v1/sessions/"+a.ID, p.key, nil); code != http.StatusOK {
			t.Fatalf("close: %d", code)
		}
		list := func(query string, key string) (int, []map[string]any) {
			t.Helper()
			r := p.api.Get("/v1/envs/"+p.env.Slug+"/sessions"+query, "Authorization: Bearer "+key)
			var out []map[string]any
			if r.Code == http.StatusOK {
				if err := json.Unmarshal(r.Body.Bytes(), &out); err != nil {
					t.Fatal(err)
				}
			}
			return r.Code, out
		}
		code, all := list("", p.key)
		if code != http.StatusOK || len(all) != 2 || all[0]["id"] != b.ID || all[1]["id"] != a.ID {
			t.Fatalf("list: %d %v; want %s then %s", code, all, b.ID, a.ID)
		}
		fid, _ := all[0]["fidelity"].(map[string]any)
		if all[0]["n_calls"] != float64(1) || all[0]["seed"] != float64(2) || all[0]["status"] != "open" ||
			fid["A_executed"] != float64(1) || all[0]["state_hash"] != all[0]["world_hash"] { // a read leaves the world as it was
			t.Errorf("the called session lists as %v", all[0])
		}
		if all[1]["status"] != "closed" || all[1]["closed_at"] == nil || all[1]["state_hash"] != all[1]["world_hash"] {
			t.Errorf("the closed session lists as %v", all[1])
		}
		if code, open := list("?status=open&limit=5", p.key); code != http.StatusOK || len(open) != 1 || open[0]["id"] != b.ID {
			t.Errorf("status=open: %d %v", code, open)
		}
		if code, one := list("?limit=1", p.key); code != http.StatusOK || len(one) != 1 {
			t.Errorf("limit=1: %d %v", code, one)
		}
		for _, q := range []string{"?status=gone", "?limit=0", "?limit=501"} {
			if code, _ := list(q, p.key); code != http.StatusUnprocessableEntity {
				t.Errorf("%s: %d, want 422", q, code)
			}
		}
		// Another workspace's key sees no such environment.
		if code, _ := list("", p.otherKey); code != http.StatusNotFound {
			t.Errorf("another workspace's key: %d, want 404", code)
		}
	})
}
