package control

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/usage"
)

// Workspaces is the administrator's service of workspaces: their plan, access, entitlements and card on file.
type Workspaces struct {
	DB bun.IDB
	// Plans are the configured plans a workspace may be put on (nil: none).
	Plans *usage.Plans
}

// WorkspaceFields are an administrator's settings of a workspace; nil (or a nil slice) leaves one unchanged.
type WorkspaceFields struct {
	Plan         *string
	Access       *string
	Entitlements []string // empty, not nil: none
	CardOnFile   *bool
}

// Create creates a workspace with its settings (without entitlements: its plan's) and mints its first workspace
// key, in one transaction; it answers the key's plaintext, which is never stored.
func (w *Workspaces) Create(ctx context.Context, name string, f WorkspaceFields) (*schema.Workspace, *schema.APIKey, string, error) {
	ch, err := w.change(f)
	if err != nil {
		return nil, nil, "", err
	}
	if ch.Entitlements == nil {
		// The plan's entitlements (the default plan's when none is named), else every one.
		named := ""
		if ch.Plan != nil {
			named = *ch.Plan
		}
		_, plan := w.plans().Of(&schema.Workspace{Plan: named})
		ch.Entitlements = plan.Entitlements
	}
	var ws *schema.Workspace
	var key *schema.APIKey
	var plain string
	err = w.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		if ws, err = store.CreateWorkspace(ctx, tx, name); err != nil {
			return err
		}
		if ws, err = store.UpdateWorkspace(ctx, tx, ws.ID, ch); err != nil {
			return err
		}
		key, plain, err = store.CreateKey(ctx, tx, ws.ID, cred.KindWorkspace, "first key")
		return err
	})
	if err != nil {
		return nil, nil, "", settingsError(err, "workspace")
	}
	return ws, key, plain, nil
}

// Update changes a workspace's settings.
func (w *Workspaces) Update(ctx context.Context, id string, f WorkspaceFields) (*schema.Workspace, error) {
	ch, err := w.change(f)
	if err != nil {
		return nil, err
	}
	ws, err := store.UpdateWorkspace(ctx, w.DB, id, ch)
	if err != nil {
		return nil, settingsError(err, "workspace "+id)
	}
	return ws, nil
}

// List answers every workspace, oldest first.
func (w *Workspaces) List(ctx context.Context) ([]schema.Workspace, error) {
	return store.ListWorkspaces(ctx, w.DB)
}

// Get answers one workspace.
func (w *Workspaces) Get(ctx context.Context, id string) (*schema.Workspace, error) {
	ws, err := store.GetWorkspace(ctx, w.DB, id)
	if err != nil {
		return nil, storeError(err, "workspace "+id)
	}
	return ws, nil
}

// change checks an administrator's settings: a plan must be configured (or "" for the default), entitlements known.
func (w *Workspaces) change(f WorkspaceFields) (store.WorkspaceChange, error) {
	if plans := w.plans(); f.Plan != nil && *f.Plan != "" && !plans.Has(*f.Plan) {
		names := make([]string, 0, len(plans.ByName))
		for n := range plans.ByName {
			names = append(names, n)
		}
		sort.Strings(names)
		return store.WorkspaceChange{}, &toolplane.Error{Kind: toolplane.Invalid, Field: "body.plan",
			Detail: "no plan " + *f.Plan + " is configured; plans: " + strings.Join(names, ", ")}
	}
	for i, e := range f.Entitlements {
		if e != schema.EntitlementMCP && e != schema.EntitlementQuery {
			return store.WorkspaceChange{}, &toolplane.Error{Kind: toolplane.Invalid, Field: "body.entitlements[" + strconv.Itoa(i) + "]",
				Detail: "expected one of mcp, query"}
		}
	}
	return store.WorkspaceChange{Plan: f.Plan, Access: f.Access, CardOnFile: f.CardOnFile, Entitlements: f.Entitlements}, nil
}

func (w *Workspaces) plans() usage.Plans {
	if w.Plans == nil {
		return usage.Plans{}
	}
	return *w.Plans
}

// settingsError is storeError, with a rule of store's on the settings named as the body's.
func settingsError(err error, what string) error {
	if errors.Is(err, store.ErrInvalid) {
		return &toolplane.Error{Kind: toolplane.Invalid, Field: "body", Detail: strings.TrimPrefix(err.Error(), "store: ")}
	}
	return storeError(err, what)
}
