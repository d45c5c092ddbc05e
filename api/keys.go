package api

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/schema"
)

// KeyInfo is a key as listed: never its plaintext.
type KeyInfo struct {
	ID         string     `json:"id" doc:"Prefixed key_." example:"key_0123456789abcdef"`
	Name       string     `json:"name"`
	Kind       string     `json:"kind" enum:"workspace,mcp" doc:"workspace: an mk_live_ key; mcp: an mcp_at_ token."`
	Prefix     string     `json:"prefix" doc:"The start of the key, to recognise it by." example:"mk_live_abcd…"`
	CreatedAt  time.Time  `json:"created_at" format:"date-time"`
	LastUsedAt *time.Time `json:"last_used_at" nullable:"true" format:"date-time" doc:"Last authenticated use, to the minute."`
	RevokedAt  *time.Time `json:"revoked_at" nullable:"true" format:"date-time"`
}

// KeyInfoOf renders a key row.
func KeyInfoOf(k *schema.APIKey) KeyInfo {
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	return KeyInfo{ID: k.ID, Name: k.Name, Kind: k.Kind, Prefix: k.Prefix, CreatedAt: k.CreatedAt.UTC(),
		LastUsedAt: utc(k.LastUsedAt), RevokedAt: utc(k.RevokedAt)}
}

// CreateKeyInput is POST /v1/keys.
type CreateKeyInput struct {
	Body struct {
		Name string `json:"name" minLength:"1" maxLength:"100" doc:"A label for the key."`
		Kind string `json:"kind,omitempty" enum:"workspace,mcp" default:"workspace" doc:"workspace mints an mk_live_ key; mcp an mcp_at_ token."`
	}
}

// CreatedKey is a new key with its plaintext, shown only in this response.
type CreatedKey struct {
	KeyInfo
	Key string `json:"key" doc:"The key itself. Shown once: it is stored only as a hash." example:"mk_live_…"`
}

// CreateKeyOutput is POST /v1/keys's answer.
type CreateKeyOutput struct {
	Body CreatedKey
}

// ListKeysOutput is GET /v1/keys.
type ListKeysOutput struct {
	Body []KeyInfo
}

// KeyIDInput names a key in the path.
type KeyIDInput struct {
	ID string `path:"id" minLength:"1" maxLength:"64" doc:"Key id (key_…)."`
}

// RevokeKeyOutput is DELETE /v1/keys/{id}.
type RevokeKeyOutput struct {
	Body KeyInfo
}

func registerKeys(a huma.API, d *Deps) {
	keys := &control.Keys{DB: d.DB}
	Declare(a, Verb[CreateKeyInput, CreateKeyOutput]{
		Name:    "keys.create",
		Method:  http.MethodPost,
		Path:    "/v1/keys",
		Summary: "Create a key",
		Description: "Mints a workspace key (mk_live_…) or MCP token (mcp_at_…) in the caller's workspace. The plaintext is in this response only. " +
			"An MCP token derives from the key that minted it and is revoked with it; a workspace key is independent of it.",
		Tags:     []string{"keys"},
		Security: WorkspaceKeyAuth(),
		Status:   http.StatusCreated,
		Handler: func(ctx context.Context, in *CreateKeyInput) (*CreateKeyOutput, error) {
			p := PrincipalFrom(ctx)
			// An MCP token derives from the key that mints it and ends with it; a workspace key is a peer of it
			// (docs/credentials.md).
			k, plain, err := keys.Create(ctx, p.Key, p.Workspace.ID, in.Body.Kind, in.Body.Name)
			if err != nil {
				return nil, err
			}
			return &CreateKeyOutput{Body: CreatedKey{KeyInfo: KeyInfoOf(k), Key: plain}}, nil
		},
	})

	Declare(a, Verb[struct{}, ListKeysOutput]{
		Name:        "keys.list",
		Method:      http.MethodGet,
		Path:        "/v1/keys",
		Summary:     "List keys",
		Description: "The workspace's keys and MCP tokens, revoked ones included, newest first. Never their plaintext.",
		Tags:        []string{"keys"},
		Security:    WorkspaceKeyAuth(),
		Handler: func(ctx context.Context, _ *struct{}) (*ListKeysOutput, error) {
			p := PrincipalFrom(ctx)
			ks, err := keys.List(ctx, p.Workspace.ID)
			if err != nil {
				return nil, err
			}
			out := &ListKeysOutput{Body: make([]KeyInfo, 0, len(ks))}
			for i := range ks {
				out.Body = append(out.Body, KeyInfoOf(&ks[i]))
			}
			return out, nil
		},
	})

	Declare(a, Verb[KeyIDInput, RevokeKeyOutput]{
		Name:    "keys.revoke",
		Method:  http.MethodDelete,
		Path:    "/v1/keys/{id}",
		Summary: "Revoke a key",
		Description: "Revokes a key of the caller's workspace; it answers 401 from then on, and so does every credential derived from it " +
			"(MCP tokens it minted or consented to, the tokens of sessions they opened, forks made with those tokens). Revoking a revoked key changes nothing. " +
			"Another workspace's key answers 404.",
		Tags:     []string{"keys"},
		Security: WorkspaceKeyAuth(),
		Handler: func(ctx context.Context, in *KeyIDInput) (*RevokeKeyOutput, error) {
			p := PrincipalFrom(ctx)
			k, err := keys.Revoke(ctx, p.Workspace.ID, in.ID)
			if err != nil {
				return nil, err
			}
			d.Auth.forgetKeys()
			return &RevokeKeyOutput{Body: KeyInfoOf(k)}, nil
		},
	})
}
