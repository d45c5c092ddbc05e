package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/schema"
)

// SchemeAdminKey names the admin credential (config admin.key), the only one the admin verbs take.
const SchemeAdminKey = "adminKey"

// AdminAuth is the Security of admin verbs.
func AdminAuth() []map[string][]string { return []map[string][]string{{SchemeAdminKey: {}}} }

// adminKey checks the admin credential in constant time.
type adminKey struct{ sum [32]byte }

func newAdminKey(plain string) *adminKey {
	if plain == "" {
		return nil
	}
	return &adminKey{sum: sha256.Sum256([]byte(plain))}
}

// Admin authenticates an admin verb: no credential is a 401; any credential but the admin key — a workspace key,
// a session token, anything — is a 403 (spec §7: an admin verb).
func (a *Authenticator) Admin(authorization string) (*Principal, error) {
	tok, err := credential(authorization)
	if err != nil {
		return nil, err
	}
	got := sha256.Sum256([]byte(tok))
	if a.admin == nil || subtle.ConstantTimeCompare(got[:], a.admin.sum[:]) != 1 {
		return nil, Forbidden(AccessDenied, "this is an admin verb: it takes the admin key (config admin.key)")
	}
	return &Principal{Admin: true}, nil
}

// WorkspaceOut is a workspace as an admin sees it.
type WorkspaceOut struct {
	ID           string    `json:"id" example:"ws_0123456789abcdef"`
	Name         string    `json:"name"`
	Plan         string    `json:"plan" doc:"A plan of the plans configuration; \"\" means usage.default_plan."`
	Access       string    `json:"access" enum:"granted,pending,denied"`
	Entitlements []string  `json:"entitlements" doc:"Gated features the workspace may use: mcp, query."`
	CardOnFile   bool      `json:"cardOnFile"`
	CreatedAt    time.Time `json:"createdAt" format:"date-time"`
}

func workspaceOut(ws *schema.Workspace) WorkspaceOut {
	es := []string{}
	for _, e := range strings.Split(ws.Entitlements, ",") {
		if e != "" {
			es = append(es, e)
		}
	}
	sort.Strings(es)
	return WorkspaceOut{ID: ws.ID, Name: ws.Name, Plan: ws.Plan, Access: ws.Access, Entitlements: es,
		CardOnFile: ws.CardOnFile, CreatedAt: ws.CreatedAt.UTC()}
}

// WorkspaceFields are the fields an admin sets on a workspace; omitted ones stay as they are.
type WorkspaceFields struct {
	Plan         *string  `json:"plan,omitempty" maxLength:"64" doc:"A plan named in the plans configuration."`
	Access       *string  `json:"access,omitempty" enum:"granted,pending,denied" doc:"pending or denied: every credential of the workspace answers 403 with that access."`
	Entitlements []string `json:"entitlements,omitempty" maxItems:"8" doc:"Replaces the entitlements: any of mcp, query."`
	CardOnFile   *bool    `json:"cardOnFile,omitempty" doc:"Whether a card is on file (lifts the limits of a plan whose card_lifts is set)."`
}

// CreateWorkspaceInput is POST /v1/admin/workspaces.
type CreateWorkspaceInput struct {
	Body struct {
		Name string `json:"name" minLength:"1" maxLength:"100" doc:"The workspace's name."`
		WorkspaceFields
	}
}

// CreatedWorkspace is a new workspace and its first key, shown once.
type CreatedWorkspace struct {
	Workspace WorkspaceOut `json:"workspace"`
	Key       CreatedKey   `json:"key" doc:"The workspace's first key (mk_live_…), shown only here."`
}

// CreateWorkspaceOutput answers POST /v1/admin/workspaces.
type CreateWorkspaceOutput struct {
	Body CreatedWorkspace
}

// UpdateWorkspaceInput is PATCH /v1/admin/workspaces/{workspace_id}.
type UpdateWorkspaceInput struct {
	WorkspaceID string `path:"workspace_id" minLength:"1" maxLength:"64" doc:"Workspace id (ws_…)."`
	Body        WorkspaceFields
}

// WorkspaceOutput answers with one workspace.
type WorkspaceOutput struct {
	Body WorkspaceOut
}

// ListWorkspacesOutput is GET /v1/admin/workspaces.
type ListWorkspacesOutput struct {
	Body []WorkspaceOut
}

// WorkspaceIDInput names a workspace in the path.
type WorkspaceIDInput struct {
	WorkspaceID string `path:"workspace_id" minLength:"1" maxLength:"64" doc:"Workspace id (ws_…)."`
}

func (u *UsageRoutes) registerAdmin(a huma.API, d *Deps) {
	svc := &control.Workspaces{DB: d.DB}
	if u.Source != nil {
		svc.Plans = &u.Source.Plans
	}
	d.Auth.admin = newAdminKey(u.AdminKey)
	Declare(a, Verb[CreateWorkspaceInput, CreateWorkspaceOutput]{
		Name:    "admin.workspaces.create",
		Method:  http.MethodPost,
		Path:    "/v1/admin/workspaces",
		Status:  http.StatusCreated,
		Summary: "Create a workspace (admin)",
		Description: "Creates a workspace with its plan, access and entitlements, and mints its first workspace key " +
			"(shown only here). Takes the admin key; any other credential is a 403.",
		Tags:     []string{"admin"},
		Security: AdminAuth(),
		Handler: func(ctx context.Context, in *CreateWorkspaceInput) (*CreateWorkspaceOutput, error) {
			ws, k, plain, err := svc.Create(ctx, in.Body.Name, in.Body.WorkspaceFields.settings())
			if err != nil {
				return nil, err
			}
			return &CreateWorkspaceOutput{Body: CreatedWorkspace{Workspace: workspaceOut(ws),
				Key: CreatedKey{KeyInfo: KeyInfoOf(k), Key: plain}}}, nil
		},
	})
	Declare(a, Verb[UpdateWorkspaceInput, WorkspaceOutput]{
		Name:    "admin.workspaces.update",
		Method:  http.MethodPatch,
		Path:    "/v1/admin/workspaces/{workspace_id}",
		Summary: "Change a workspace (admin)",
		Description: "Sets a workspace's plan, access (granted, pending, denied), entitlements and card on file. " +
			"Takes the admin key. Checks and open sessions see the change within a few seconds.",
		Tags:     []string{"admin"},
		Security: AdminAuth(),
		Handler: func(ctx context.Context, in *UpdateWorkspaceInput) (*WorkspaceOutput, error) {
			ws, err := svc.Update(ctx, in.WorkspaceID, in.Body.settings())
			if err != nil {
				return nil, err
			}
			if u.Gate != nil {
				u.Gate.Forget(ws.ID)
			}
			d.Auth.forgetKeys() // cached keys carry the workspace's access and entitlements
			return &WorkspaceOutput{Body: workspaceOut(ws)}, nil
		},
	})
	Declare(a, Verb[struct{}, ListWorkspacesOutput]{
		Name:        "admin.workspaces.list",
		Method:      http.MethodGet,
		Path:        "/v1/admin/workspaces",
		Summary:     "List workspaces (admin)",
		Description: "Every workspace, oldest first. Takes the admin key.",
		Tags:        []string{"admin"},
		Security:    AdminAuth(),
		Handler: func(ctx context.Context, _ *struct{}) (*ListWorkspacesOutput, error) {
			wss, err := svc.List(ctx)
			if err != nil {
				return nil, err
			}
			out := &ListWorkspacesOutput{Body: make([]WorkspaceOut, 0, len(wss))}
			for i := range wss {
				out.Body = append(out.Body, workspaceOut(&wss[i]))
			}
			return out, nil
		},
	})
	Declare(a, Verb[WorkspaceIDInput, UsageOutput]{
		Name:        "admin.workspaces.usage",
		Method:      http.MethodGet,
		Path:        "/v1/admin/workspaces/{workspace_id}/usage",
		Summary:     "A workspace's usage (admin)",
		Description: "GET /v1/usage of any workspace. Takes the admin key.",
		Tags:        []string{"admin"},
		Security:    AdminAuth(),
		Handler: func(ctx context.Context, in *WorkspaceIDInput) (*UsageOutput, error) {
			ws, err := svc.Get(ctx, in.WorkspaceID)
			if err != nil {
				return nil, err
			}
			r, err := u.Source.Read(ctx, ws, u.now())
			if err != nil {
				return nil, err
			}
			return &UsageOutput{Body: usageBody(r, ws.CardOnFile)}, nil
		},
	})
}

// settings are the fields as the workspaces service takes them.
func (f *WorkspaceFields) settings() control.WorkspaceFields {
	return control.WorkspaceFields{Plan: f.Plan, Access: f.Access, Entitlements: f.Entitlements, CardOnFile: f.CardOnFile}
}
