// Package control is the control plane's services — keys, environments, webhook endpoints and events — that every
// transport calls: each reads and writes store and answers the tool plane's error kinds, so transports hold I/O types
// and error mapping only.
package control

import (
	"errors"
	"strings"

	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// storeError turns store's sentinel errors into the tool plane's kinds, naming what was looked for; other errors
// pass unchanged.
func storeError(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return &toolplane.Error{Kind: toolplane.NotFound, Detail: what + " not found"}
	case errors.Is(err, store.ErrConflict):
		return &toolplane.Error{Kind: toolplane.Conflict, Detail: what + ": " + strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, store.ErrInvalid):
		return &toolplane.Error{Kind: toolplane.Invalid, Detail: strings.TrimPrefix(err.Error(), "store: ")}
	}
	return err
}

func notFound(detail string) error { return &toolplane.Error{Kind: toolplane.NotFound, Detail: detail} }

func conflict(detail string) error { return &toolplane.Error{Kind: toolplane.Conflict, Detail: detail} }

func unavailable(detail string) error {
	return &toolplane.Error{Kind: toolplane.Unavailable, Detail: detail}
}
