package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/doppel-dev/doppel/twin"
)

// BlobGetter reads a bundle from the blob store (blob.Store has it).
type BlobGetter interface {
	Get(ctx context.Context, key string) (io.ReadCloser, error)
}

// BundleBytes loads a bundle's runtime from its bytes.
func BundleBytes(data []byte, opts twin.RuntimeOptions) Loader {
	return func(ctx context.Context) (Runtime, error) { return NewTwinRuntime(data, opts) }
}

// BundleFile loads a bundle's runtime from a file (a bind mount, or a file copied into a container).
func BundleFile(path string, opts twin.RuntimeOptions) Loader {
	return func(ctx context.Context) (Runtime, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read bundle: %w", err)
		}
		return NewTwinRuntime(data, opts)
	}
}

// BundleBlob loads a bundle's runtime from the blob store.
func BundleBlob(blobs BlobGetter, key string, opts twin.RuntimeOptions) Loader {
	return func(ctx context.Context) (Runtime, error) {
		rc, err := blobs.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("get bundle %s: %w", key, err)
		}
		defer rc.Close()
		data, err := io.ReadAll(rc)
		if err != nil {
			return nil, fmt.Errorf("read bundle %s: %w", key, err)
		}
		return NewTwinRuntime(data, opts)
	}
}

// NewTwinRuntime parses bundle bytes and builds the twin runtime the server hosts sessions on.
func NewTwinRuntime(data []byte, opts twin.RuntimeOptions) (Runtime, error) {
	b, err := twin.UnmarshalBundle(data)
	if err != nil {
		return nil, err
	}
	rt, err := twin.NewRuntime(b, opts)
	if err != nil {
		return nil, err
	}
	// The hash of the bytes served: Bundle.Hash for bundles written by Marshal (all of them), without re-marshalling.
	return &twinRuntime{rt: rt, hash: twin.HashBytes(data)}, nil
}

// twinRuntime adapts *twin.Runtime to Runtime, mapping its errors to this package's sentinels.
type twinRuntime struct {
	rt   *twin.Runtime
	hash string
}

type twinSession struct{ s *twin.Session }

func (r *twinRuntime) BundleHash() string { return r.hash }

func (r *twinRuntime) Open(spec SessionSpec) (Session, Receipts, error) {
	s, rc, err := r.rt.Open(spec)
	if err != nil {
		return nil, Receipts{}, mapTwinErr(err)
	}
	return twinSession{s}, rc, nil
}

func (r *twinRuntime) Rebuild(ctx context.Context, spec SessionSpec, journal []JournalEntry) (Session, Receipts, error) {
	j := make([]twin.JournalEntry, len(journal))
	for i, e := range journal {
		j[i] = twin.JournalEntry{Tool: e.Tool, Args: e.Arguments, Content: e.Content, Rung: e.Rung, StateHash: e.StateHash, Injected: e.Injected}
	}
	s, rc, err := r.rt.Rebuild(ctx, spec, j)
	if err != nil {
		return nil, Receipts{}, mapTwinErr(err)
	}
	return twinSession{s}, rc, nil
}

func (s twinSession) Call(ctx context.Context, tool string, args json.RawMessage) (CallResult, error) {
	res, err := s.s.Call(ctx, tool, args)
	if err != nil {
		return CallResult{}, mapTwinErr(err)
	}
	return CallResult{Content: res.Content, Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
		Downgraded: res.Downgraded, StateHash: res.StateHash, Changed: res.Changed, Note: res.Note}, nil
}

func (s twinSession) StateHash() string { return s.s.StateHash() }
func (s twinSession) Close()            { s.s.Close() }

// mapTwinErr wraps a twin error with the sentinel the server answers it by. Divergence is checked first: a rebuild
// that diverges because a journaled tool is now unknown is a divergence, not an unknown tool.
func mapTwinErr(err error) error {
	var sentinel error
	switch {
	case errors.Is(err, twin.ErrDiverged):
		sentinel = ErrDiverged
	case errors.Is(err, twin.ErrUnknownTool):
		sentinel = ErrUnknownTool
	case errors.Is(err, twin.ErrBadArguments):
		sentinel = ErrBadArguments
	case errors.Is(err, twin.ErrBadSpec):
		sentinel = ErrBadSpec
	case errors.Is(err, twin.ErrNoAnswer):
		sentinel = ErrNoAnswer
	case errors.Is(err, twin.ErrClosed):
		sentinel = ErrUnknownSession
	default:
		return err
	}
	return classified{sentinel: sentinel, err: err}
}

// classified is a twin error that also matches one of this package's sentinels, keeping the twin's message.
type classified struct{ sentinel, err error }

func (c classified) Error() string   { return c.err.Error() }
func (c classified) Unwrap() []error { return []error{c.sentinel, c.err} }
