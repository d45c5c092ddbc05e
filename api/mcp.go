package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/webhook"
)

// The MCP server (spec §1), on the official Go SDK's Streamable HTTP transport: the session-based versions
// (2024-11-05 … 2025-11-25, MCP sessions with Mcp-Session-Id, ping and DELETE to end one) and the stateless revision
// (2026-07-28: server/discover, no initialize, no MCP session; mcp_version.go). It has two faces and an address per
// session:
//
//   - /mcp, the workspace face: every registry verb is a tool, its input schema the verb's from the verb table. A
//     tool call is served in process by the verb's REST route, as tRPC serves it, so credentials, validation and
//     errors are the REST route's; a verb's error is a tool result with isError and the envelope.
//   - /mcp/envs/{slug}, an environment's own address: its production tools are the tools, and one MCP session is
//     one seeded doppel session, opened at initialize and closed when the MCP session ends (mcp_env.go); the
//     session-based versions only, as an MCP session is what opens the doppel session there.
//   - /mcp/envs/{slug}/sessions/{session_id}, one open doppel session's address (sessions.open answers it as
//     mcp_url): the same tools, every version, stateless (mcp_session.go).
//
// All take a workspace key (mk_live_…) or an MCP access token (mcp_at_…), which the OAuth 2.1 authorization server
// in oauth.go issues, and a session's address also its session token (ms_…); without one they answer 401 with
// WWW-Authenticate naming the protected resource metadata.

// Keys of doppel's entries in MCP _meta objects.
const (
	MetaSession  = "doppel.dev/session" // initialize result: the doppel session and its receipts
	MetaCall     = "doppel.dev/call"    // tools/call result: fidelity, rung, downgraded, callId, ms
	MetaError    = "doppel.dev/error"   // a failed tool call: the envelope and its HTTP status
	MetaToolVerb = "doppel.dev/verb"    // a workspace-face tool: the registry verb it serves (envs.list)
)

// ReceiptsURI is the environment face's resource holding the session's receipts.
const ReceiptsURI = "doppel://session/receipts"

// DefaultMCPTokenTTL is how long an OAuth-issued mcp_at_ token lives unless configured.
const DefaultMCPTokenTTL = time.Hour

// MCPRoutes serve /mcp, /mcp/envs/{slug}, and the OAuth 2.1 authorization server that issues mcp_at_ tokens.
type MCPRoutes struct {
	// Plane is the tool plane the environment face opens and calls sessions through (the REST routes' own).
	Plane *toolplane.Plane
	// Model says a model is configured (as SessionRoutes.Model: which tools can answer).
	Model bool
	// TokenTTL is how long an issued mcp_at_ token lives (default DefaultMCPTokenTTL).
	TokenTTL time.Duration
	// RefreshTTL is how long an issued refresh token lives (default DefaultRefreshTokenTTL); each refresh issues a
	// new one.
	RefreshTTL time.Duration
	// PublicURL is the server's public base URL (e.g. https://doppel.example.com, api.public_url): the issuer and
	// the resources' base in OAuth metadata, the resource tokens are bound to, and the origin MCP requests may come
	// from. Every absolute URL the MCP server and its OAuth server emit is built on it, never on a request's Host or
	// X-Forwarded-* headers. Required: Register panics without it.
	PublicURL string
	// AllowedOrigins are the origins (scheme://host[:port]) besides PublicURL's that browser-based MCP clients may
	// send requests from (mcp.allowed_origins); a request with another Origin is refused 403.
	AllowedOrigins []string
	// ClientMetadataGuard, when set, lets a client name itself by the https URL of its Client ID Metadata Document,
	// which the OAuth server fetches through this server-side request forgery guard (the webhooks' own); nil: only
	// registered clients. ClientMetadataTransport, when set, is the transport it fetches over (tests: a TLS root);
	// nil: one dialing through the guard.
	ClientMetadataGuard     *webhook.Guard
	ClientMetadataTransport http.RoundTripper
}

// mcpDeps is what both faces and the OAuth server share.
type mcpDeps struct {
	*MCPRoutes
	db     *bun.DB
	auth   *Authenticator
	logger *slog.Logger
	obs    Observer // counts environment-face tool calls with REST's and tRPC's; nil: none
}

// Register mounts the MCP server and its OAuth routes on d.Mux.
func (m *MCPRoutes) Register(a huma.API, d *Deps) {
	if m.Plane == nil {
		m.Plane = toolplane.New(toolplane.Options{DB: d.DB})
	}
	if m.TokenTTL <= 0 {
		m.TokenTTL = DefaultMCPTokenTTL
	}
	if m.RefreshTTL <= 0 {
		m.RefreshTTL = DefaultRefreshTokenTTL
	}
	if u, err := url.Parse(m.PublicURL); err != nil || u.Scheme == "" || u.Host == "" {
		panic(fmt.Sprintf("api: MCPRoutes.PublicURL must be the server's absolute public URL, not %q", m.PublicURL))
	}
	deps := &mcpDeps{MCPRoutes: m, db: d.DB, auth: d.Auth, logger: d.Logger, obs: d.Observer}
	ws := &workspaceFace{mcpDeps: deps, verbs: newVerbTable(a), mux: d.Mux}
	d.Mux.Handle("/mcp", deps.guard(ws.handler()))
	env := &envFace{mcpDeps: deps}
	d.Mux.Handle("/mcp/envs/{slug}", deps.guard(env.handler()))
	d.Mux.Handle(SessionMCPPath("{slug}", "{session_id}"), (&sessionFace{mcpDeps: deps}).handler())
	(&oauthServer{mcpDeps: deps}).register(d.Mux)
}

// base is the server's public base URL, without a trailing slash.
func (m *mcpDeps) base() string { return strings.TrimRight(m.PublicURL, "/") }

// origin is the public URL's origin (scheme://host[:port]).
func (m *mcpDeps) origin() string {
	u, _ := url.Parse(m.PublicURL)
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host)
}

// streamable returns the SDK's Streamable HTTP handler over getServer, with idle MCP sessions closed after the
// tool plane's idle time.
func (m *mcpDeps) streamable(getServer func(*http.Request) *mcp.Server) *mcp.StreamableHTTPHandler {
	return mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		Logger: m.logger, SessionTimeout: m.Plane.Idle(),
	})
}

// workspaceFace is /mcp: the registry verbs as tools.
type workspaceFace struct {
	*mcpDeps
	verbs *verbTable
	mux   http.Handler
}

func (f *workspaceFace) handler() http.Handler {
	build := func() *mcp.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "doppel", Title: "doppel workspace"}, &mcp.ServerOptions{
			Instructions: "doppel's verbs as tools: list and inspect environments, open sessions on their twins, " +
				"call tools in them, read transcripts. Inputs and answers are those of the REST API; a failed " +
				"verb answers isError with the error envelope {detail, code, requestId}.",
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
			Logger:       f.logger,
		})
		s.AddReceivingMiddleware(envelopeErrors)
		byVerb := map[string]string{}
		for _, v := range f.verbs.all() {
			if slices.Contains(v.Tags, "admin") {
				continue // admin verbs take the admin key, which the MCP server never holds
			}
			t := verbTool(v)
			s.AddTool(t, f.call(v))
			byVerb[v.Name] = t.Name
		}
		s.AddReceivingMiddleware(dottedToolNames(byVerb))
		return s
	}
	// The verbs are known once every route is registered, after Register: the server is built on first use.
	var once sync.Once
	var srv *mcp.Server
	get := func(*http.Request) *mcp.Server {
		once.Do(func() { srv = build() })
		return srv
	}
	// Every verb takes its credential and its session (if any) in the request, so the stateless revision needs no
	// state here: its requests go to a stateless handler over the same server.
	return versionSwitch(f.streamable(get), mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true, Logger: f.logger}))
}

// VerbToolName is the workspace-face tool name of a registry verb: the verb's name with its dots as underscores
// (envs.list → envs_list), in the alphabet MCP hosts and model APIs accept for tool and function names
// (^[a-zA-Z0-9_-]{1,64}$). Verb names are lower-case words joined by dots, so the mapping never gives two verbs
// one name (TestMCPToolNames checks the whole registry).
func VerbToolName(verb string) string { return strings.ReplaceAll(verb, ".", "_") }

// verbTool is the MCP tool of a verb: its name, docs and input schema from the verb table; the verb's own name is
// in _meta (MetaToolVerb).
func verbTool(v RegistryVerb) *mcp.Tool {
	desc := v.Summary
	if v.Description != "" {
		desc += "\n\n" + v.Description
	}
	t := &mcp.Tool{Name: VerbToolName(v.Name), Title: v.Summary, Description: desc, InputSchema: v.Input,
		Meta: mcp.Meta{MetaToolVerb: v.Name}}
	if v.Kind == string(Query) {
		t.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
	}
	return t
}

// dottedToolNames accepts a verb's former tool name (its dotted verb name, envs.list) on tools/call, for the
// deprecation period docs/surfaces.md states: the call is served by the tool now named for the verb. tools/list
// names only the new names.
func dottedToolNames(byVerb map[string]string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.CallToolRequest); ok && r.Params != nil {
				if name, ok := byVerb[r.Params.Name]; ok {
					r.Params.Name = name
				}
			}
			return next(ctx, method, req)
		}
	}
}

// call serves a verb's tool calls on the verb's REST route, in process, with the caller's credential.
func (f *workspaceFace) call(v RegistryVerb) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx = viaMCP(newRequest(ctx, f.logger))
		var header http.Header
		if req.Extra != nil {
			header = req.Extra.Header
		}
		r, err := verbRequest(ctx, header, "", v, req.Params.Arguments)
		if err != nil {
			return errorResult(ctx, err), nil
		}
		a := dispatch(f.mux, r)
		if a.envelope != nil {
			return errorResult(ctx, a.envelope), nil
		}
		res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(a.data)}}}
		if len(a.data) > 0 && a.data[0] == '{' {
			res.StructuredContent = a.data
		}
		return res, nil
	}
}

// errorResult is a failed tool call: isError, the envelope as the text the model reads, and the envelope with its
// HTTP status under _meta.
func errorResult(ctx context.Context, err error) *mcp.CallToolResult {
	e, status := EnvelopeOf(ctx, err)
	b, _ := json.Marshal(e)
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: string(b)}},
		Meta:    mcp.Meta{MetaError: map[string]any{"httpStatus": status, "envelope": e}},
	}
}
