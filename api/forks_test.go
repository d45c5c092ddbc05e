package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/usage"
)

// A fork is an opened session (issue 33): a workspace at its open-sessions quota cannot fork past it, with a key
// or with a session token, and gets the open's 402; a fork counts among the open sessions and closing one frees
// its place; the other meters an open is held to (tool calls here) hold forks too.
func TestForkIsHeldToTheOpenQuota(t *testing.T) {
	plans := &usage.Plans{Default: "small", ByName: map[string]usage.Plan{
		"small": {OpenSessions: 2, ToolCalls: 3, CardLifts: true},
	}}
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{plans: plans, adminKey: testAdminKey})
		s1, s2 := p.open(nil), p.open(nil)
		for i := 0; i < 30; i++ {
			for _, tok := range []string{s1.Token, p.key} {
				code, out := p.do(http.MethodPost, "/v1/sessions/"+s1.ID+"/fork", tok, nil)
				if code != http.StatusPaymentRequired {
					t.Fatalf("fork %d at 2 of 2 open sessions: %d %v, want 402", i, code, out)
				}
				wantMeter(t, out, usage.MeterOpenSessions, 2, 2, false)
			}
		}
		code, out := p.do(http.MethodPost, "/trpc/sessions.fork", p.key, map[string]any{"session_id": s1.ID})
		if env, st := trpcEnvelope(t, out); code != http.StatusPaymentRequired || st != http.StatusPaymentRequired {
			t.Fatalf("tRPC fork at the quota: %d/%v %v", code, st, out)
		} else {
			wantMeter(t, env, usage.MeterOpenSessions, 2, 2, false)
		}
		if n := countOpen(t, p); n != 2 {
			t.Fatalf("%d sessions open after refused forks, want 2", n)
		}
		var u map[string]any
		code, u = p.do(http.MethodGet, "/v1/usage", p.key, nil)
		if code != http.StatusOK {
			t.Fatalf("usage: %d %v", code, u)
		}
		wantUsageMeter(t, u, usage.MeterOpenSessions, 2)

		// Closing one frees a place a fork takes; the fork then counts as open.
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+s2.ID, s2.Token, nil); code != http.StatusOK {
			t.Fatalf("close: %d %v", code, out)
		}
		f := p.fork(s1, s1.Token, nil)
		if n := countOpen(t, p); n != 2 {
			t.Fatalf("%d sessions open after a fork into a free place, want 2", n)
		}
		code, out = p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, nil)
		if code != http.StatusPaymentRequired {
			t.Fatalf("open with the fork holding the last place: %d %v", code, out)
		}

		// Metered as an open: past the tool-calls meter, a fork is refused as an open is.
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+f.ID, f.Token, nil); code != http.StatusOK {
			t.Fatalf("close fork: %d %v", code, out)
		}
		for i := 0; i < 3; i++ {
			if code, out := p.call(s1, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, out)
			}
		}
		code, out = p.do(http.MethodPost, "/v1/sessions/"+s1.ID+"/fork", s1.Token, nil)
		if code != http.StatusPaymentRequired {
			t.Fatalf("fork past the tool-calls meter: %d %v, want 402", code, out)
		}
		wantMeter(t, out, usage.MeterToolCalls, 3, 3, true)
	})
}

// wantUsageMeter checks a meter's used figure in a /v1/usage answer.
func wantUsageMeter(t *testing.T, u map[string]any, name string, used float64) {
	t.Helper()
	ms, _ := u["meters"].([]any)
	for _, m := range ms {
		mm, _ := m.(map[string]any)
		if mm["name"] == name {
			if mm["used"] != used {
				t.Fatalf("usage meter %s used %v, want %v", name, mm["used"], used)
			}
			return
		}
	}
	b, _ := json.Marshal(u)
	t.Fatalf("usage has no meter %s: %s", name, b)
}

// A fork's session.opened event names what it was forked from: a fork is an opened session to webhooks too.
func TestForkRecordsSessionOpened(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{events: &activities.EventLog{}})
	s := p.open(nil)
	f := p.fork(s, s.Token, nil)
	evs, err := store.ListEvents(context.Background(), p.db, p.ws.ID, events.SessionOpened, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ev := range evs {
		var d events.SessionData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.SessionID == f.ID {
			found = d.ForkedFrom == s.ID
		}
	}
	if !found {
		t.Fatalf("no session.opened naming fork %s as forked from %s among %d events", f.ID, s.ID, len(evs))
	}
}

// What a session token derives never outlives its session (spec §5.7, issue 33): forks made with a session token —
// and forks of those — end when their parent ends, by close, by idle expiry (on a call, a read or the reaper), or
// when the parent breaks; their tokens are refused and their worlds dropped. Forks made with a key are sessions of
// that key's: they outlive the parent and end with the key.
func TestForksEndWithTheirParentsToken(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		p := newPlane(t, driver, shopBundle(t), planeOptions{})
		args := map[string]any{"order_id": "#W0000001"}
		refused := func(s session, want int) {
			t.Helper()
			if code, out := p.call(s, "get_order_details", args); code != want {
				t.Errorf("call in %s with its token: %d %v, want %d", s.ID, code, out, want)
			}
			if code, _ := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", s.Token, nil); code != want {
				t.Errorf("fork of %s with its token: %d, want %d", s.ID, code, want)
			}
			if _, err := rpc.NewClient(p.twinAddr(), nil).Session(ctx, s.ID); err == nil {
				t.Errorf("the twin still holds the world of %s", s.ID)
			}
		}
		status := func(s session) string {
			t.Helper()
			_, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil)
			return str(v["status"])
		}
		works := func(s session) {
			t.Helper()
			if code, out := p.call(s, "get_order_details", args); code != http.StatusOK {
				t.Errorf("call in %s with its token: %d %v, want 200", s.ID, code, out)
			}
		}

		// Closed: the parent's DELETE ends its token's forks, and theirs; a fork made with a key stays.
		parent := p.open(nil)
		f1 := p.fork(parent, parent.Token, nil)
		f2 := p.fork(f1, f1.Token, nil)
		byKey := p.fork(parent, p.key2, nil)
		for _, s := range []session{f1, f2, byKey} {
			works(s)
		}
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+parent.ID, parent.Token, nil); code != http.StatusOK || out["existed"] != true {
			t.Fatalf("close parent: %d %v", code, out)
		}
		for _, s := range []session{f1, f2} {
			refused(s, http.StatusUnauthorized)
			if st := status(s); st != schema.SessionClosed {
				t.Errorf("fork %s is %s after its parent closed, want closed", s.ID, st)
			}
		}
		works(byKey)
		// …and ends with its key.
		k2, _, err := store.ResolveKey(ctx, p.db, p.key2)
		if err != nil {
			t.Fatal(err)
		}
		if code, out := p.do(http.MethodDelete, "/v1/keys/"+k2.ID, p.key, nil); code != http.StatusOK {
			t.Fatalf("revoke key2: %d %v", code, out)
		}
		if code, out := p.call(byKey, "get_order_details", args); code != http.StatusUnauthorized {
			t.Errorf("the fork of a revoked key: %d %v, want 401", code, out)
		}

		// Expired: a parent the reaper expires takes its token's forks with it, even a fork still in use.
		parent = p.open(nil)
		f1 = p.fork(parent, parent.Token, nil)
		later := time.Now().Add(90 * time.Minute)
		if _, err := p.db.NewInsert().Model(&schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: f1.ID, Seq: 1,
			Tool: "get_order_details", Arguments: json.RawMessage(`{"order_id":"#W0000001"}`), Fidelity: schema.FidelityAExecuted,
			Rung: "provided", StateHash: "sha256:x", CreatedAt: later.UTC()}).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		a := &activities.Sessions{DB: p.db, Twins: p.twins, Reaper: p.tp}
		if _, err := a.ReapIdleSessions(ctx, activities.ReapInput{Now: later.Add(time.Minute), Idle: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if st := status(parent); st != schema.SessionExpired {
			t.Fatalf("parent is %s after the reap, want expired", st)
		}
		refused(f1, http.StatusNotFound)
		if st := status(f1); st != schema.SessionExpired {
			t.Errorf("fork is %s after its parent expired, want expired", st)
		}

		// A parent ended without its forks (a process died between the two): the fork's token is refused at once,
		// and the reaper ends it.
		parent = p.open(nil)
		f1 = p.fork(parent, parent.Token, nil)
		if _, err := store.EndSession(ctx, p.db, parent.ID, schema.SessionClosed); err != nil {
			t.Fatal(err)
		}
		p.tp.Tokens().ForgetAll() // as another process would see it: nothing cached
		if code, out := p.call(f1, "get_order_details", args); code != http.StatusUnauthorized {
			t.Errorf("fork of an ended parent before the reaper: %d %v, want 401", code, out)
		}
		if _, err := a.ReapIdleSessions(ctx, activities.ReapInput{Now: time.Now(), Idle: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if st := status(f1); st != schema.SessionClosed {
			t.Errorf("orphaned fork is %s after the reap, want closed", st)
		}
	})
}

// A fork made with a session token inherits its parent's opener: revoking the key that opened the parent refuses
// the parent's token and every fork's it made, but not a fork made with another key.
func TestForkTokensEndWithTheParentsKey(t *testing.T) {
	ctx := context.Background()
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	kRow, k, err := store.CreateKey(ctx, p.db, p.ws.ID, cred.KindWorkspace, "agent")
	if err != nil {
		t.Fatal(err)
	}
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", k, nil)
	if code != http.StatusCreated {
		t.Fatalf("open: %d %v", code, out)
	}
	parent := session{ID: str(out["sessionId"]), Token: str(out["token"])}
	f := p.fork(parent, parent.Token, nil)
	other := p.fork(parent, p.key, nil)
	if code, out := p.do(http.MethodDelete, "/v1/keys/"+kRow.ID, p.key, nil); code != http.StatusOK {
		t.Fatalf("revoke: %d %v", code, out)
	}
	for _, s := range []session{parent, f} {
		if code, _ := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusUnauthorized {
			t.Errorf("%s's token after its opener was revoked: %d, want 401", s.ID, code)
		}
	}
	if code, out := p.call(other, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK {
		t.Errorf("a fork made with another key: %d %v, want 200", code, out)
	}
}

// A fork made with a session token while another process ends its parent (the parent read open, the row then
// ended) ends at once, and the fork is refused: the parent's end never misses it.
func TestForkRacingItsParentsEnd(t *testing.T) {
	ctx := context.Background()
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	parent := p.open(nil)
	row, err := store.GetSession(ctx, p.db, p.ws.ID, parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.EndSession(ctx, p.db, parent.ID, schema.SessionClosed); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tp.Fork(ctx, row, toolplane.ForkRequest{}); err == nil {
		t.Fatal("a fork made with the token of a session that ended meanwhile was answered")
	}
	forks, err := store.ListSessions(ctx, p.db, p.env.ID, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if f.ForkedFrom == parent.ID && f.Status == schema.SessionOpen {
			t.Errorf("fork %s of the ended session is open", f.ID)
		}
	}
}
