package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/usage"
)

// Kind says whether a verb reads (a query: GET over REST and tRPC) or writes (a mutation: POST over tRPC).
type Kind string

// Verb kinds.
const (
	Query    Kind = "query"
	Mutation Kind = "mutation"
)

// Operation metadata keys a verb declaration sets.
const (
	// MetaVerb set to false keeps an operation out of the registry, tRPC and MCP (plain-HTTP routes such as
	// health, collect and the multipart build).
	MetaVerb = "verb"
	// MetaKind holds a verb's Kind.
	MetaKind = "verb.kind"
)

// Verb declares one verb, once: its name (the operation id, e.g. envs.get), kind, REST method and path, docs,
// credential rule and handler, with its input and output types as the handler's. Every transport is derived from
// it: the REST route, the tRPC procedure /trpc/<name>, the registry entry (GET /api/registry) and so the CLI.
type Verb[I, O any] struct {
	Name        string
	Kind        Kind
	Method      string
	Path        string
	Summary     string
	Description string
	Tags        []string
	// Security is the credential rule: WorkspaceKeyAuth(), SessionAuth(), MCPAuth().
	Security []map[string][]string
	// Status is the REST success status (default 200).
	Status int
	// Errors lists statuses the verb answers beyond those its inputs and credentials imply.
	Errors []int
	// Responses documents further success answers (e.g. a 202).
	Responses map[string]*huma.Response
	// FastBody checks a JSON body in one pass (fastBody) instead of huma's generic validation, for a hot verb whose
	// body is a flat object of strings and free-form objects and whose parameters cannot fail validation: every body
	// gets the same answer as without it. Declare panics for a body it cannot check.
	FastBody bool
	Handler  func(context.Context, *I) (*O, error)
}

// Declare registers a verb on the API.
func Declare[I, O any](a huma.API, v Verb[I, O]) {
	kind := v.Kind
	if kind == "" {
		kind = Mutation
		if v.Method == http.MethodGet {
			kind = Query
		}
	}
	meta := map[string]any{MetaKind: kind}
	huma.Register(a, huma.Operation{
		OperationID: v.Name, Method: v.Method, Path: v.Path, Summary: v.Summary, Description: v.Description,
		Tags: v.Tags, Security: v.Security, DefaultStatus: v.Status, Errors: v.Errors, Responses: v.Responses,
		Metadata: meta, SkipValidateBody: v.FastBody,
	}, mapped(v.Handler))
	if v.FastBody {
		// The operation huma registered shares meta: checkBodyStrings finds the checker there.
		fb, err := newFastBody(a, registered(a, v.Method, v.Path))
		if err != nil {
			panic(fmt.Sprintf("api: verb %s: FastBody: %v", v.Name, err))
		}
		meta[metaFastBody] = fb
	}
}

// mapped gives a handler's domain refusals their envelopes: every verb's (Declare), and those of the few routes
// registered with huma.Register directly.
func mapped[I, O any](h func(context.Context, *I) (*O, error)) func(context.Context, *I) (*O, error) {
	return func(ctx context.Context, in *I) (*O, error) {
		out, err := h(ctx, in)
		if err != nil {
			return nil, mapError(err)
		}
		return out, nil
	}
}

// mapError gives a domain refusal (the tool plane's) its envelope; other errors pass unchanged.
func mapError(err error) error {
	var pe *toolplane.Error
	if errors.As(err, &pe) {
		return planeEnvelope(pe)
	}
	var le *usage.LimitError
	if errors.As(err, &le) {
		return limitEnvelope(le)
	}
	return err
}

// registered returns the operation huma registered at method and path, nil when there is none.
func registered(a huma.API, method, path string) *huma.Operation {
	p := a.OpenAPI().Paths[path]
	if p == nil {
		return nil
	}
	switch method {
	case http.MethodGet:
		return p.Get
	case http.MethodPost:
		return p.Post
	case http.MethodPut:
		return p.Put
	case http.MethodPatch:
		return p.Patch
	case http.MethodDelete:
		return p.Delete
	}
	return nil
}
