package control

import (
	"context"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Keys is the service of a workspace's keys and MCP tokens.
type Keys struct {
	DB bun.IDB
}

// Create mints a key named name in by's workspace: an MCP token derives from by (the key that mints it) and ends
// with it; a workspace key is a peer of by, so keys can be rotated. It answers the row and the plaintext, which is
// never stored.
func (k *Keys) Create(ctx context.Context, by *schema.APIKey, workspaceID, kind, name string) (*schema.APIKey, string, error) {
	var key *schema.APIKey
	var plain string
	var err error
	if kind == schema.KeyKindMCP {
		key, plain, err = store.DeriveKey(ctx, k.DB, by, cred.KindMCP, name)
	} else {
		key, plain, err = store.CreateKey(ctx, k.DB, workspaceID, cred.KindWorkspace, name)
	}
	if err != nil {
		return nil, "", storeError(err, "key")
	}
	return key, plain, nil
}

// List answers the workspace's keys, revoked ones included, newest first.
func (k *Keys) List(ctx context.Context, workspaceID string) ([]schema.APIKey, error) {
	return store.ListKeys(ctx, k.DB, workspaceID)
}

// Revoke revokes a key of the workspace and with it every credential derived from it; revoking a revoked key
// changes nothing. Another workspace's key is not found.
func (k *Keys) Revoke(ctx context.Context, workspaceID, id string) (*schema.APIKey, error) {
	key, err := store.RevokeKey(ctx, k.DB, workspaceID, id)
	if err != nil {
		return nil, storeError(err, "key "+id)
	}
	return key, nil
}
