package envinputs

import (
	"context"
	"encoding/json"
	"reflect"
	"sync"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

func def(name, desc string) ingest.ToolDef {
	return ingest.ToolDef{Name: name, Description: desc, InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}}}`)}
}

// TestAddTools: definitions seen in traces join an environment's inputs where it has none of that name; what the
// inputs define already (an upload, an earlier trace) keeps its definition; concurrent writers lose nothing.
func TestAddTools(t *testing.T) {
	ctx := context.Background()
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		var blobs Blobs
		if db.Dialect().Name().String() == "pg" {
			blobs = blobtest.NewS3(t)
		} else {
			local, err := blob.NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			blobs = local
		}
		ws, err := store.CreateWorkspace(ctx, db, "acme")
		if err != nil {
			t.Fatal(err)
		}
		env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "agent")
		if err != nil {
			t.Fatal(err)
		}
		added, err := AddTools(ctx, db, blobs, env.ID, []ingest.ToolDef{def("get_order", "first"), def("refund", "r"), {Name: "bad", InputSchema: json.RawMessage(`[1]`)}})
		if err != nil || !reflect.DeepEqual(added, []string{"get_order", "refund"}) {
			t.Fatalf("AddTools = %v, %v", added, err)
		}
		if added, err := AddTools(ctx, db, blobs, env.ID, []ingest.ToolDef{def("get_order", "second")}); err != nil || added != nil {
			t.Fatalf("a name already defined: %v, %v", added, err)
		}
		var wg sync.WaitGroup
		for _, name := range []string{"a", "b", "c", "d"} {
			wg.Go(func() {
				if _, err := AddTools(ctx, db, blobs, env.ID, []ingest.ToolDef{def(name, name)}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, _ := store.GetEnvByID(ctx, db, env.ID)
		up, err := Read(ctx, blobs, got.InputsKey)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := up.Options()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		desc := map[string]string{}
		for _, d := range opts.Tools {
			names = append(names, d.Name)
			desc[d.Name] = d.Description
		}
		if !reflect.DeepEqual(names, []string{"a", "b", "c", "d", "get_order", "refund"}) || desc["get_order"] != "first" {
			t.Errorf("inputs tools %v %v", names, desc)
		}
		// An uploaded definition wins over what traces carry.
		up.Tools = json.RawMessage(`[{"name":"refund","description":"uploaded","inputSchema":{"type":"object"}}]`)
		up.Code = map[string]string{}
		data, _ := json.Marshal(up)
		key, _ := blob.PutContent(ctx, blobs, Prefix, data, "application/json")
		if err := store.SetEnvInputs(ctx, db, env.ID, got.InputsKey, key); err != nil {
			t.Fatal(err)
		}
		if added, err := AddTools(ctx, db, blobs, env.ID, []ingest.ToolDef{def("refund", "seen"), def("notify", "n")}); err != nil || !reflect.DeepEqual(added, []string{"notify"}) {
			t.Fatalf("after upload: %v, %v", added, err)
		}
		got, _ = store.GetEnvByID(ctx, db, env.ID)
		up, _ = Read(ctx, blobs, got.InputsKey)
		defs, _ := infer.ParseToolDefs(up.Tools)
		if len(defs) != 2 || defs[1].Name != "refund" || defs[1].Description != "uploaded" {
			t.Errorf("tools %+v", defs)
		}
	})
}
