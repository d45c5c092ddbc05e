package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/twinstate"
)

// A child process started by TestMigrateConcurrentProcesses migrates and prints what it applied.
func TestMain(m *testing.M) {
	if driver := os.Getenv("DOPPEL_SCHEMA_CHILD_DRIVER"); driver != "" {
		ctx := context.Background()
		db, err := schema.Open(ctx, schema.Options{Driver: driver, DSN: os.Getenv("DOPPEL_SCHEMA_CHILD_DSN")})
		if err != nil {
			fmt.Fprintln(os.Stderr, "open:", err)
			os.Exit(2)
		}
		applied, err := schema.Apply(ctx, db)
		db.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "migrate:", err)
			os.Exit(3)
		}
		fmt.Printf("applied=%d\n", len(applied))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestMigrationsMatchAcrossDialects(t *testing.T) {
	lite, err := schema.Migrations(schema.DriverSQLite)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := schema.Migrations(schema.DriverPostgres)
	if err != nil {
		t.Fatal(err)
	}
	byBunName, err := schema.Migrations("pg") // db.Dialect().Name().String() on PostgreSQL
	if err != nil || len(byBunName) != len(pg) {
		t.Fatalf("Migrations(\"pg\") = %d, %v; want the postgres set", len(byBunName), err)
	}
	if _, err := schema.Migrations("mysql"); err == nil {
		t.Error("Migrations(mysql) succeeded")
	}
	if len(lite) == 0 || len(lite) != len(pg) {
		t.Fatalf("sqlite has %d migrations, postgres %d", len(lite), len(pg))
	}
	for i := range lite {
		if lite[i].Version != pg[i].Version || lite[i].Name != pg[i].Name {
			t.Errorf("migration %d: sqlite %04d_%s, postgres %04d_%s", i, lite[i].Version, lite[i].Name, pg[i].Version, pg[i].Name)
		}
		if lite[i].Version != i+1 {
			t.Errorf("migration %d has version %d, want %d (no gaps)", i, lite[i].Version, i+1)
		}
	}
	// Every table of the postgres file exists in the sqlite file. SQLite changes a table's constraints by making it
	// anew under another name and renaming that: such a table is not a new one.
	re := regexp.MustCompile(`CREATE TABLE (\w+)`)
	renamed := regexp.MustCompile(`ALTER TABLE (\w+) RENAME TO`)
	created := func(sql string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(sql, -1) {
			if !slices.ContainsFunc(renamed.FindAllStringSubmatch(sql, -1), func(r []string) bool { return r[1] == m[1] }) {
				out = append(out, m[1])
			}
		}
		return out
	}
	for i := range lite {
		got := created(lite[i].SQL)
		want := created(pg[i].SQL)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("migration %d tables: sqlite %v, postgres %v", lite[i].Version, got, want)
		}
	}
}

func openDSN(t *testing.T, driver string) (string, *bun.DB) {
	t.Helper()
	var dsn string
	if driver == schema.DriverSQLite {
		dsn = schematest.SQLiteDSN(t)
	} else {
		dsn = schematest.PostgresDSN(t)
	}
	db, err := schema.Open(context.Background(), schema.Options{Driver: driver, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return dsn, db
}

func TestMigrateIdempotent(t *testing.T) {
	ctx := context.Background()
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			_, db := openDSN(t, driver)
			migs, _ := schema.Migrations(driver)
			first, err := schema.Apply(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			if len(first) != len(migs) {
				t.Fatalf("first run applied %v, want all %d", first, len(migs))
			}
			second, err := schema.Apply(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			if len(second) != 0 {
				t.Fatalf("second run applied %v, want none", second)
			}
			v, err := schema.Version(ctx, db)
			if err != nil || v != migs[len(migs)-1].Version {
				t.Fatalf("Version = %d, %v; want %d", v, err, migs[len(migs)-1].Version)
			}
			for _, m := range schema.Models() {
				if n, err := db.NewSelect().Model(m).Count(ctx); err != nil || n != 0 {
					t.Errorf("count %T = %d, %v", m, n, err)
				}
			}
		})
	}
}

func TestMigrateRefusesNewerDatabase(t *testing.T) {
	ctx := context.Background()
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			_, db := openDSN(t, driver)
			if err := schema.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO doppel_migrations (version, name, applied_at) VALUES (9999, 'future', 'x')"); err != nil {
				t.Fatal(err)
			}
			err := schema.Migrate(ctx, db)
			if err == nil || !strings.Contains(err.Error(), "9999") {
				t.Fatalf("Migrate over a newer database = %v, want an error naming version 9999", err)
			}
		})
	}
}

// Several processes migrate one database at once: all succeed, exactly one applies the migrations.
func TestMigrateConcurrentProcesses(t *testing.T) {
	for _, driver := range schematest.Drivers() {
		t.Run(driver, func(t *testing.T) {
			dsn, db := openDSN(t, driver)
			migs, _ := schema.Migrations(driver)
			const procs = 3
			var wg sync.WaitGroup
			outs := make([]string, procs)
			errs := make([]error, procs)
			for i := range procs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(), "DOPPEL_SCHEMA_CHILD_DRIVER="+driver, "DOPPEL_SCHEMA_CHILD_DSN="+dsn)
					out, err := cmd.CombinedOutput()
					outs[i], errs[i] = string(out), err
				}()
			}
			wg.Wait()
			appliedAll := 0
			for i := range procs {
				if errs[i] != nil {
					t.Fatalf("migrator %d: %v\n%s", i, errs[i], outs[i])
				}
				switch {
				case strings.Contains(outs[i], fmt.Sprintf("applied=%d\n", len(migs))):
					appliedAll++
				case strings.Contains(outs[i], "applied=0\n"):
				default:
					t.Fatalf("migrator %d applied a part: %q", i, outs[i])
				}
			}
			if appliedAll != 1 {
				t.Fatalf("%d migrators applied the migrations, want exactly 1: %q", appliedAll, outs)
			}
			n, err := db.NewSelect().Table("doppel_migrations").Count(context.Background())
			if err != nil || int(n) != len(migs) {
				t.Fatalf("doppel_migrations rows = %d, %v; want %d", n, err, len(migs))
			}
		})
	}
}

func TestOpenRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts schema.Options
		want string
	}{
		{"unknown driver", schema.Options{Driver: "mysql", DSN: "x"}, `driver "mysql"`},
		{"empty sqlite dsn", schema.Options{Driver: "sqlite"}, "sqlite DSN is empty"},
		{"empty postgres dsn", schema.Options{Driver: "postgres"}, "postgres DSN is empty"},
		{"postgres dsn not a url", schema.Options{Driver: "postgres", DSN: "host=x"}, "postgres:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, err := schema.Open(context.Background(), tt.opts)
			if err == nil {
				db.Close()
				t.Fatalf("Open(%+v) succeeded, want error containing %q", tt.opts, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSQLitePragmas(t *testing.T) {
	_, db := openDSN(t, schema.DriverSQLite)
	ctx := context.Background()
	var mode string
	var fk, busy int
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 10000 {
		t.Errorf("busy_timeout = %d, %v; want 10000", busy, err)
	}
	var auto int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&auto); err != nil || auto != 0 {
		t.Errorf("wal_autocheckpoint = %d, %v; want 0 (checkpoints run in the background)", auto, err)
	}
}

// TestSQLiteBackgroundCheckpoint: with SQLite's automatic checkpoint off, what is committed still reaches the
// database file, by the background checkpointer, without another write or a close.
func TestSQLiteBackgroundCheckpoint(t *testing.T) {
	dsn, db := openDSN(t, schema.DriverSQLite)
	ctx := context.Background()
	path, _, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v TEXT)"); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := db.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", strings.Repeat(fmt.Sprint(i), 500)); err != nil {
			t.Fatal(err)
		}
	}
	// 200 rows of ~1 KB are ~50 pages: they sit in the WAL until a checkpoint copies them to the file.
	for i := 0; ; i++ {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() >= before.Size()+100<<10 {
			break
		}
		if i > 400 { // 20 s: the checkpointer runs every 250 ms
			t.Fatalf("database file still %d bytes (was %d): the WAL was never checkpointed", st.Size(), before.Size())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var rfc3339Micro = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

// Every model survives a round trip on both dialects, times at microsecond precision in UTC.
func TestModelsRoundTrip(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 22, 3, 4, 5, 123456789, time.FixedZone("CET", 3600))
	us := at.Truncate(time.Microsecond)
	later := us.Add(90 * time.Minute)
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := &schema.Workspace{ID: schema.NewID(schema.PrefixWorkspace), Name: "acme", Access: schema.AccessPending, CreatedAt: at}
		key := &schema.APIKey{ID: schema.NewID(schema.PrefixKey), WorkspaceID: ws.ID, Kind: schema.KeyKindMCP, Hash: "ab12", Prefix: "mcp_at_ab…", Name: "ci", CreatedAt: at, RevokedAt: &later}
		env := &schema.Environment{ID: schema.NewID(schema.PrefixEnv), WorkspaceID: ws.ID, Slug: "retail", Name: "Retail", Status: schema.EnvReady,
			Framework: "openai-agents", Language: "python", NTraces: 7, NTools: 3, SchemaSource: "traces", CoveredPct: 87.5, SimulatedPct: 2.25,
			HasAgent: true, Headline: "h", CollectedBytes: 1 << 40, TwinState: twinstate.Booting, TwinEndpoint: "http://127.0.0.1:1", CreatedAt: at, UpdatedAt: later}
		bld := &schema.Build{ID: schema.NewID(schema.PrefixBuild), EnvID: env.ID, WorkspaceID: ws.ID, Status: schema.BuildSucceeded, Progress: 1,
			Stage: "done", BundleKey: "bundles/x", BundleHash: "sha256:00", Report: json.RawMessage(`{"tools":{"a":1}}`), Error: "", WorkflowID: "wf", CreatedAt: at, StartedAt: &us, FinishedAt: &later, UpdatedAt: later}
		env.ActiveBuildID = bld.ID
		tb := &schema.TraceBatch{ID: schema.NewID(schema.PrefixTraceBatch), EnvID: env.ID, BlobKey: "traces/sha256-x", NTraces: 2, NDuplicates: 1, Bytes: 99, ToolsSeen: []string{"find", "get"}, CreatedAt: at}
		tr := &schema.Trace{EnvID: env.ID, TraceID: "t-1", BatchID: tb.ID, Idx: 1, CreatedAt: at}
		ses := &schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: env.ID, WorkspaceID: ws.ID, BuildID: bld.ID, TokenHash: "cd34", OpenedByKeyID: key.ID,
			Seed: -42, SeedInstructions: "3 orders", Seeded: true, SeedNote: "n", Scenario: "s", Clock: "2026-01-01T00:00:00Z", RecordOutputs: true,
			WorldHash: "sha256:w", StateHash: "sha256:s", Receipts: json.RawMessage(`{"seed":-42}`), Status: schema.SessionOpen, NCalls: 2, NErrors: 1,
			NAExecuted: 1, NBTwin: 1, NBReplayed: 0, NBInferred: 0, NBSimulated: 0, NDowngraded: 1, CreatedAt: at, LastUsedAt: at, ExpiresAt: later}
		call := &schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: ses.ID, Seq: 1, Tool: "get", Arguments: json.RawMessage(`{"id":"o1"}`), Content: "{\"x\": 1.0}",
			Error: true, Fidelity: schema.FidelityBTwin, Rung: "twin", Downgraded: true, Ms: 3, Requestor: "assistant", StateHash: "sha256:s", CreatedAt: at}
		um := &schema.UsageMeter{WorkspaceID: ws.ID, Period: "2026-11", Meter: "task_minutes", Amount: 1.5, UpdatedAt: at}
		models := []any{ws, key, env, bld, tb, tr, ses, call, um}
		for _, m := range models {
			if _, err := db.NewInsert().Model(m).Exec(ctx); err != nil {
				t.Fatalf("insert %T: %v", m, err)
			}
		}
		for _, m := range models {
			// Select by the model's own primary key into a zeroed copy.
			got := reflect.New(reflect.TypeOf(m).Elem()).Interface()
			reflect.ValueOf(got).Elem().Set(reflect.ValueOf(m).Elem())
			zeroNonKey(got)
			if err := db.NewSelect().Model(got).WherePK().Scan(ctx); err != nil {
				t.Fatalf("select %T: %v", m, err)
			}
			want := normalize(reflect.ValueOf(m).Elem().Interface())
			if g := normalize(reflect.ValueOf(got).Elem().Interface()); !reflect.DeepEqual(g, want) {
				t.Errorf("%T round trip:\n got  %+v\n want %+v", m, g, want)
			}
		}
		if db.Dialect().Name().String() == "sqlite" {
			var raw string
			if err := db.QueryRowContext(ctx, "SELECT created_at FROM workspaces").Scan(&raw); err != nil {
				t.Fatal(err)
			}
			if !rfc3339Micro.MatchString(raw) || raw != "2026-11-22T02:04:05.123456Z" {
				t.Errorf("sqlite stores created_at as %q, want RFC 3339 UTC with microseconds", raw)
			}
		}
		// Times order correctly in SQL on both dialects.
		var first string
		if err := db.NewSelect().Model((*schema.Session)(nil)).Column("id").Where("expires_at > ?", us).Scan(ctx, &first); err != nil || first != ses.ID {
			t.Errorf("expires_at > created: got %q, %v", first, err)
		}
	})
}

// zeroNonKey clears every field of a model pointer except its bun primary-key fields.
func zeroNonKey(m any) {
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		tag := v.Type().Field(i).Tag.Get("bun")
		if !strings.Contains(tag, ",pk") && !strings.HasPrefix(tag, "table:") {
			v.Field(i).Set(reflect.Zero(v.Field(i).Type()))
		}
	}
}

// normalize copies a model with every time.Time (and *time.Time) in UTC, truncated to microseconds.
func normalize(v any) any {
	rv := reflect.ValueOf(v)
	out := reflect.New(rv.Type()).Elem()
	out.Set(rv)
	for i := 0; i < out.NumField(); i++ {
		f := out.Field(i)
		switch x := f.Interface().(type) {
		case time.Time:
			f.Set(reflect.ValueOf(x.UTC().Truncate(time.Microsecond)))
		case *time.Time:
			if x != nil {
				u := x.UTC().Truncate(time.Microsecond)
				f.Set(reflect.ValueOf(&u))
			}
		case json.RawMessage:
			if x != nil {
				var anyv any
				_ = json.Unmarshal(x, &anyv)
				b, _ := json.Marshal(anyv)
				f.Set(reflect.ValueOf(json.RawMessage(b)))
			}
		}
	}
	return out.Interface()
}
