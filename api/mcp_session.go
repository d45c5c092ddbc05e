package api

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/store"
)

// sessionFace is /mcp/envs/{slug}/sessions/{session_id}: one open doppel session's address, which sessions.open and
// sessions.fork answer as mcp_url. It serves the environment's tools, as the session's build lists them, on the
// SDK's stateless handler: every MCP version, the stateless revision (2026-07-28) included, with no MCP session to
// keep, so any serve replica answers any request. Its credential is the session's token (ms_…), a workspace key of
// its workspace, or an MCP token for the environment's address or this one. The session is not closed when a
// client goes away: sessions.close (or its idle expiry) ends it, as on REST.
type sessionFace struct {
	*mcpDeps

	mu    sync.Mutex
	built map[string]*faceServer // build id → its server
}

// faceServer is the MCP server of one build's sessions, and the slug of its environment.
type faceServer struct {
	srv  *mcp.Server
	slug string
}

// maxFaceServers bounds the servers kept: past it, the cache starts again empty (a server is rebuilt from the
// bundle cache on its build's next request).
const maxFaceServers = 256

// SessionMCPPath is the path of a session's own MCP address.
func SessionMCPPath(slug, sessionID string) string {
	return "/mcp/envs/" + slug + "/sessions/" + sessionID
}

func (f *sessionFace) handler() http.Handler {
	f.built = map[string]*faceServer{}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		p := PrincipalFrom(r.Context())
		if p == nil || p.Session == nil {
			return nil
		}
		fs, err := f.server(r.Context(), p)
		if err != nil {
			return nil
		}
		return fs.srv
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: f.logger})
	return f.guardWith(f.authenticate, h)
}

// authenticate admits a request for the session its path names, of the environment its path names.
func (f *sessionFace) authenticate(r *http.Request) (*Principal, error) {
	ctx := viaMCP(r.Context())
	id := r.PathValue("session_id")
	p, err := f.auth.Session(ctx, r.Header.Get("Authorization"), id)
	if err != nil {
		return nil, err
	}
	fs, err := f.server(ctx, p)
	if err != nil {
		return nil, err
	}
	if fs.slug != r.PathValue("slug") {
		return nil, NotFound("session %s is not a session of environment %s: its address is %s", id, r.PathValue("slug"),
			f.base()+SessionMCPPath(fs.slug, id))
	}
	return p, nil
}

// server is the MCP server of p's session's build, built on first use.
func (f *sessionFace) server(ctx context.Context, p *Principal) (*faceServer, error) {
	build := p.Session.BuildID
	f.mu.Lock()
	fs, ok := f.built[build]
	f.mu.Unlock()
	if ok {
		return fs, nil
	}
	b, err := store.GetBuild(ctx, f.db, p.Workspace.ID, build)
	if err != nil {
		return nil, StoreError(err, "build "+build)
	}
	env, err := store.GetEnvByID(ctx, f.db, b.EnvID)
	if err != nil {
		return nil, StoreError(err, "environment of build "+build)
	}
	bundle, err := f.Plane.Bundles().Get(ctx, b)
	if err != nil {
		return nil, err
	}
	tools, err := ToolEntries(bundle, b, FormatAnthropic, f.Model)
	if err != nil {
		return nil, err
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "doppel/" + env.Slug, Title: env.Name}, &mcp.ServerOptions{
		Instructions: "The tools of environment " + env.Slug + ", answered by its doppel twin in the session this " +
			"address names. Read " + ReceiptsURI + " for the seed, world hash, clock and the session's state.",
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
		Logger:       f.logger,
	})
	s.AddReceivingMiddleware(envelopeErrors)
	addEnvTools(s, tools, f.call, f.receipts)
	fs = &faceServer{srv: s, slug: env.Slug}
	f.mu.Lock()
	if len(f.built) >= maxFaceServers {
		clear(f.built)
	}
	f.built[build] = fs
	f.mu.Unlock()
	return fs, nil
}

// session is the open session of the request extra belongs to.
func (f *sessionFace) session(extra *mcp.RequestExtra) (*Principal, error) {
	p := principalOf(extra)
	if p == nil || p.Session == nil {
		return nil, Unauthorized("no session: send the session token (ms_…) as the bearer")
	}
	s := *p.Session
	if err := SessionGone(&s); err != nil {
		return nil, err
	}
	return &Principal{Workspace: p.Workspace, Key: p.Key, Session: &s}, nil
}

func (f *sessionFace) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	ctx = newRequest(ctx, f.logger)
	p, err := f.session(req.Extra)
	if err != nil {
		return errorResult(ctx, err), nil
	}
	return f.callTool(ctx, p.Session, req), nil
}

func (f *sessionFace) receipts(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	ctx = newRequest(ctx, f.logger)
	p, err := f.session(req.Extra)
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	fs, err := f.server(ctx, p)
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	st, err := f.Plane.Read(ctx, p.Session)
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	s := p.Session
	v := newMCPReceipts(fs.slug, s, st.Receipts, st)
	// A fork's world is its parent's after the fork's call: the session row holds its own hash, as REST reads it.
	v.Seeded, v.Seed, v.WorldHash, v.Clock = s.Seeded, s.Seed, s.WorldHash, s.Clock
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: ReceiptsURI, MIMEType: "application/json", Text: string(b)}}}, nil
}

// sessionMCPURL is the MCP address of session id of environment slug on the public base URL base ("" when base is).
func sessionMCPURL(base, slug, id string) string {
	if base == "" {
		return ""
	}
	return base + SessionMCPPath(slug, id)
}
