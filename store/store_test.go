package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twinstate"
)

var ctx = context.Background()

func mustWorkspace(t *testing.T, db bun.IDB, name string) *schema.Workspace {
	t.Helper()
	ws, err := store.CreateWorkspace(ctx, db, name)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func count(t *testing.T, db bun.IDB, model any) int {
	t.Helper()
	n, err := db.NewSelect().Model(model).Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestKeys(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		other := mustWorkspace(t, db, "other")
		key, plain, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "ci")
		if err != nil {
			t.Fatal(err)
		}
		mcp, mcpPlain, err := store.CreateKey(ctx, db, ws.ID, cred.KindMCP, "claude")
		if err != nil {
			t.Fatal(err)
		}
		revoked, revokedPlain, _ := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "old")
		if _, err := store.RevokeKey(ctx, db, ws.ID, revoked.ID); err != nil {
			t.Fatal(err)
		}
		otherKey, _, _ := store.CreateKey(ctx, db, other.ID, cred.KindWorkspace, "theirs")
		unknown, _ := cred.Mint(cred.KindWorkspace)
		sessionTok, _ := cred.Mint(cred.KindSession)

		resolve := []struct {
			name    string
			token   string
			wantKey string
		}{
			{"workspace key", plain, key.ID},
			{"mcp token", mcpPlain, mcp.ID},
			{"revoked key", revokedPlain, ""},
			{"unknown key", unknown.Plaintext, ""},
			{"session token", sessionTok.Plaintext, ""},
			{"malformed", "mk_live_short", ""},
			{"empty", "", ""},
			{"hash instead of token", key.Hash, ""},
		}
		for _, tt := range resolve {
			k, w, err := store.ResolveKey(ctx, db, tt.token)
			if tt.wantKey == "" {
				if !errors.Is(err, store.ErrNotFound) {
					t.Errorf("%s: ResolveKey err = %v, want ErrNotFound", tt.name, err)
				}
				continue
			}
			if err != nil || k.ID != tt.wantKey || w.ID != ws.ID {
				t.Errorf("%s: ResolveKey = %v, %v, %v; want key %s in %s", tt.name, k, w, err, tt.wantKey, ws.ID)
				continue
			}
			if k.LastUsedAt == nil {
				t.Errorf("%s: last_used_at not set", tt.name)
			}
		}

		keys, err := store.ListKeys(ctx, db, ws.ID)
		if err != nil || len(keys) != 3 {
			t.Fatalf("ListKeys = %d keys, %v; want 3", len(keys), err)
		}
		for _, k := range keys {
			if k.WorkspaceID != ws.ID {
				t.Errorf("ListKeys leaked key %s of workspace %s", k.ID, k.WorkspaceID)
			}
		}
		// The plaintext is stored nowhere.
		for _, p := range []string{plain, mcpPlain, revokedPlain} {
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM api_keys WHERE hash = ? OR prefix = ? OR name = ?", p, p, p).Scan(&n); err != nil || n != 0 {
				t.Errorf("plaintext found in api_keys (%d rows, %v)", n, err)
			}
		}
		// Another workspace's key is not found, and revoking it changes nothing.
		if _, err := store.GetKey(ctx, db, ws.ID, otherKey.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetKey(other workspace's key) err = %v, want ErrNotFound", err)
		}
		if _, err := store.RevokeKey(ctx, db, ws.ID, otherKey.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("RevokeKey(other workspace's key) err = %v, want ErrNotFound", err)
		}
		if k, _ := store.GetKey(ctx, db, other.ID, otherKey.ID); k == nil || k.RevokedAt != nil {
			t.Errorf("other workspace's key was revoked")
		}
		// Revoking twice keeps the first revocation time.
		r1, _ := store.GetKey(ctx, db, ws.ID, revoked.ID)
		r2, err := store.RevokeKey(ctx, db, ws.ID, revoked.ID)
		if err != nil || r2.RevokedAt == nil || !r2.RevokedAt.Equal(*r1.RevokedAt) {
			t.Errorf("second revoke = %v, %v; want revoked_at unchanged %v", r2, err, r1.RevokedAt)
		}
		if _, _, err := store.CreateKey(ctx, db, ws.ID, cred.KindSession, "x"); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateKey(session kind) err = %v, want ErrInvalid", err)
		}
	})
}

func TestBootstrap(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		m, _ := cred.Mint(cred.KindWorkspace)
		const n = 6
		var wg sync.WaitGroup
		wsIDs := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ws, key, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: m.Plaintext})
				errs[i] = err
				if err == nil {
					wsIDs[i] = ws.ID
					if key.Hash != m.Hash {
						errs[i] = fmt.Errorf("key hash %s, want %s", key.Hash, m.Hash)
					}
				}
			}()
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("bootstrap %d: %v", i, errs[i])
			}
			if wsIDs[i] != wsIDs[0] {
				t.Fatalf("bootstraps returned workspaces %v, want one", wsIDs)
			}
		}
		if w, k := count(t, db, (*schema.Workspace)(nil)), count(t, db, (*schema.APIKey)(nil)); w != 1 || k != 1 {
			t.Fatalf("after concurrent bootstraps: %d workspaces, %d keys; want 1 and 1", w, k)
		}
		if _, ws, err := store.ResolveKey(ctx, db, m.Plaintext); err != nil || ws.ID != wsIDs[0] || ws.Name != "default" {
			t.Fatalf("bootstrap key resolves to %v, %v", ws, err)
		}
		// A second key joins the same named workspace.
		m2, _ := cred.Mint(cred.KindWorkspace)
		ws2, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: m2.Plaintext})
		if err != nil || ws2.ID != wsIDs[0] {
			t.Fatalf("second bootstrap key joined %v, %v; want %s", ws2, err, wsIDs[0])
		}

		bad := []struct {
			name string
			key  string
			want error
		}{
			{"empty", "", store.ErrInvalid},
			{"short", "mk_live_abc", store.ErrInvalid},
			{"mcp token", "mcp_at_" + strings.Repeat("a", 40), store.ErrInvalid},
		}
		for _, tt := range bad {
			if _, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: tt.key}); !errors.Is(err, tt.want) {
				t.Errorf("%s: Bootstrap err = %v, want %v", tt.name, err, tt.want)
			}
		}
		key, _, _ := store.ResolveKey(ctx, db, m2.Plaintext)
		if _, err := store.RevokeKey(ctx, db, ws2.ID, key.ID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: m2.Plaintext}); !errors.Is(err, store.ErrConflict) {
			t.Errorf("Bootstrap(revoked key) err = %v, want ErrConflict", err)
		}
		if k := count(t, db, (*schema.APIKey)(nil)); k != 2 {
			t.Errorf("%d keys after rejected bootstraps, want 2", k)
		}
	})
}

func TestWorkspaceAccess(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		for _, a := range []string{schema.AccessPending, schema.AccessDenied, schema.AccessGranted} {
			if err := store.SetWorkspaceAccess(ctx, db, ws.ID, a); err != nil {
				t.Fatal(err)
			}
			got, _ := store.GetWorkspace(ctx, db, ws.ID)
			if got.Access != a {
				t.Errorf("access = %q, want %q", got.Access, a)
			}
		}
		if err := store.SetWorkspaceAccess(ctx, db, ws.ID, "maybe"); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("bad access err = %v", err)
		}
		if err := store.SetWorkspaceAccess(ctx, db, "ws_nope", schema.AccessDenied); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing workspace err = %v", err)
		}
		if _, err := store.CreateWorkspace(ctx, db, ""); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("empty name err = %v", err)
		}
	})
}

func TestSlugify(t *testing.T) {
	tests := []struct{ in, want string }{
		{"retail", "retail"},
		{"Retail Agent", "retail-agent"},
		{"  tau--bench / airline  ", "tau-bench-airline"},
		{"v2.1_prod", "v2-1-prod"},
		{"Émile's bot", "mile-s-bot"},
	}
	for _, tt := range tests {
		if got := store.Slugify(tt.in); got != tt.want {
			t.Errorf("Slugify(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// No slug-able characters: a stable hash slug.
	if a, b := store.Slugify("日本語"), store.Slugify("日本語"); a != b || !strings.HasPrefix(a, "p-") || a == store.Slugify("中文") {
		t.Errorf("Slugify of non-ASCII names: %q, %q, %q", a, b, store.Slugify("中文"))
	}
	// Long names are cut to 63 and stay distinct.
	long1, long2 := strings.Repeat("a", 70)+"1", strings.Repeat("a", 70)+"2"
	if s1, s2 := store.Slugify(long1), store.Slugify(long2); len(s1) > 63 || s1 == s2 {
		t.Errorf("long slugs %q (%d), %q", s1, len(s1), s2)
	}
}

func TestEnvs(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		other := mustWorkspace(t, db, "other")

		// Concurrent first sightings of one project make one environment.
		const n = 8
		var wg sync.WaitGroup
		ids := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "Retail Agent")
				errs[i] = err
				if err == nil {
					ids[i] = env.ID
				}
			}()
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || ids[i] != ids[0] {
				t.Fatalf("upsert %d = %s, %v; want %s", i, ids[i], errs[i], ids[0])
			}
		}
		retail, err := store.GetEnv(ctx, db, ws.ID, "retail-agent")
		if err != nil || retail.ID != ids[0] || retail.Name != "Retail Agent" || retail.Status != schema.EnvCollecting || retail.TwinState != twinstate.Stopped {
			t.Fatalf("GetEnv = %+v, %v", retail, err)
		}
		airline, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "airline")
		theirs, _ := store.UpsertEnvByProject(ctx, db, other.ID, "retail agent")
		if theirs.ID == retail.ID || theirs.Slug != retail.Slug {
			t.Fatalf("same slug in two workspaces must be two envs: %s/%s", theirs.ID, retail.ID)
		}
		// Pin creation times so "newest first" is checked, not assumed.
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i, id := range []string{retail.ID, airline.ID} {
			if _, err := db.NewUpdate().Model((*schema.Environment)(nil)).Set("created_at = ?", base.Add(time.Duration(i)*time.Millisecond)).Where("id = ?", id).Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		envs, err := store.ListEnvs(ctx, db, ws.ID)
		if err != nil || len(envs) != 2 || envs[0].ID != airline.ID || envs[1].ID != retail.ID {
			t.Fatalf("ListEnvs = %v, %v; want airline then retail", envs, err)
		}
		if _, err := store.GetEnv(ctx, db, other.ID, "airline"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetEnv(other workspace's slug) err = %v, want ErrNotFound", err)
		}
		if _, err := store.UpsertEnvByProject(ctx, db, ws.ID, "  "); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("empty project err = %v", err)
		}

		retail.Status, retail.NTools, retail.CoveredPct, retail.Headline = schema.EnvReady, 12, 91.5, "12 tools, 91.5% covered"
		retail.Framework = "should not be written"
		if err := store.UpdateEnv(ctx, db, retail, "status", "n_tools", "covered_pct", "headline"); err != nil {
			t.Fatal(err)
		}
		got, _ := store.GetEnvByID(ctx, db, retail.ID)
		if got.Status != schema.EnvReady || got.NTools != 12 || got.CoveredPct != 91.5 || got.Framework != "" || !got.UpdatedAt.After(got.CreatedAt) {
			t.Errorf("after UpdateEnv: %+v", got)
		}
		if err := store.SetTwinState(ctx, db, retail.ID, twinstate.Ready, "http://127.0.0.1:9"); err != nil {
			t.Fatal(err)
		}
		if got, _ := store.GetEnvByID(ctx, db, retail.ID); got.TwinState != twinstate.Ready || got.TwinEndpoint != "http://127.0.0.1:9" {
			t.Errorf("twin state = %q %q", got.TwinState, got.TwinEndpoint)
		}
		if err := store.SetTwinState(ctx, db, retail.ID, "melting", ""); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("bad twin state err = %v", err)
		}
		if err := store.UpdateEnv(ctx, db, &schema.Environment{ID: "env_nope"}, "status"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UpdateEnv(missing) err = %v", err)
		}
	})
}

func TestBuilds(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		other := mustWorkspace(t, db, "other")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		b1 := &schema.Build{EnvID: env.ID}
		if err := store.CreateBuild(ctx, db, b1); err != nil {
			t.Fatal(err)
		}
		if !schema.HasPrefix(b1.ID, schema.PrefixBuild) || b1.Status != schema.BuildQueued || b1.WorkspaceID != ws.ID {
			t.Fatalf("created build %+v", b1)
		}
		b2 := &schema.Build{EnvID: env.ID, CreatedAt: b1.CreatedAt.Add(time.Second)}
		if err := store.CreateBuild(ctx, db, b2); err != nil {
			t.Fatal(err)
		}
		list, err := store.ListBuilds(ctx, db, env.ID, 0)
		if err != nil || len(list) != 2 || list[0].ID != b2.ID {
			t.Fatalf("ListBuilds = %v, %v; want newest (%s) first", list, err, b2.ID)
		}
		if l, _ := store.ListBuilds(ctx, db, env.ID, 1); len(l) != 1 {
			t.Errorf("ListBuilds limit 1 = %d builds", len(l))
		}
		b1.Status, b1.Progress, b1.Report, b1.BundleKey = schema.BuildSucceeded, 1, []byte(`{"ok":true}`), "bundles/abc"
		if err := store.UpdateBuild(ctx, db, b1, "status", "progress", "report", "bundle_key"); err != nil {
			t.Fatal(err)
		}
		got, err := store.GetBuild(ctx, db, ws.ID, b1.ID)
		if err != nil || got.Status != schema.BuildSucceeded || got.BundleKey != "bundles/abc" || !strings.Contains(string(got.Report), "true") {
			t.Fatalf("GetBuild = %+v, %v", got, err)
		}
		if _, err := store.GetBuild(ctx, db, other.ID, b1.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetBuild(other workspace) err = %v", err)
		}
		if err := store.CreateBuild(ctx, db, &schema.Build{EnvID: "env_missing"}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("CreateBuild(missing env) err = %v", err)
		}
		if err := store.CreateBuild(ctx, db, &schema.Build{EnvID: env.ID, WorkspaceID: other.ID}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("CreateBuild(env of another workspace) err = %v", err)
		}
		if n := count(t, db, (*schema.Build)(nil)); n != 2 {
			t.Errorf("%d builds, want 2", n)
		}
	})
}

func TestInsertTraceBatch(t *testing.T) {
	steps := []struct {
		ids      []string
		inserted []string
		dups     []string
		total    int64
	}{
		{[]string{"a", "b", "c"}, []string{"a", "b", "c"}, nil, 3},
		{[]string{"b", "c", "d"}, []string{"d"}, []string{"b", "c"}, 4},
		{[]string{"e", "e", "f", "a"}, []string{"e", "f"}, []string{"e", "a"}, 6},
		{[]string{"a", "b"}, nil, []string{"a", "b"}, 6}, // a retried batch adds nothing
		{nil, nil, nil, 6},
	}
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		var bytes int64
		for i, st := range steps {
			b := &schema.TraceBatch{EnvID: env.ID, BlobKey: fmt.Sprintf("traces/%d", i), Bytes: 100, ToolsSeen: []string{"get_order"}}
			res, err := store.InsertTraceBatch(ctx, db, b, st.ids)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if fmt.Sprint(res.Inserted) != fmt.Sprint(st.inserted) || fmt.Sprint(res.Duplicates) != fmt.Sprint(st.dups) {
				t.Errorf("step %d: inserted %v dups %v; want %v %v", i, res.Inserted, res.Duplicates, st.inserted, st.dups)
			}
			if b.NTraces != int64(len(st.inserted)) || b.NDuplicates != int64(len(st.dups)) {
				t.Errorf("step %d: batch counts %d/%d", i, b.NTraces, b.NDuplicates)
			}
			if len(st.inserted) > 0 {
				bytes += 100
			}
			got, _ := store.GetEnvByID(ctx, db, env.ID)
			if got.NTraces != st.total || got.CollectedBytes != bytes {
				t.Errorf("step %d: env n_traces %d bytes %d; want %d %d", i, got.NTraces, got.CollectedBytes, st.total, bytes)
			}
			if n, _ := store.CountTraces(ctx, db, env.ID); n != st.total {
				t.Errorf("step %d: %d trace rows, want %d", i, n, st.total)
			}
		}
		traces, _ := store.ListTraces(ctx, db, env.ID)
		batches, _ := store.ListTraceBatches(ctx, db, env.ID)
		if len(traces) != 6 || traces[4].TraceID != "e" || traces[4].Idx != 0 || traces[4].BatchID != batches[2].ID {
			t.Errorf("trace e stored as %+v, want batch 2 position 0", traces[4])
		}
		if len(batches) != len(steps) || batches[0].ToolsSeen[0] != "get_order" {
			t.Errorf("batches = %+v", batches)
		}

		// Rejected batches write nothing.
		before := [3]int{count(t, db, (*schema.TraceBatch)(nil)), count(t, db, (*schema.Trace)(nil)), 0}
		bad := []struct {
			name  string
			batch *schema.TraceBatch
			ids   []string
			want  error
		}{
			{"empty id", &schema.TraceBatch{EnvID: env.ID, BlobKey: "k"}, []string{"x", ""}, store.ErrInvalid},
			{"no blob key", &schema.TraceBatch{EnvID: env.ID}, []string{"x"}, store.ErrInvalid},
			{"missing env", &schema.TraceBatch{EnvID: "env_missing", BlobKey: "k"}, []string{"x"}, store.ErrNotFound},
		}
		for _, tt := range bad {
			if _, err := store.InsertTraceBatch(ctx, db, tt.batch, tt.ids); !errors.Is(err, tt.want) {
				t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
			}
		}
		after := [3]int{count(t, db, (*schema.TraceBatch)(nil)), count(t, db, (*schema.Trace)(nil)), 0}
		if before != after {
			t.Errorf("rejected batches wrote rows: before %v after %v", before, after)
		}
	})
}

// Concurrent overlapping batches: every id is stored once and counted once.
func TestInsertTraceBatchConcurrent(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		const workers, batches, perBatch, pool = 6, 5, 40, 300
		rng := rand.New(rand.NewPCG(1, 2))
		plans := make([][][]string, workers)
		union := map[string]bool{}
		submitted := 0
		for w := range plans {
			for range batches {
				var ids []string
				for range perBatch {
					id := fmt.Sprintf("t%03d", rng.IntN(pool))
					ids = append(ids, id)
					union[id] = true
				}
				submitted += len(ids)
				plans[w] = append(plans[w], ids)
			}
		}
		var mu sync.Mutex
		inserted, dups := 0, 0
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i, ids := range plans[w] {
					res, err := store.InsertTraceBatch(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: fmt.Sprintf("k%d-%d", w, i)}, ids)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					inserted += len(res.Inserted)
					dups += len(res.Duplicates)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got, _ := store.GetEnvByID(ctx, db, env.ID)
		n, _ := store.CountTraces(ctx, db, env.ID)
		if inserted != len(union) || int(got.NTraces) != len(union) || int(n) != len(union) || inserted+dups != submitted {
			t.Fatalf("unique %d: inserted %d, env n_traces %d, rows %d; inserted+dups %d of %d submitted",
				len(union), inserted, got.NTraces, n, inserted+dups, submitted)
		}
	})
}

func openSession(t *testing.T, db bun.IDB, env *schema.Environment, keyID string) (*schema.Session, string) {
	t.Helper()
	s := &schema.Session{EnvID: env.ID, OpenedByKeyID: keyID, Seed: 7, SeedInstructions: "2 orders", WorldHash: "sha256:w0", StateHash: "sha256:w0"}
	tok, err := store.CreateSession(ctx, db, s)
	if err != nil {
		t.Fatal(err)
	}
	return s, tok
}

func TestSessions(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		other := mustWorkspace(t, db, "other")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "retail")
		s, tok := openSession(t, db, env, "key_x")
		if !strings.HasPrefix(tok, "ms_") || !schema.HasPrefix(s.ID, schema.PrefixSession) || s.Status != schema.SessionOpen || s.WorkspaceID != ws.ID {
			t.Fatalf("CreateSession = %+v, %q", s, tok)
		}
		if d := s.ExpiresAt.Sub(s.CreatedAt); d != store.DefaultSessionIdle {
			t.Errorf("expires after %v, want %v", d, store.DefaultSessionIdle)
		}
		got, err := store.SessionByToken(ctx, db, tok)
		if err != nil || got.ID != s.ID {
			t.Fatalf("SessionByToken = %v, %v", got, err)
		}
		otherTok, _ := cred.Mint(cred.KindSession)
		for _, bad := range []string{otherTok.Plaintext, "ms_x", "mk_live_" + strings.Repeat("a", 40), ""} {
			if _, err := store.SessionByToken(ctx, db, bad); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("SessionByToken(%q) err = %v", bad, err)
			}
		}
		if _, err := store.GetSession(ctx, db, other.ID, s.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetSession(other workspace) err = %v", err)
		}
		ended, err := store.EndSession(ctx, db, s.ID, schema.SessionClosed)
		if err != nil || !ended {
			t.Fatalf("EndSession = %v, %v", ended, err)
		}
		ended, err = store.EndSession(ctx, db, s.ID, schema.SessionClosed)
		if err != nil || ended {
			t.Fatalf("second EndSession = %v, %v; want false", ended, err)
		}
		if got, _ := store.GetSession(ctx, db, ws.ID, s.ID); got.Status != schema.SessionClosed || got.ClosedAt == nil {
			t.Errorf("closed session = %+v", got)
		}
		if _, err := store.EndSession(ctx, db, s.ID, schema.SessionOpen); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("EndSession(open) err = %v", err)
		}

		// Idle expiry.
		live, _ := openSession(t, db, env, "key_x")
		stale, _ := openSession(t, db, env, "key_x")
		stale.ExpiresAt = time.Now().Add(-time.Minute)
		if err := store.UpdateSession(ctx, db, stale, "expires_at"); err != nil {
			t.Fatal(err)
		}
		ids, err := store.ExpireIdleSessions(ctx, db, time.Now())
		if err != nil || len(ids) != 1 || ids[0] != stale.ID {
			t.Fatalf("ExpireIdleSessions = %v, %v; want [%s]", ids, err, stale.ID)
		}
		open, _ := store.ListSessions(ctx, db, env.ID, schema.SessionOpen, 0)
		if len(open) != 1 || open[0].ID != live.ID {
			t.Errorf("open sessions = %v", open)
		}
		if _, err := store.CreateSession(ctx, db, &schema.Session{EnvID: "env_missing"}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("CreateSession(missing env) err = %v", err)
		}
	})
}

func TestUsage(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		p := store.Period(time.Date(2026, 11, 30, 23, 0, 0, 0, time.FixedZone("x", -3*3600)))
		if p != "2026-12" {
			t.Fatalf("Period = %q, want the UTC month 2026-12", p)
		}
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := store.AddUsage(ctx, db, ws.ID, p, store.MeterTaskMinutes, 0.5); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if err := store.AddUsage(ctx, db, ws.ID, p, store.MeterSessions, 1); err != nil {
			t.Fatal(err)
		}
		meters, err := store.ListUsage(ctx, db, ws.ID, p)
		if err != nil || len(meters) != 2 || meters[0].Meter != store.MeterSessions || meters[1].Amount != 5 {
			t.Fatalf("ListUsage = %+v, %v; want sessions=1, task_minutes=5", meters, err)
		}
		if err := store.AddUsage(ctx, db, ws.ID, "", "x", 1); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("AddUsage without period err = %v", err)
		}
	})
}
