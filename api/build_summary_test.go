package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Issue #13: a build's summary has snake_case keys, for builds finished now and for rows stored before with the
// Go field names; the report route reads both.
func TestBuildSummaryKeys(t *testing.T) {
	f := newBuildFixture(t, schema.DriverSQLite)
	for _, key := range []string{"reports/build/r1", "reports/selfcheck/s1"} {
		if err := f.blobs.Put(bg, key, bytes.NewReader([]byte(`{}`)), 2, "application/json"); err != nil {
			t.Fatal(err)
		}
	}
	finished := func() string {
		b := &schema.Build{EnvID: f.env.ID}
		if err := store.CreateBuild(bg, f.db, b); err != nil {
			t.Fatal(err)
		}
		return b.ID
	}
	now := finished()
	ab := &activities.Builds{DB: f.db, Blobs: f.blobs}
	err := ab.ActivateBuild(bg, activities.BuildPlan{EnvID: f.env.ID, BuildID: now},
		activities.Inferred{BundleKey: "bundles/b1", BundleHash: "sha256:b1", ReportKey: "reports/build/r1", NTools: 16,
			SchemaSource: "provided", Warnings: 2, CoveredPct: 90, SimulatedPct: 5, Headline: "16 tools"},
		activities.SelfChecked{ReportKey: "reports/selfcheck/s1", Agreement: 80, Calls: 100, Headline: "16 tools; agreement 80%"})
	if err != nil {
		t.Fatal(err)
	}
	old := finished()
	legacy := `{"inferred": {"BundleKey": "bundles/b1", "BundleHash": "sha256:b1", "ReportKey": "reports/build/r1", "NTools": 16,
		"SchemaSource": "provided", "Warnings": 2, "CoveredPct": 90, "SimulatedPct": 5, "Headline": "16 tools"},
		"selfCheck": {"ReportKey": "reports/selfcheck/s1", "Agreement": 80, "Calls": 100, "Headline": "16 tools; agreement 80%"}}`
	if _, err := f.db.NewUpdate().Model((*schema.Build)(nil)).Set("report = ?", legacy).Set("status = ?", schema.BuildSucceeded).
		Where("id = ?", old).Exec(bg); err != nil {
		t.Fatal(err)
	}

	want := map[string]any{
		"inferred": map[string]any{"bundle_key": "bundles/b1", "bundle_hash": "sha256:b1", "report_key": "reports/build/r1",
			"n_tools": 16.0, "schema_source": "provided", "warnings": 2.0, "covered_pct": 90.0, "simulated_pct": 5.0, "headline": "16 tools"},
		"self_check": map[string]any{"report_key": "reports/selfcheck/s1", "agreement_pct": 80.0, "calls": 100.0,
			"headline": "16 tools; agreement 80%"},
	}
	for name, id := range map[string]string{"finished now": now, "stored before": old} {
		t.Run(name, func(t *testing.T) {
			path := "/v1/envs/" + f.env.Slug + "/builds/" + id
			w := f.do(http.MethodGet, path, f.key, nil, "")
			if w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			var got struct {
				Summary map[string]any `json:"summary"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			g, _ := json.Marshal(got.Summary)
			e, _ := json.Marshal(want)
			if string(g) != string(e) {
				t.Errorf("summary\n got %s\nwant %s", g, e)
			}
			if w := f.do(http.MethodGet, path+"/report", f.key, nil, ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"build":{`) {
				t.Errorf("report: %d %s", w.Code, w.Body)
			}
		})
	}
}

// The environment summary says what the build saw of the agent: has_agent from the traces' profile, framework and
// language from the build config first, else what collect was told or saw, else what the traces' system prompts
// show.
func TestBuildShowsTheAgent(t *testing.T) {
	f := newBuildFixture(t, schema.DriverSQLite)
	ab := &activities.Builds{DB: f.db, Blobs: f.blobs}
	activate := func(inf activities.Inferred) map[string]any {
		t.Helper()
		b := &schema.Build{EnvID: f.env.ID}
		if err := store.CreateBuild(bg, f.db, b); err != nil {
			t.Fatal(err)
		}
		inf.BundleKey, inf.BundleHash = "bundles/b1", "sha256:b1"
		if err := ab.ActivateBuild(bg, activities.BuildPlan{EnvID: f.env.ID, BuildID: b.ID}, inf, activities.SelfChecked{}); err != nil {
			t.Fatal(err)
		}
		w := f.do(http.MethodGet, "/v1/envs/"+f.env.Slug, f.key, nil, "")
		var env map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil || w.Code != http.StatusOK {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		return env
	}
	env := activate(activities.Inferred{HasAgent: true, DetectedFramework: "crewai"})
	if env["has_agent"] != true || env["framework"] != "crewai" || env["language"] != "" {
		t.Errorf("detected only: has_agent %v framework %v language %v", env["has_agent"], env["framework"], env["language"])
	}
	// Collect was told langgraph: the build's detection does not override it; the config does.
	f.env.Framework = "langgraph"
	if err := store.UpdateEnv(bg, f.db, f.env, "framework"); err != nil {
		t.Fatal(err)
	}
	env = activate(activities.Inferred{HasAgent: false, DetectedFramework: "crewai", Language: "python"})
	if env["has_agent"] != false || env["framework"] != "langgraph" || env["language"] != "python" {
		t.Errorf("collect's framework: has_agent %v framework %v language %v", env["has_agent"], env["framework"], env["language"])
	}
	env = activate(activities.Inferred{HasAgent: true, Framework: "tau2"})
	if env["framework"] != "tau2" || env["language"] != "python" {
		t.Errorf("config's framework: framework %v language %v", env["framework"], env["language"])
	}
}
