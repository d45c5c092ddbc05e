package infer

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

var updateWorld = flag.Bool("update-world", false, "rewrite testdata/materialized_world.golden")

// retailRuntime builds the retail twin with the given config.
func retailRuntime(t *testing.T, cfg Config) *twin.Runtime {
	t.Helper()
	b, _, err := Build(loadTraces(t, "tau-retail-dev.json"), Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func mustCall(t *testing.T, s *twin.Session, tool, args string) twin.Result {
	t.Helper()
	r, err := s.Call(context.Background(), tool, []byte(args))
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return r
}

func decodeObj(t *testing.T, text string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("not a JSON object: %v: %.200s", err, text)
	}
	return m
}

func hasRow(rt *twin.Runtime, table, key string) bool {
	for _, tb := range rt.Bundle().Tables {
		if tb.Name != table {
			continue
		}
		for _, r := range tb.Rows {
			if r.Key == key {
				return true
			}
		}
	}
	return false
}

// An unknown user id in the recorded format materializes, with the name the id embeds, labelled B_inferred,
// and stays: the second read answers the same row.
func TestOpenWorldUserHasTheNameItsIDEmbeds(t *testing.T) {
	rt := retailRuntime(t, Config{})
	const id = "james_sanchez_3954"
	if hasRow(rt, "users", id) {
		t.Fatalf("%s is in the base world: pick an id the traces never showed", id)
	}
	s, _, err := rt.Open(twin.SessionSpec{Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	r := mustCall(t, s, "get_user_details", `{"user_id":"`+id+`"}`)
	if r.Error || r.Fidelity != twin.FidelityInferred {
		t.Fatalf("answer %+v, want a B_inferred user", r)
	}
	name, _ := decodeObj(t, r.Content)["name"].(map[string]any)
	if name["first_name"] != "James" || name["last_name"] != "Sanchez" {
		t.Errorf("name = %v, want James Sanchez (from the id)", name)
	}
	if u := decodeObj(t, r.Content)["user_id"]; u != id {
		t.Errorf("user_id = %v, want %s", u, id)
	}
	// Its email spells the same names (the model row's spelled another user's), and a search by it finds it.
	email, _ := decodeObj(t, r.Content)["email"].(string)
	if !strings.HasPrefix(email, "james.sanchez") {
		t.Errorf("email = %q, want james.sanchez… (the names the id embeds)", email)
	}
	if found := mustCall(t, s, "find_user_id_by_email", `{"email":"`+email+`"}`); strings.Trim(found.Content, `"`) != id {
		t.Errorf("find_user_id_by_email %s = %s, want %s", email, found.Content, id)
	}
	again := mustCall(t, s, "get_user_details", `{"user_id":"`+id+`"}`)
	if again.Content != r.Content || again.Fidelity != twin.FidelityTwin || again.Changed {
		t.Errorf("second read: %s (%s, changed %v), want the same row from the world, B_twin, unchanged", again.Content, again.Fidelity, again.Changed)
	}
	// An id not in the recorded format is not found, in an open world too.
	bad := mustCall(t, s, "get_user_details", `{"user_id":"James Sanchez"}`)
	if !bad.Error {
		t.Errorf("id outside the format: %+v, want the not-found error", bad)
	}
}

// A product the traces show only inside orders answers with the name and the variants those orders showed.
func TestProductSeenOnlyInOrdersKeepsItsNameAndVariants(t *testing.T) {
	rt := retailRuntime(t, Config{})
	var fact *twin.Row
	for _, tb := range rt.Bundle().Tables {
		if tb.Name == "products" && len(tb.Facts) > 0 {
			fact = &tb.Facts[0]
		}
	}
	if fact == nil {
		t.Fatal("no product known only from orders: the facts found none")
	}
	if hasRow(rt, "products", fact.Key) {
		t.Fatalf("fact %s is also a base row", fact.Key)
	}
	if len(fact.From) == 0 {
		t.Errorf("fact %s names no recorded mention", fact.Key)
	}
	want := decodeObj(t, fact.JSON)
	wantVariants, _ := want["variants"].(map[string]any)
	if want["name"] == nil || len(wantVariants) == 0 {
		t.Fatalf("fact %s: %s, want a name and variants", fact.Key, fact.JSON)
	}
	for _, world := range []string{twin.WorldOpen, twin.WorldClosed} {
		s, _, err := rt.Open(twin.SessionSpec{Seed: 3, World: world})
		if err != nil {
			t.Fatal(err)
		}
		r := mustCall(t, s, "get_product_details", `{"product_id":"`+fact.Key+`"}`)
		if r.Error {
			t.Fatalf("%s world: %s", world, r.Content)
		}
		got := decodeObj(t, r.Content)
		if got["name"] != want["name"] {
			t.Errorf("%s world: name %v, want %v", world, got["name"], want["name"])
		}
		gv, _ := got["variants"].(map[string]any)
		if len(gv) != len(wantVariants) {
			t.Errorf("%s world: %d variants, want exactly the %d the orders showed", world, len(gv), len(wantVariants))
		}
		for id, wv := range wantVariants {
			g, _ := gv[id].(map[string]any)
			for k, v := range wv.(map[string]any) {
				if !jsonEqual(g[k], v) {
					t.Errorf("%s world: variant %s %s = %v, want %v", world, id, k, g[k], v)
				}
			}
			if _, ok := g["available"]; !ok {
				t.Errorf("%s world: variant %s lacks the fields production's variants have: %v", world, id, g)
			}
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// In one session, find_user_id_by_name_zip and get_user_details agree about every user either returns.
func TestLookupAndReadAgreeInOneSession(t *testing.T) {
	rt := retailRuntime(t, Config{})
	s, _, err := rt.Open(twin.SessionSpec{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	// A user the lookup makes up is the user the read answers.
	found := mustCall(t, s, "find_user_id_by_name_zip", `{"first_name":"Zora","last_name":"Quill","zip":"12345"}`)
	if found.Error || found.Fidelity != twin.FidelityInferred {
		t.Fatalf("lookup: %+v, want a made-up user id", found)
	}
	id := strings.Trim(found.Content, `"`)
	if !strings.HasPrefix(id, "zora_quill_") {
		t.Errorf("made-up id %q does not embed the name", id)
	}
	u := decodeObj(t, mustCall(t, s, "get_user_details", `{"user_id":"`+id+`"}`).Content)
	name, _ := u["name"].(map[string]any)
	addr, _ := u["address"].(map[string]any)
	if name["first_name"] != "Zora" || name["last_name"] != "Quill" || addr["zip"] != "12345" {
		t.Errorf("user %s: name %v zip %v, want Zora Quill 12345", id, name, addr["zip"])
	}
	// A user the read makes up is the user the lookup finds.
	u2 := decodeObj(t, mustCall(t, s, "get_user_details", `{"user_id":"ada_vance_4242"}`).Content)
	n2, _ := u2["name"].(map[string]any)
	a2, _ := u2["address"].(map[string]any)
	args, _ := json.Marshal(map[string]any{"first_name": n2["first_name"], "last_name": n2["last_name"], "zip": a2["zip"]})
	again := mustCall(t, s, "find_user_id_by_name_zip", string(args))
	if strings.Trim(again.Content, `"`) != "ada_vance_4242" {
		t.Errorf("lookup of the made-up user's name and zip = %s, want ada_vance_4242", again.Content)
	}
}

// A closed world answers production's own not-found error for every unknown id, on every read tool.
func TestClosedWorldAnswersNotFound(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		world string
	}{
		{"build option", Config{World: twin.WorldClosed}, ""},
		{"session override", Config{}, twin.WorldClosed},
	} {
		t.Run(c.name, func(t *testing.T) {
			rt := retailRuntime(t, c.cfg)
			s, rc, err := rt.Open(twin.SessionSpec{Seed: 1, World: c.world})
			if err != nil {
				t.Fatal(err)
			}
			if rc.World != twin.WorldClosed || s.World() != twin.WorldClosed {
				t.Fatalf("receipts world %q, session %q, want closed", rc.World, s.World())
			}
			for _, call := range [][2]string{
				{"get_user_details", `{"user_id":"james_sanchez_3954"}`},
				{"get_order_details", `{"order_id":"#W0000001"}`},
				{"find_user_id_by_name_zip", `{"first_name":"Zora","last_name":"Quill","zip":"12345"}`},
			} {
				r := mustCall(t, s, call[0], call[1])
				if !r.Error || !strings.Contains(strings.ToLower(r.Content), "not found") {
					t.Errorf("%s %s: %+v, want production's not-found error", call[0], call[1], r)
				}
			}
			if n := s.OverlayRows(); n != 0 {
				t.Errorf("closed world holds %d rows beyond the base after reads of unknown ids", n)
			}
		})
	}
	rt := retailRuntime(t, Config{})
	if _, _, err := rt.Open(twin.SessionSpec{World: "ajar"}); err == nil || !strings.Contains(err.Error(), "world") {
		t.Errorf("world ajar: %v, want an error naming world", err)
	}
	if _, _, err := Build(nil, Options{Config: Config{World: "ajar"}}); err == nil || !strings.Contains(err.Error(), "config.world") {
		t.Errorf("build world ajar: %v, want an error naming config.world", err)
	}
}

// Same seed and instructions give the same world, materialized entities included: the hash after a fixed
// sequence of reads of unknown ids is pinned by testdata/materialized_world.golden.
func TestMaterializedWorldHashGolden(t *testing.T) {
	run := func() string {
		rt := retailRuntime(t, Config{})
		s, _, err := rt.Open(twin.SessionSpec{Seed: 42, SeedInstructions: "1 order with status pending"})
		if err != nil {
			t.Fatal(err)
		}
		mustCall(t, s, "get_user_details", `{"user_id":"james_sanchez_3954"}`)
		mustCall(t, s, "get_order_details", `{"order_id":"#W0000001"}`)
		mustCall(t, s, "find_user_id_by_name_zip", `{"first_name":"Zora","last_name":"Quill","zip":"12345"}`)
		return s.StateHash()
	}
	h1, h2 := run(), run()
	if h1 != h2 {
		t.Fatalf("same seed and instructions, two hashes: %s %s", h1, h2)
	}
	path := filepath.Join("testdata", "materialized_world.golden")
	if *updateWorld {
		if err := os.WriteFile(path, []byte(h1+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-world to write it)", err)
	}
	if strings.TrimSpace(string(want)) != h1 {
		t.Errorf("world hash %s, golden %s", h1, strings.TrimSpace(string(want)))
	}
}

// A session whose calls made entities up rebuilds, from its spec and journal, to the same world.
func TestMaterializedWorldRebuildsFromJournal(t *testing.T) {
	rt := retailRuntime(t, Config{})
	spec := twin.SessionSpec{Seed: 9}
	s, _, err := rt.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	var journal []twin.JournalEntry
	for _, c := range [][2]string{
		{"get_order_details", `{"order_id":"#W0000002"}`},
		{"get_user_details", `{"user_id":"ada_vance_4242"}`},
		{"find_user_id_by_name_zip", `{"first_name":"Zora","last_name":"Quill","zip":"12345"}`},
		{"cancel_pending_order", `{"order_id":"#W0000002","reason":"no longer needed"}`},
	} {
		r := mustCall(t, s, c[0], c[1])
		journal = append(journal, twin.JournalEntry{Tool: c[0], Args: json.RawMessage(c[1]), Content: r.Content, Rung: r.Rung, StateHash: r.StateHash})
	}
	if s.OverlayRows() == 0 {
		t.Fatal("no entity was made up")
	}
	rebuilt, _, err := rt.Rebuild(context.Background(), spec, journal)
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.StateHash() != s.StateHash() {
		t.Errorf("rebuilt world %s, original %s", rebuilt.StateHash(), s.StateHash())
	}
}

// Write preconditions the recordings show (cancel_pending_order refuses an order that is not pending) apply to
// entities made up for unknown ids: the write reads the same made-up row and answers as production would.
func TestPreconditionsApplyToMaterializedEntities(t *testing.T) {
	rt := retailRuntime(t, Config{})
	s, _, err := rt.Open(twin.SessionSpec{Seed: 21})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[bool]bool{}
	for i := 10; i < 60 && len(seen) < 2; i++ {
		id := fmt.Sprintf("#W00000%02d", i)
		o := decodeObj(t, mustCall(t, s, "get_order_details", `{"order_id":"`+id+`"}`).Content)
		pending := o["status"] == "pending"
		if seen[pending] {
			continue
		}
		seen[pending] = true
		r := mustCall(t, s, "cancel_pending_order", `{"order_id":"`+id+`","reason":"no longer needed"}`)
		switch {
		case pending && (r.Error || decodeObj(t, r.Content)["status"] != "cancelled"):
			t.Errorf("cancel of made-up pending order %s: %s, want it cancelled", id, r.Content)
		case !pending && !r.Error:
			t.Errorf("cancel of made-up %v order %s: %s, want production's refusal", o["status"], id, r.Content)
		}
	}
	if len(seen) < 2 {
		t.Fatalf("50 made-up orders were all pending=%v: the statuses do not follow the recorded distribution", seen)
	}
}

// A search by a field that spells the names an id embeds (an email) makes up the user those names name, or
// finds none when the world holds a user of those names under another email.
func TestEmailLookupNamesTheUserItSpells(t *testing.T) {
	rt := retailRuntime(t, Config{})
	s, _, err := rt.Open(twin.SessionSpec{Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	r := mustCall(t, s, "find_user_id_by_email", `{"email":"zora.quill5150@example.com"}`)
	id := strings.Trim(r.Content, `"`)
	if r.Error || !strings.HasPrefix(id, "zora_quill_") {
		t.Fatalf("lookup by email: %+v, want a made-up zora_quill_… id", r)
	}
	u := decodeObj(t, mustCall(t, s, "get_user_details", `{"user_id":"`+id+`"}`).Content)
	if name, _ := u["name"].(map[string]any); name["first_name"] != "Zora" || u["email"] != "zora.quill5150@example.com" {
		t.Errorf("user %s: %v, want Zora with the searched email", id, u)
	}
	// A base user, under an email that is not theirs: not found, not a second user of that name.
	var base string
	for _, tb := range rt.Bundle().Tables {
		if tb.Name == "users" && len(tb.Rows) > 0 {
			base = tb.Rows[0].Key
		}
	}
	parts := strings.Split(base, "_")
	wrong := mustCall(t, s, "find_user_id_by_email", `{"email":"`+parts[0]+"."+parts[1]+`0000@example.org"}`)
	if !wrong.Error {
		t.Errorf("email of known user %s with other digits: %+v, want not found", base, wrong)
	}
}

// Mentions of one entity merge into one fact row; a field two mentions disagree on keeps the later mention's
// value, and the build report counts the conflict.
func TestFactsMergeByRecency(t *testing.T) {
	order := func(id, user, name, price string) string {
		return `{"order_id": "` + id + `", "user_id": "` + user + `", "status": "pending", "items": [{"name": "` + name +
			`", "product_id": "1000000009", "item_id": "2000000001", "price": ` + price + `, "options": {"color": "red"}}]}`
	}
	product := `{"name": "Lamp", "product_id": "1000000001", "variants": {"2000000002": {"item_id": "2000000002", "options": {"color": "blue"}, "available": true, "price": 10.0}}}`
	traces := []trace.Trace{
		fakeTrace("t1", [3]string{"get_order_details", `{"order_id": "#W0000001"}`, order("#W0000001", "ann_lee_1111", "Smart Watch", "99.5")},
			[3]string{"get_product_details", `{"product_id": "1000000001"}`, product}),
		fakeTrace("t2", [3]string{"get_order_details", `{"order_id": "#W0000002"}`, order("#W0000002", "ann_lee_1111", "Smart Watch Pro", "99.5")}),
		fakeTrace("t3", [3]string{"get_order_details", `{"order_id": "#W0000003"}`, order("#W0000003", "bob_ray_2222", "Smart Watch Pro", "99.5")},
			[3]string{"get_user_details", `{"user_id": "bob_ray_2222"}`, `{"user_id": "bob_ray_2222", "name": {"first_name": "Bob", "last_name": "Ray"}, "orders": ["#W0000003"]}`},
			[3]string{"get_user_details", `{"user_id": "cyd_foxworth_33"}`, `{"user_id": "cyd_foxworth_33", "name": {"first_name": "Cyd", "last_name": "Foxworth"}, "orders": []}`}),
	}
	b, rep, err := Build(traces, Options{})
	if err != nil {
		t.Fatal(err)
	}
	facts := map[string]twin.Row{}
	for _, tb := range b.Tables {
		for _, r := range tb.Facts {
			facts[tb.Name+" "+r.Key] = r
		}
	}
	p, ok := facts["products 1000000009"]
	if !ok {
		t.Fatalf("no fact row for the product seen only in orders: %v", facts)
	}
	got := decodeObj(t, p.JSON)
	if got["name"] != "Smart Watch Pro" {
		t.Errorf("product name %v, want the later mention's Smart Watch Pro", got["name"])
	}
	if v, _ := got["variants"].(map[string]any); !jsonEqual(v["2000000001"], map[string]any{"item_id": "2000000001", "price": 99.5, "options": map[string]any{"color": "red"}}) {
		t.Errorf("product variants %v, want the ordered item as its variant", got["variants"])
	}
	if len(p.From) != 3 || p.From[0] != "t1#0" {
		t.Errorf("provenance %v, want the three mentions, first t1#0", p.From)
	}
	if rep.Facts == nil || rep.Facts.Conflicts != 1 || len(rep.Facts.Examples) != 1 || rep.Facts.Examples[0].Field != "name" ||
		rep.Facts.Examples[0].Kept != `"Smart Watch Pro"` || rep.Facts.Examples[0].Dropped != `"Smart Watch"` {
		t.Errorf("facts report %+v, want one name conflict kept by recency", rep.Facts)
	}
	u, ok := facts["users ann_lee_1111"]
	if !ok {
		t.Fatalf("no fact row for the user the orders name: %v", facts)
	}
	if uo := decodeObj(t, u.JSON)["orders"]; !jsonEqual(uo, []any{"#W0000001", "#W0000002"}) {
		t.Errorf("user ann_lee_1111 orders %v, want both orders naming them", uo)
	}
}

// A made-up user's payment methods are its own: each key is drawn in the recorded format of such keys (digits
// redrawn), held by no user the world knows, and each member's id is its key; the members keep a recorded shape.
func TestMaterializedMapKeysAreFresh(t *testing.T) {
	rt := retailRuntime(t, Config{})
	known := map[string]bool{}
	formats := map[string]bool{}
	for _, tb := range rt.Bundle().Tables {
		if tb.Name != "users" {
			continue
		}
		for _, r := range tb.Rows {
			pm, _ := decodeObj(t, r.JSON)["payment_methods"].(map[string]any)
			for k := range pm {
				known[k] = true
				formats[strings.TrimRight(k, "0123456789")] = true
			}
		}
	}
	if len(known) == 0 {
		t.Fatal("no recorded payment methods")
	}
	s, _, err := rt.Open(twin.SessionSpec{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	r := mustCall(t, s, "get_user_details", `{"user_id":"zora_quill_4821"}`)
	if r.Error || r.Fidelity != twin.FidelityInferred {
		t.Fatalf("answer %+v, want a B_inferred user", r)
	}
	pm, _ := decodeObj(t, r.Content)["payment_methods"].(map[string]any)
	if len(pm) == 0 {
		t.Fatalf("made-up user has no payment methods: %s", r.Content)
	}
	for k, v := range pm {
		if known[k] {
			t.Errorf("payment method %s belongs to a recorded user", k)
		}
		if !formats[strings.TrimRight(k, "0123456789")] {
			t.Errorf("payment method %s is in no recorded format", k)
		}
		if m, _ := v.(map[string]any); m["id"] != k {
			t.Errorf("payment method %s has id %v", k, m["id"])
		}
	}
}

// A refusal the kind of an id explains applies to made-up entities too: every recorded update paid with a
// certificate was refused, so an update of a reservation made up in this session, paid with a certificate no
// recording names, is refused with production's text.
func TestRefusalByIDKindOnMadeUpReservation(t *testing.T) {
	b, _, err := Build(loadTraces(t, "tau-airline-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const id = "ZQ4K7P"
	if hasRow(rt, "reservations", id) {
		t.Fatalf("%s is in the base world", id)
	}
	s, _, err := rt.Open(twin.SessionSpec{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r := mustCall(t, s, "get_reservation_details", `{"reservation_id":"`+id+`"}`); r.Error || r.Fidelity != twin.FidelityInferred {
		t.Fatalf("read: %+v, want a made-up reservation", r)
	}
	call := `{"reservation_id":"` + id + `","cabin":"economy","flights":[{"flight_number":"HAT001","date":"2024-05-20"}],"payment_id":"%s"}`
	r := mustCall(t, s, "update_reservation_flights", fmt.Sprintf(call, "certificate_1234567"))
	if !r.Error || r.Content != "Error: certificate cannot be used to update reservation" {
		t.Errorf("update paid by certificate: %+v, want production's refusal", r)
	}
	if r := mustCall(t, s, "update_reservation_flights", fmt.Sprintf(call, "credit_card_1234567")); r.Content == "Error: certificate cannot be used to update reservation" {
		t.Errorf("update paid by credit card refused as a certificate: %+v", r)
	}
}

// A made-up entity's foreign keys agree both ways, in one session: a made-up user lists orders of its own, each
// of which, read, names that user; a made-up order's user, read, lists it, and so do that user's other orders; an
// order a held row lists (a user the session wrote) is that user's when first read, not a new owner's.
func TestMaterializedForeignKeysAgree(t *testing.T) {
	rt := retailRuntime(t, Config{})
	ordersOf := func(s *twin.Session, user string) []string {
		t.Helper()
		u := decodeObj(t, mustCall(t, s, "get_user_details", `{"user_id":"`+user+`"}`).Content)
		var out []string
		for _, o := range u["orders"].([]any) {
			out = append(out, o.(string))
		}
		return out
	}
	ownerOf := func(s *twin.Session, order string) string {
		t.Helper()
		r := mustCall(t, s, "get_order_details", `{"order_id":"`+order+`"}`)
		if r.Error {
			t.Fatalf("order %s: %s", order, r.Content)
		}
		u, _ := decodeObj(t, r.Content)["user_id"].(string)
		return u
	}
	cases := []struct {
		name  string
		first func(s *twin.Session) string // answers the user whose orders are checked
	}{
		{"made-up user, then its orders", func(s *twin.Session) string { return "james_sanchez_3954" }},
		{"made-up order, then its user", func(s *twin.Session) string {
			u := ownerOf(s, "#W0000031")
			if !slices.Contains(ordersOf(s, u), "#W0000031") {
				t.Errorf("made-up order #W0000031 names %s, whose orders do not list it", u)
			}
			return u
		}},
		{"an order a held user lists", func(s *twin.Session) string {
			const user = "yusuf_rossi_9620"
			row, ok := s.Row("users", user)
			if !ok {
				t.Fatalf("%s is not in the base world", user)
			}
			var u map[string]any
			if err := json.Unmarshal(row, &u); err != nil {
				t.Fatal(err)
			}
			u["orders"] = append(u["orders"].([]any), "#W0000042")
			o, err := jsonvalue.ParseString(mustJSON(t, u))
			if err != nil {
				t.Fatal(err)
			}
			s.PutRow("users", user, o.(*jsonvalue.Object))
			return user
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _, err := rt.Open(twin.SessionSpec{Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			user := c.first(s)
			orders := ordersOf(s, user)
			if len(orders) == 0 {
				t.Fatalf("%s lists no orders", user)
			}
			for _, o := range orders {
				if got := ownerOf(s, o); got != user {
					t.Errorf("%s lists %s, which names user %s", user, o, got)
				}
			}
			if again := ordersOf(s, user); !slices.Equal(again, orders) {
				t.Errorf("%s lists %v after its orders were read, %v before", user, again, orders)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
