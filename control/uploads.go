package control

import (
	"context"
	"errors"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// Uploads is the service of a workspace's uploads: files stored once, for builds and collect to name by id.
type Uploads struct {
	DB bun.IDB
}

// Record makes the uploads exist, all or none; each row gets its id.
func (u *Uploads) Record(ctx context.Context, rows []*schema.Upload) error {
	return u.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		for _, r := range rows {
			if err := store.CreateUpload(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

// Get answers an upload of the workspace. A missing one (or another workspace's) is invalid at field, the input
// that named it.
func (u *Uploads) Get(ctx context.Context, workspaceID, id, field string) (*schema.Upload, error) {
	up, err := store.GetUpload(ctx, u.DB, workspaceID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &toolplane.Error{Kind: toolplane.Invalid, Field: field, Detail: "upload " + id + " not found"}
	}
	if err != nil {
		return nil, err
	}
	return up, nil
}
