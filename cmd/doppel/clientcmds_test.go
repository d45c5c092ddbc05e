package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

func TestKeysCLI(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	const boot = "mk_live_clitestclitestclitestclitest0123"
	if _, _, err := store.Bootstrap(ctx, db, store.BootstrapOptions{Key: boot}); err != nil {
		t.Fatal(err)
	}
	h, _ := api.New(api.Options{DB: db})
	srv := httptest.NewServer(h)
	defer srv.Close()

	cli := func(args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		err := run(ctx, args, []string{"DOPPEL_URL=" + srv.URL, "DOPPEL_KEY=" + boot}, &out, &errb)
		return out.String(), errb.String(), err
	}

	created, notice, err := cli("keys", "create", "--name", "ci")
	if err != nil {
		t.Fatalf("keys create: %v (%s)", err, notice)
	}
	newKey := strings.TrimSpace(created)
	if !strings.HasPrefix(newKey, "mk_live_") || !strings.Contains(notice, "shown once") {
		t.Fatalf("create printed %q / %q", created, notice)
	}
	mcp, _, err := cli("keys", "create", "--name", "agent", "--kind", "mcp")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(mcp), "mcp_at_") {
		t.Fatalf("create mcp: %q %v", mcp, err)
	}

	list, _, err := cli("keys", "list", "--key", newKey)
	if err != nil {
		t.Fatalf("list with the new key: %v", err)
	}
	if !strings.Contains(list, "ci") || !strings.Contains(list, "bootstrap") || strings.Contains(list, newKey) {
		t.Fatalf("list = %s (must name both keys and never print a plaintext)", list)
	}
	var id string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "ci" {
			id = f[0]
		}
	}
	if !strings.HasPrefix(id, "key_") {
		t.Fatalf("no id for the ci key in %s", list)
	}
	if out, _, err := cli("keys", "revoke", id); err != nil || !strings.Contains(out, id) {
		t.Fatalf("revoke: %q %v", out, err)
	}
	_, _, err = cli("keys", "list", "--key", newKey)
	var ae *apiError
	if err == nil || !asAPIError(err, &ae) || ae.Status != 401 {
		t.Fatalf("a revoked key listed keys: err = %v", err)
	}

	if _, _, err := cli("keys", "frobnicate"); err == nil || !strings.Contains(err.Error(), "unknown keys verb") {
		t.Errorf("unknown verb: %v", err)
	}
	if err := run(ctx, []string{"keys", "list"}, []string{"DOPPEL_URL=" + srv.URL}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "no workspace key") {
		t.Errorf("missing key: %v", err)
	}
}

func asAPIError(err error, target **apiError) bool {
	ae, ok := err.(*apiError)
	if ok {
		*target = ae
	}
	return ok
}

func TestUnknownCommandAndHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), nil, nil, &out, &errb); err != nil || !strings.Contains(out.String(), "Local commands:") {
		t.Fatalf("help: %v %q", err, out.String())
	}
	// A command that is neither local nor a verb of the server's registry is a usage error (exit 2).
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"verbs":[]}`))
	}))
	defer reg.Close()
	err := run(context.Background(), []string{"nope"}, []string{"DOPPEL_URL=" + reg.URL}, &out, &errb)
	if _, ok := err.(usageError); !ok {
		t.Fatalf("unknown command: %v, want a usage error (exit 2)", err)
	}
}

func TestConfigErrorNamesKey(t *testing.T) {
	err := run(context.Background(), []string{"migrate"}, []string{"DOPPEL_DB_DRIVER=oracle"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "db.driver") {
		t.Fatalf("err = %v, want it to name db.driver", err)
	}
}

func TestServerTimingParse(t *testing.T) {
	for _, tt := range []struct {
		header string
		want   []stage
	}{
		{"twin;dur=0.07, journal;dur=0.512, total;dur=0.69", []stage{{"twin", 70 * time.Microsecond}, {"journal", 512 * time.Microsecond}, {"total", 690 * time.Microsecond}}},
		{"cache;desc=hit, db;dur=2", []stage{{"db", 2 * time.Millisecond}}},
		{"", nil},
		{"twin;dur=x, ;dur=1", nil},
	} {
		if got := serverTiming(tt.header); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("serverTiming(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}
