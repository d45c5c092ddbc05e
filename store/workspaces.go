package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// WorkspaceChange is what an admin changes on a workspace; nil fields stay as they are.
type WorkspaceChange struct {
	Name         *string
	Plan         *string
	Access       *string
	Entitlements []string // nil: unchanged; empty: none
	CardOnFile   *bool
}

// knownEntitlement reports whether e names a gated feature.
func knownEntitlement(e string) bool {
	return e == schema.EntitlementMCP || e == schema.EntitlementQuery
}

// JoinEntitlements checks and canonicalizes entitlements: known names, sorted, each once, comma-separated.
func JoinEntitlements(es []string) (string, error) {
	seen := map[string]bool{}
	var out []string
	for i, e := range es {
		e = strings.TrimSpace(e)
		if !knownEntitlement(e) {
			return "", fmt.Errorf("%w: entitlements[%d] %q is not one of %s, %s", ErrInvalid, i, e, schema.EntitlementMCP, schema.EntitlementQuery)
		}
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	// Two known names: mcp sorts before query.
	if len(out) == 2 && out[0] > out[1] {
		out[0], out[1] = out[1], out[0]
	}
	return strings.Join(out, ","), nil
}

// UpdateWorkspace applies c to workspace id and returns the workspace as it now is. Nothing is written when any
// field is invalid.
func UpdateWorkspace(ctx context.Context, db bun.IDB, id string, c WorkspaceChange) (*schema.Workspace, error) {
	q := db.NewUpdate().Model((*schema.Workspace)(nil)).Where("id = ?", id)
	n := 0
	if c.Name != nil {
		if *c.Name == "" {
			return nil, fmt.Errorf("store: update workspace: %w: name is empty", ErrInvalid)
		}
		q, n = q.Set("name = ?", *c.Name), n+1
	}
	if c.Plan != nil {
		q, n = q.Set("plan = ?", *c.Plan), n+1
	}
	if c.Access != nil {
		switch *c.Access {
		case schema.AccessGranted, schema.AccessPending, schema.AccessDenied:
		default:
			return nil, fmt.Errorf("store: update workspace: %w: access %q is not granted|pending|denied", ErrInvalid, *c.Access)
		}
		q, n = q.Set("access = ?", *c.Access), n+1
	}
	if c.Entitlements != nil {
		es, err := JoinEntitlements(c.Entitlements)
		if err != nil {
			return nil, fmt.Errorf("store: update workspace: %w", err)
		}
		q, n = q.Set("entitlements = ?", es), n+1
	}
	if c.CardOnFile != nil {
		q, n = q.Set("card_on_file = ?", *c.CardOnFile), n+1
	}
	if n > 0 {
		res, err := q.Exec(ctx)
		if err != nil {
			return nil, wrap(err, "update workspace %q", id)
		}
		if k, _ := res.RowsAffected(); k == 0 {
			return nil, fmt.Errorf("store: update workspace %q: %w", id, ErrNotFound)
		}
	}
	return GetWorkspace(ctx, db, id)
}

// ListWorkspaces returns every workspace, oldest first.
func ListWorkspaces(ctx context.Context, db bun.IDB) ([]schema.Workspace, error) {
	out := []schema.Workspace{}
	if err := db.NewSelect().Model(&out).Order("created_at ASC", "id ASC").Scan(ctx); err != nil {
		return nil, wrap(err, "list workspaces")
	}
	return out, nil
}
