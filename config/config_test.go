package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func load(t *testing.T, environ []string, args ...string) (*Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse flags: %v", err)
	}
	return Load(fs, environ)
}

func TestDefaults(t *testing.T) {
	c, err := load(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.DB.Driver != "sqlite" || c.DB.DSN != "file:"+filepath.Join("doppel-data", "doppel.db") {
		t.Errorf("db = %+v, want sqlite under the data dir", c.DB)
	}
	if c.Blob.Dir != filepath.Join("doppel-data", "blobs") {
		t.Errorf("blob.dir = %q", c.Blob.Dir)
	}
	if c.Session.Idle != time.Hour {
		t.Errorf("session.idle = %s, want 1h", c.Session.Idle)
	}
	if c.API.PublicURL != "http://127.0.0.1:8080" {
		t.Errorf("api.public_url = %q", c.API.PublicURL)
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "doppel.yaml")
	yaml := "api:\n  addr: 127.0.0.1:9001\nlog:\n  level: warn\ntwin:\n  idle: 5m\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{"DOPPEL_CONFIG=" + file, "DOPPEL_LOG_LEVEL=debug", "DOPPEL_TWIN_IDLE=7m", "DOPPEL_TEST_POSTGRES=ignored"}
	c, err := load(t, environ, "--twin-idle=9m")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key       string
		got, want any
	}{
		{"api.addr (file over default)", c.API.Addr, "127.0.0.1:9001"},
		{"log.level (env over file)", c.Log.Level, "debug"},
		{"twin.idle (flag over env)", c.Twin.Idle, 9 * time.Minute},
		{"api.public_url (derived)", c.API.PublicURL, "http://127.0.0.1:9001"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.key, tt.got, tt.want)
		}
	}
}

func TestInvalidNamesKey(t *testing.T) {
	tests := []struct {
		environ []string
		args    []string
		key     string
	}{
		{[]string{"DOPPEL_DB_DRIVER=mysql"}, nil, "db.driver"},
		{[]string{"DOPPEL_DB_DRIVER=postgres"}, nil, "db.dsn"},
		{nil, []string{"--api-addr=nonsense"}, "api.addr"},
		{[]string{"DOPPEL_BOOTSTRAP_KEY=secret"}, nil, "bootstrap_key"},
		{[]string{"DOPPEL_BLOB_DRIVER=s3"}, nil, "blob.endpoint"},
		{[]string{"DOPPEL_TWIN_DRIVER=vm"}, nil, "twin.driver"},
		{[]string{"DOPPEL_MODEL_BASE_URL=http://127.0.0.1:1/v1"}, nil, "model.name"},
		{[]string{"DOPPEL_SESSION_IDLE=0s"}, nil, "session.idle"},
		{[]string{"DOPPEL_RUNTIME_GC_PERCENT=0"}, nil, "runtime.gc_percent"},
		{[]string{"DOPPEL_RUNTIME_MEMORY_BYTES=-1"}, nil, "runtime.memory_bytes"},
	}
	for _, tt := range tests {
		_, err := load(t, tt.environ, tt.args...)
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%v %v: err = %v, want a FieldError", tt.environ, tt.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.key+":") {
			t.Errorf("%v %v: err = %v, want it to name %s", tt.environ, tt.args, err, tt.key)
		}
	}
}

func TestUnknownFileKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "doppel.yaml")
	if err := os.WriteFile(file, []byte("api:\n  adress: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := load(t, nil, "--config="+file)
	if err == nil || !strings.Contains(err.Error(), `"api.adress"`) {
		t.Fatalf("err = %v, want it to name api.adress", err)
	}
}

func TestBadDuration(t *testing.T) {
	_, err := load(t, []string{"DOPPEL_TWIN_IDLE=soon"})
	if err == nil || !strings.Contains(err.Error(), "twin.idle") {
		t.Fatalf("err = %v, want it to name twin.idle", err)
	}
}

func TestPlansFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "doppel.yaml")
	yaml := "usage:\n  default_plan: free\nplans:\n  free: {task_minutes: 600, open_sessions: 5, card_lifts: true, entitlements: [query]}\n  team:\n    task_minutes: 60000\n    model_tokens: 2000000\n    queries: 50\n    tool_calls: 9\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, nil, "--config="+file)
	if err != nil {
		t.Fatal(err)
	}
	free, team := c.Plans["free"], c.Plans["team"]
	if c.Usage.DefaultPlan != "free" || free.TaskMinutes != 600 || free.OpenSessions != 5 || !free.CardLifts ||
		len(free.Entitlements) != 1 || free.Entitlements[0] != "query" || team.TaskMinutes != 60000 || team.CardLifts ||
		team.ModelTokens != 2000000 || team.Queries != 50 || team.ToolCalls != 9 {
		t.Fatalf("plans = %+v, default %q", c.Plans, c.Usage.DefaultPlan)
	}
	// A plan field that does not exist, a negative limit, a default plan that is not configured, a short admin key: each
	// named.
	for bad, key := range map[string]string{
		"plans:\n  free:\n    task_minuts: 1\n":              `"plans.free.task_minuts"`,
		"usage:\n  default_plan: gold\n":                     "usage.default_plan",
		"admin:\n  key: short\n":                             "admin.key",
		"plans:\n  free:\n    entitlements: [mcp, coffee]\n": "plans.free.entitlements",
		"plans:\n  free:\n    model_tokens: -1\n":            "plans.free: limits must not be negative",
		"plans:\n  free:\n    queries: -1\n":                 "plans.free: limits must not be negative",
	} {
		if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := load(t, nil, "--config="+file); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: err = %v, want it to name %s", bad, err, key)
		}
	}
}

// The GC target and the soft memory limit come from runtime.gc_percent and runtime.memory_bytes unless the
// environment's GOGC or GOMEMLIMIT set them; a limit of 0 leaves the runtime without one.
func TestRuntimeEffective(t *testing.T) {
	for _, tt := range []struct {
		name    string
		environ []string
		gc      int
		mem     int64
	}{
		{"defaults", nil, 400, 1920 << 20},
		{"configured", []string{"DOPPEL_RUNTIME_GC_PERCENT=150", "DOPPEL_RUNTIME_MEMORY_BYTES=1073741824"}, 150, 1 << 30},
		{"no limit", []string{"DOPPEL_RUNTIME_MEMORY_BYTES=0"}, 400, 0},
		{"GOGC wins", []string{"GOGC=50"}, 0, 1920 << 20},
		{"GOMEMLIMIT wins", []string{"GOMEMLIMIT=3GiB", "DOPPEL_RUNTIME_MEMORY_BYTES=1073741824"}, 400, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(nil, tt.environ)
			if err != nil {
				t.Fatal(err)
			}
			gc, mem := cfg.Runtime.Effective(tt.environ)
			if gc != tt.gc || mem != tt.mem {
				t.Errorf("Effective = %d, %d; want %d, %d", gc, mem, tt.gc, tt.mem)
			}
		})
	}
}
