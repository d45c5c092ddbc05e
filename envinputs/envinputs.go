// Package envinputs adds the tool definitions an agent's traces carried to its environment's build inputs.
package envinputs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/store"
)

// Blobs is the part of the blob store inputs take.
type Blobs interface {
	blob.Putter
	Getter
}

// Prefix is where inputs blobs go (as the build route stores them).
const Prefix = "uploads/"

// attempts bounds the compare-and-set rounds when writers race on one environment's inputs.
const attempts = 5

// AddTools makes the tool definitions defs holds the environment's provided definitions where it has none of that
// name yet: the inputs' current definitions (uploaded with a build, or seen in traces before) keep theirs, so
// the first definition of a name wins. Definitions a build could not read are skipped. The new inputs are stored
// content-addressed and set with a compare-and-set on the environment's inputs key, tried again when another
// writer changed them meanwhile. It answers the names added.
func AddTools(ctx context.Context, db bun.IDB, blobs Blobs, envID string, defs []ingest.ToolDef) ([]string, error) {
	if len(defs) == 0 {
		return nil, nil
	}
	for attempt := 1; ; attempt++ {
		env, err := store.GetEnvByID(ctx, db, envID)
		if err != nil {
			return nil, err
		}
		cur, err := Read(ctx, blobs, env.InputsKey)
		if err != nil {
			return nil, err
		}
		next, added, err := withTools(cur, defs)
		if err != nil || len(added) == 0 {
			return nil, err
		}
		data, err := json.Marshal(next)
		if err != nil {
			return nil, fmt.Errorf("envinputs: encode inputs: %w", err)
		}
		key, err := blob.PutContent(ctx, blobs, Prefix, data, "application/json")
		if err != nil {
			return nil, fmt.Errorf("envinputs: store inputs: %w", err)
		}
		err = store.SetEnvInputs(ctx, db, envID, env.InputsKey, key)
		if err == nil {
			return added, nil
		}
		if !errors.Is(err, store.ErrConflict) || attempt == attempts {
			return nil, err
		}
	}
}

// Getter reads blobs.
type Getter interface {
	Get(ctx context.Context, key string) (io.ReadCloser, error)
}

// Read reads an environment's inputs blob ("" is no inputs).
func Read(ctx context.Context, blobs Getter, key string) (infer.Upload, error) {
	var up infer.Upload
	if key == "" {
		return up, nil
	}
	rc, err := blobs.Get(ctx, key)
	if err != nil {
		return up, fmt.Errorf("read build inputs %s: %w", key, err)
	}
	defer rc.Close()
	if err := json.NewDecoder(rc).Decode(&up); err != nil {
		return up, fmt.Errorf("decode build inputs %s: %w", key, err)
	}
	return up, nil
}

// withTools is cur with the definitions of defs it lacks added (native shape, sorted by name as ParseToolDefs
// sorts them), and the names added.
func withTools(cur infer.Upload, defs []ingest.ToolDef) (infer.Upload, []string, error) {
	have, err := infer.ParseToolDefs(cur.Tools)
	if err != nil {
		// The inputs as stored fail to read: leave them to the build to report.
		return cur, nil, nil
	}
	names := map[string]bool{}
	all := make([]ingest.ToolDef, 0, len(have)+len(defs))
	for _, d := range have {
		names[d.Name] = true
		all = append(all, ingest.ToolDef{Name: d.Name, Description: d.Description, InputSchema: d.InputSchema})
	}
	var added []string
	for _, d := range defs {
		if names[d.Name] {
			continue
		}
		one, err := json.Marshal([]ingest.ToolDef{d})
		if err != nil {
			continue
		}
		if _, err := infer.ParseToolDefs(one); err != nil {
			continue // a definition a build cannot read is not worth failing builds over
		}
		names[d.Name] = true
		all = append(all, d)
		added = append(added, d.Name)
	}
	if len(added) == 0 {
		return cur, nil, nil
	}
	tools, err := json.Marshal(all)
	if err != nil {
		return cur, nil, fmt.Errorf("envinputs: encode tools: %w", err)
	}
	next := cur
	next.Tools = tools
	if _, err := next.Options(); err != nil {
		return cur, nil, nil // the added tools would make the inputs invalid: keep them as they were
	}
	return next, added, nil
}
