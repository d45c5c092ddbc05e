package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
)

// resourceMetadataURL is the protected resource metadata (RFC 9728) of the resource r addresses, at the
// path-suffixed well-known address. An environment address's query (its seed) is part of the resource, as an MCP
// client names it, so it is kept.
func (m *mcpDeps) resourceMetadataURL(r *http.Request) string {
	u := m.base() + wellKnownResource + r.URL.Path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u
}

// allowedOrigin says whether a browser may send MCP requests from origin: the public URL's origin, or one the
// configuration allows. Origins compare as scheme://host[:port], case-insensitively.
func (m *mcpDeps) allowedOrigin(origin string) bool {
	o := strings.ToLower(strings.TrimRight(origin, "/"))
	if o == m.origin() {
		return true
	}
	return slices.ContainsFunc(m.AllowedOrigins, func(a string) bool { return strings.ToLower(strings.TrimRight(a, "/")) == o })
}

// guard admits a request to an MCP address whose credential is a workspace key or an MCP token (the workspace
// face and the environment addresses); guardWith says how every guard admits and answers.
func (m *mcpDeps) guard(next http.Handler) http.Handler {
	return m.guardWith(func(r *http.Request) (*Principal, error) {
		return m.auth.Key(r.Context(), r.Header.Get("Authorization"), cred.KindWorkspace, cred.KindMCP)
	}, next)
}

// tokenPrincipal is the TokenInfo.Extra entry that carries the request's Principal to the MCP handlers (the SDK gives
// them the request's token information, not its context).
const tokenPrincipal = "doppel.principal"

// guardWith admits a request to an MCP address, and answers every refusal — its own and the SDK's — as the envelope
// with the refusal's HTTP status (spec §7):
//
//   - a present Origin that is not the public URL's or an allowed one is 403 (the Streamable HTTP transport's
//     defence against DNS rebinding); requests without Origin (non-browser clients) pass;
//   - authenticate must name the caller, as REST requires it (revoked, expired and unknown credentials are 401, a
//     workspace without access or without the mcp entitlement 403); a 401 names the protected resource metadata so
//     an MCP client can start OAuth;
//   - an OAuth token works only on the MCP address it was issued for and on the addresses under it (RFC 8707: a
//     token for /mcp/envs/x serves x's session addresses), else 401 invalid_token.
//
// The SDK's RequireBearerToken then records the token's holder, so the SDK refuses an MCP session to another
// workspace, and hands the Principal to the handlers in TokenInfo.Extra (tokenPrincipal).
func (m *mcpDeps) guardWith(authenticate func(*http.Request) (*Principal, error), next http.Handler) http.Handler {
	verified := auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		p := PrincipalFrom(ctx)
		if p == nil {
			return nil, auth.ErrInvalidToken
		}
		info := &auth.TokenInfo{UserID: p.Workspace.ID, Extra: map[string]any{tokenPrincipal: p}}
		if p.Key != nil && p.Key.ExpiresAt != nil {
			info.Expiration = *p.Key.ExpiresAt
		}
		return info, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && !m.allowedOrigin(o) {
			WriteError(w, r, NewError(http.StatusForbidden, "origin "+o+" may not use this MCP server: requests from a "+
				"browser must come from "+m.origin()+" or an origin in mcp.allowed_origins"))
			return
		}
		p, err := authenticate(r)
		if err != nil {
			if _, status := EnvelopeOf(r.Context(), err); status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+m.resourceMetadataURL(r)+`"`)
			}
			WriteError(w, r, err)
			return
		}
		if !p.Workspace.HasEntitlement(schema.EntitlementMCP) {
			WriteError(w, r, Forbidden(AccessDenied, "this workspace is not entitled to the MCP server (entitlement mcp)"))
			return
		}
		here := m.base() + r.URL.Path
		if res := resourceOf(p); res != "" && res != here && !strings.HasPrefix(here, res+"/sessions/") {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description="the token is for another resource", resource_metadata="`+
				m.resourceMetadataURL(r)+`"`)
			WriteError(w, r, Unauthorized("this token was issued for "+res+", not "+here+
				": a token works only on the MCP address it was authorized for (RFC 8707); authorize this address"))
			return
		}
		ew := &envelopeWriter{w: w, r: r}
		ctx := context.WithValue(WithPrincipal(r.Context(), p), refusalKey{}, &ew.refusal)
		verified.ServeHTTP(ew, r.WithContext(ctx))
		ew.finish()
	})
}

// resourceOf is the resource the principal's key is bound to ("" for none, or for a session token).
func resourceOf(p *Principal) string {
	if p.Key == nil {
		return ""
	}
	return p.Key.Resource
}

// principalOf is the Principal guardWith admitted the MCP request of extra with.
func principalOf(extra *mcp.RequestExtra) *Principal {
	if extra == nil || extra.TokenInfo == nil {
		return nil
	}
	p, _ := extra.TokenInfo.Extra[tokenPrincipal].(*Principal)
	return p
}

// refusal is a refusal of an MCP request itself (auth, quota, access, size) found while the SDK serves it (an
// environment address opening its session at initialize): the request answers its HTTP status and the envelope,
// not a JSON-RPC error in a 200.
type refusal struct {
	mu  sync.Mutex
	err error
}

type refusalKey struct{}

// refusalOf is the refusal holder of the MCP request r (set by guard); nil outside it.
func refusalOf(r *http.Request) *refusal {
	rf, _ := r.Context().Value(refusalKey{}).(*refusal)
	return rf
}

// refuse records err as the refusal of the MCP request rf belongs to, when err is one (401, 402, 403, 413, 429),
// and says whether it was.
func (rf *refusal) refuse(ctx context.Context, err error) bool {
	if rf == nil {
		return false
	}
	switch _, status := EnvelopeOf(ctx, err); status {
	case http.StatusUnauthorized, http.StatusPaymentRequired, http.StatusForbidden, http.StatusRequestEntityTooLarge,
		http.StatusTooManyRequests:
		rf.mu.Lock()
		rf.err = err
		rf.mu.Unlock()
		return true
	}
	return false
}

// envelopeWriter turns the SDK's plain-text refusals (http.Error: 400 malformed payload, 403 session user
// mismatch, 404 session not found, 413 body too large, …) into the envelope with the same status, and answers a
// recorded refusal in place of the 200 the SDK would write. Everything else, streams included, passes through.
type envelopeWriter struct {
	w       http.ResponseWriter
	r       *http.Request
	refusal refusal

	wrote    bool
	status   int
	captured *bytes.Buffer // a plain-text error's body, or nil
	swallow  bool          // the answer was replaced: drop what the SDK writes
}

func (e *envelopeWriter) Header() http.Header { return e.w.Header() }

func (e *envelopeWriter) WriteHeader(code int) {
	if e.wrote {
		return
	}
	e.wrote, e.status = true, code
	e.refusal.mu.Lock()
	err := e.refusal.err
	e.refusal.mu.Unlock()
	switch {
	case err != nil && code < 300:
		e.swallow = true
		e.w.Header().Del(mcpSessionHeader)
		e.w.Header().Del("Cache-Control")
		WriteError(e.w, e.r, err)
	case code >= 400 && strings.HasPrefix(e.w.Header().Get("Content-Type"), "text/plain"):
		e.captured = new(bytes.Buffer)
	default:
		e.w.WriteHeader(code)
	}
}

func (e *envelopeWriter) Write(b []byte) (int, error) {
	if !e.wrote {
		e.WriteHeader(http.StatusOK)
	}
	switch {
	case e.swallow:
		return len(b), nil
	case e.captured != nil:
		if e.captured.Len() < 4<<10 {
			e.captured.Write(b)
		}
		return len(b), nil
	}
	return e.w.Write(b)
}

// Flush passes a stream's flushes on.
func (e *envelopeWriter) Flush() {
	if e.captured == nil && !e.swallow {
		if f, ok := e.w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

func (e *envelopeWriter) Unwrap() http.ResponseWriter { return e.w }

// finish writes a captured plain-text error as the envelope.
func (e *envelopeWriter) finish() {
	if e.captured == nil {
		return
	}
	e.w.Header().Del("X-Content-Type-Options")
	detail := strings.TrimSpace(e.captured.String())
	if detail == "" {
		detail = http.StatusText(e.status)
	}
	WriteError(e.w, e.r, NewError(e.status, "MCP: "+detail))
}

// envelopeErrors gives every JSON-RPC error a method answers the envelope in error.data ({httpStatus, envelope},
// as tRPC's error.data carries it): the SDK's own (an unknown tool or method, bad params) get the envelope of the
// HTTP status their code stands for.
func envelopeErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err == nil {
			return res, nil
		}
		var je *jsonrpc.Error
		if !errors.As(err, &je) {
			return res, rpcError(ctx, err)
		}
		if len(je.Data) > 0 {
			return res, err
		}
		status := http.StatusBadRequest
		switch je.Code {
		case jsonrpc.CodeInvalidParams:
			status = http.StatusUnprocessableEntity
		case jsonrpc.CodeMethodNotFound:
			status = http.StatusNotFound
		case jsonrpc.CodeInternalError:
			status = http.StatusInternalServerError
		}
		e := NewError(status, je.Message)
		e.RequestID = RequestID(ctx)
		data, _ := json.Marshal(map[string]any{"httpStatus": status, "envelope": e})
		return res, &jsonrpc.Error{Code: je.Code, Message: je.Message, Data: data}
	}
}
