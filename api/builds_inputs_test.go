package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/store"
)

// buildInputs reads the inputs a build row says it used.
func (f *buildFixture) buildInputs(t *testing.T, buildID string) (infer.Options, string) {
	t.Helper()
	row, err := store.GetBuildByID(bg, f.db, buildID)
	if err != nil {
		t.Fatal(err)
	}
	if row.UploadKey == "" {
		return infer.Options{}, ""
	}
	rc, err := f.blobs.Get(bg, row.UploadKey)
	if err != nil {
		t.Fatalf("inputs blob %q of %s: %v", row.UploadKey, buildID, err)
	}
	defer rc.Close()
	var up infer.Upload
	if err := json.NewDecoder(rc).Decode(&up); err != nil {
		t.Fatal(err)
	}
	opts, err := up.Options()
	if err != nil {
		t.Fatalf("inputs of %s do not validate: %v", buildID, err)
	}
	return opts, row.UploadKey
}

func (f *buildFixture) postBuild(t *testing.T, parts ...part) string {
	t.Helper()
	body, ct := multipartBody(t, parts...)
	w := f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.key, body, ct)
	if w.Code != http.StatusAccepted {
		t.Fatalf("build: %d %s", w.Code, w.Body)
	}
	var out api.BuildStarted
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out.BuildID
}

// Issue #13: what a multipart build uploaded stays the environment's inputs. An automatic rebuild (the row the
// Rebuild workflow's QueueBuild activity creates after collected traces, or after a restart found missed traces)
// and a later multipart build that gives only some parts both build from them.
func TestBuildInputsCarryForward(t *testing.T) {
	tools, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	const code = "def handle(args, world):\n    return {\"ok\": True}\n"
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newBuildFixture(t, driver)
		want := func(step, buildID string, tools int, scenario, name string) string {
			t.Helper()
			opts, key := f.buildInputs(t, buildID)
			if len(opts.Tools) != tools || opts.Config.Scenarios["pending"] != scenario || opts.Config.Name != name ||
				opts.Code["transfer_to_human_agents"] != code {
				t.Errorf("%s: build %s used %d tools, scenarios %v, name %q, code %v; want %d tools, pending=%q, name %q and the uploaded code",
					step, buildID, len(opts.Tools), opts.Config.Scenarios, opts.Config.Name, opts.Code, tools, scenario, name)
			}
			return key
		}

		first := f.postBuild(t,
			part{"tools", "tools.json", string(tools)},
			part{"config", "", `{"name": "Retail", "scenarios": {"pending": "1 order with status pending"}}`},
			part{"code", "transfer_to_human_agents.star", code},
		)
		firstKey := want("multipart build", first, 16, "1 order with status pending", "Retail")

		// Collected traces queue an automatic rebuild.
		b := &activities.Builds{DB: f.db, Blobs: f.blobs}
		auto, err := b.QueueBuild(bg, f.env.ID)
		if err != nil {
			t.Fatal(err)
		}
		if key := want("automatic rebuild", auto, 16, "1 order with status pending", "Retail"); key != firstKey {
			t.Errorf("automatic rebuild used inputs %q, want the environment's current %q", key, firstKey)
		}
		plan, err := b.PlanBuild(bg, f.env.ID, auto)
		if err != nil {
			t.Fatal(err)
		}
		if plan.UploadKey != firstKey {
			t.Errorf("automatic rebuild plans inputs %q, want %q", plan.UploadKey, firstKey)
		}

		// A config-only build replaces the config and keeps the tools and the code.
		second := f.postBuild(t, part{"config", "", `{"name": "Retail 2", "scenarios": {"pending": "2 orders with status pending"}}`})
		secondKey := want("config-only build", second, 16, "2 orders with status pending", "Retail 2")
		// config={} empties the config, still nothing else.
		third := f.postBuild(t, part{"config", "", `{}`})
		want("empty config build", third, 16, "", "")
		// A code-only build replaces that one file.
		fourth := f.postBuild(t, part{"code", "get_order_details.star", code})
		if opts, _ := f.buildInputs(t, fourth); len(opts.Tools) != 16 || len(opts.Code) != 2 {
			t.Errorf("code-only build used %d tools and code for %d tools, want 16 and 2", len(opts.Tools), len(opts.Code))
		}

		// Parts are validated with the inputs they join: a binding to code uploaded by an earlier build is fine;
		// one to code nobody uploaded is a 422 naming it, and changes nothing.
		bound := f.postBuild(t, part{"config", "", `{"bindings": {"transfer_to_human_agents": "provided"}}`})
		boundOpts, boundKey := f.buildInputs(t, bound)
		if boundOpts.Config.Bindings["transfer_to_human_agents"] != "provided" || len(boundOpts.Tools) != 16 {
			t.Errorf("bound build used bindings %v, %d tools", boundOpts.Config.Bindings, len(boundOpts.Tools))
		}
		before := f.dbCounts()
		body, ct := multipartBody(t, part{"config", "", `{"bindings": {"cancel_pending_order": "provided"}}`})
		w := f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.key, body, ct)
		envelope(t, w, http.StatusUnprocessableEntity, "invalid")
		if !strings.Contains(w.Body.String(), "body.config.bindings.cancel_pending_order") {
			t.Errorf("422 does not name the binding: %s", w.Body)
		}
		if after := f.dbCounts(); !equalCounts(before, after) {
			t.Errorf("a refused build wrote rows: before %v after %v", before, after)
		}

		// The history is versioned: each build keeps the inputs it used.
		if _, key := f.buildInputs(t, first); key != firstKey {
			t.Errorf("first build's inputs changed to %q", key)
		}
		if _, key := f.buildInputs(t, second); key != secondKey || key == firstKey {
			t.Errorf("second build's inputs %q (first's %q)", key, firstKey)
		}
		env, err := store.GetEnvByID(bg, f.db, f.env.ID)
		if err != nil {
			t.Fatal(err)
		}
		if env.InputsKey != boundKey {
			t.Errorf("environment's inputs %q, want the latest accepted build's %q", env.InputsKey, boundKey)
		}
	})
}
