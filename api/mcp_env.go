package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/faults"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// mcpSessionHeader names an MCP session on the Streamable HTTP transport.
const mcpSessionHeader = "Mcp-Session-Id"

// envFace is /mcp/envs/{slug}: an environment's production tools as MCP tools, one seeded doppel session per MCP
// session. The session opens at initialize, with the seed, seed instructions (or scenario, or a trace to open from)
// and clock given as query parameters of the address or in the initialize request's _meta; its receipts are in the initialize result's
// _meta and in the resource doppel://session/receipts. tools/list is the REST tool listing's (names, descriptions,
// input schemas); tools/call is a session call through the tool plane, journaled, with its fidelity and rung in the
// result's _meta and a tool's own error as isError. Ending the MCP session (DELETE, or the session idling out)
// closes the doppel session.
type envFace struct {
	*mcpDeps
	h        *mcp.StreamableHTTPHandler
	sessions sync.Map // MCP session id → *envSession
}

// envStart is what a new MCP session of an environment starts from, read before the SDK takes the request.
type envStart struct {
	principal *Principal
	env       *schema.Environment
	tools     ToolList // AnthropicTool entries: the tools that can answer
	spec      openSpec
	refusal   *refusal // where initialize records a refusal of the request (quota, access) for its HTTP status
}

type envStartKey struct{}

func (f *envFace) handler() http.Handler {
	f.h = f.streamable(f.server)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A stateless request's body is read for its id, which the refusal answers.
		if c := mcpVersion(r, r.Header.Get(mcpVersionHeader) >= MCPStatelessVersion); c.stateless {
			f.refuseStateless(w, r, c)
			return
		}
		id := r.Header.Get(mcpSessionHeader)
		switch {
		case id == "" && r.Method == http.MethodPost:
			start, err := f.prepare(r)
			if err != nil {
				WriteError(w, r, err)
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), envStartKey{}, start))
		case id != "":
			if v, ok := f.sessions.Load(id); ok && v.(*envSession).start.env.Slug != r.PathValue("slug") {
				WriteError(w, r, NotFound("MCP session %s is not a session of environment %s", id, r.PathValue("slug")))
				return
			}
		}
		if r.Method != http.MethodDelete || id == "" {
			f.h.ServeHTTP(w, r)
			return
		}
		cw := &codeWriter{ResponseWriter: w}
		f.h.ServeHTTP(cw, r)
		if cw.code < 300 {
			if v, ok := f.sessions.Load(id); ok {
				v.(*envSession).end() // now, so the DELETE answers after the doppel session is closed
			}
		}
	})
}

// refuseStateless answers a request of the stateless revision at an environment's own address, which opens a
// doppel session per MCP session and so speaks only the session-based versions: -32022 with those versions (SEP-2575's
// answer to a version a server does not serve, server/discover included, so a client falls back to initialize) and
// how to reach the stateless revision: at a session's own address, which sessions.open answers.
func (f *envFace) refuseStateless(w http.ResponseWriter, r *http.Request, c mcpRequest) {
	slug := r.PathValue("slug")
	detail := fmt.Sprintf("MCP %s is served per session: open a session (POST /v1/envs/%s/sessions, or the "+
		"sessions_open tool of /mcp) and send requests to its mcp_url (%s/mcp/envs/%s/sessions/{session_id}) with its "+
		"session token as the bearer; this address opens a session per MCP session at initialize, with protocol "+
		"versions %s", c.version, slug, f.base(), slug, strings.Join(MCPSessionVersions(), ", "))
	e := NewError(http.StatusBadRequest, detail)
	e.RequestID = RequestID(r.Context())
	writeRPCError(w, http.StatusBadRequest, c.id, mcp.CodeUnsupportedProtocolVersion, detail, map[string]any{
		"supported": MCPSessionVersions(), "requested": c.version, "httpStatus": http.StatusBadRequest, "envelope": e})
}

// prepare reads the environment, its tools and the session's seeding from the address of a new MCP session.
func (f *envFace) prepare(r *http.Request) (*envStart, error) {
	ctx := r.Context()
	p := PrincipalFrom(ctx)
	slug := r.PathValue("slug")
	spec, err := specFromQuery(r)
	if err != nil {
		return nil, err
	}
	env, build, err := (&control.Envs{DB: f.db}).Active(ctx, p.Workspace.ID, slug)
	if err != nil {
		return nil, err
	}
	b, err := f.Plane.Bundles().Get(ctx, build)
	if err != nil {
		return nil, err
	}
	tools, err := ToolEntries(b, build, FormatAnthropic, f.Model)
	if err != nil {
		return nil, err
	}
	return &envStart{principal: p, env: env, tools: tools, spec: spec, refusal: refusalOf(r)}, nil
}

// server is the MCP server of one new MCP session.
func (f *envFace) server(r *http.Request) *mcp.Server {
	start, _ := r.Context().Value(envStartKey{}).(*envStart)
	if start == nil {
		return nil
	}
	es := &envSession{face: f, start: start}
	s := mcp.NewServer(&mcp.Implementation{Name: "doppel/" + start.env.Slug, Title: start.env.Name}, &mcp.ServerOptions{
		Instructions: "The tools of environment " + start.env.Slug + ", answered by its doppel twin in a session " +
			"of its own, seeded at initialize. Read " + ReceiptsURI + " for the seed, world hash and clock.",
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
		Logger:       f.logger,
		// This address opens a doppel session per MCP session; the stateless revision is served at each session's
		// own address (sessionFace), so server/discover and version errors here name the session-based versions.
		SupportedProtocolVersions: MCPSessionVersions(),
	})
	s.AddReceivingMiddleware(envelopeErrors, es.initialize)
	addEnvTools(s, start.tools, es.call, es.receipts)
	return s
}

// addEnvTools adds an environment's tools (AnthropicTool entries) to s, each served by call, and the receipts
// resource served by receipts.
func addEnvTools(s *mcp.Server, tools ToolList, call mcp.ToolHandler, receipts mcp.ResourceHandler) {
	for _, e := range tools {
		t := e.(AnthropicTool)
		s.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: objectSchema(t.InputSchema)}, call)
	}
	s.AddResource(&mcp.Resource{URI: ReceiptsURI, Name: "receipts", MIMEType: "application/json",
		Description: "The session's receipts: seed, seed instructions or scenario, world hash, clock, and its state now."}, receipts)
}

// objectSchema is a tool's input schema as MCP needs it: an object schema (a schema of another type is wrapped
// as {"type":"object"} rather than refused).
func objectSchema(in json.RawMessage) json.RawMessage {
	var m map[string]any
	if json.Unmarshal(in, &m) != nil || m["type"] != "object" {
		return emptyObjectSchema
	}
	return in
}

// envSession is one MCP session of an environment and the doppel session it opened.
type envSession struct {
	face  *envFace
	start *envStart

	mu     sync.Mutex
	opened *toolplane.Opened
	ended  sync.Once
}

// initialize opens the doppel session when the MCP session initializes, and answers the receipts in _meta.
func (s *envSession) initialize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "initialize" {
			return next(ctx, method, req)
		}
		ctx = newRequest(ctx, s.face.logger)
		var meta map[string]any
		if params, ok := req.GetParams().(*mcp.InitializeParams); ok && params != nil {
			meta = params.Meta
		}
		open, err := s.start.spec.merge(meta).request(s.start)
		if err != nil {
			return nil, rpcError(ctx, err)
		}
		opened, err := s.face.Plane.Open(ctx, open)
		if err != nil {
			err = s.start.spec.merge(meta).relocate(err)
			s.start.refusal.refuse(ctx, err) // over a quota: the request answers 402 with the envelope
			return nil, rpcError(ctx, err)
		}
		s.mu.Lock()
		s.opened = opened
		s.mu.Unlock()
		res, err := next(ctx, method, req)
		ss, _ := req.GetSession().(*mcp.ServerSession)
		ir, ok := res.(*mcp.InitializeResult)
		if err != nil || !ok || ss == nil {
			s.end()
			if err == nil {
				err = fmt.Errorf("mcp: initialize answered %T", res)
			}
			return res, err
		}
		if id := ss.ID(); id != "" {
			s.face.sessions.Store(id, s)
		}
		go func() {
			_ = ss.Wait()
			s.end()
		}()
		ir.Meta = mcp.Meta{MetaSession: s.view(nil)}
		return ir, nil
	}
}

// end closes the doppel session, once.
func (s *envSession) end() {
	s.ended.Do(func() {
		s.mu.Lock()
		o := s.opened
		s.mu.Unlock()
		if o == nil {
			return
		}
		if _, err := s.face.Plane.Close(context.Background(), o.Session); err != nil {
			s.face.logger.Warn("close the session of an MCP session", "session", o.Session.ID, "error", err)
		}
	})
	s.face.sessions.Range(func(k, v any) bool {
		if v == s {
			s.face.sessions.Delete(k)
		}
		return true
	})
}

// current is the session as it stands now (through the tool plane's token cache, as REST calls read it).
func (s *envSession) current(ctx context.Context) (*schema.Session, error) {
	s.mu.Lock()
	o := s.opened
	s.mu.Unlock()
	if o == nil {
		return nil, NotFound("this MCP session has no doppel session: initialize it first")
	}
	cur, _, err := s.face.Plane.Tokens().Resolve(ctx, o.Token)
	if err != nil {
		return nil, StoreError(err, "session "+o.Session.ID)
	}
	c := *cur
	if err := SessionGone(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func (s *envSession) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	ctx = newRequest(ctx, s.face.logger)
	sess, err := s.current(ctx)
	if err != nil {
		return errorResult(ctx, err), nil
	}
	return s.face.callTool(ctx, sess, req), nil
}

// callTool is a tools/call of an environment's tool: a call in session sess through the tool plane, journaled,
// with its fidelity and rung in the result's _meta and a tool's own error as isError.
func (m *mcpDeps) callTool(ctx context.Context, sess *schema.Session, req *mcp.CallToolRequest) *mcp.CallToolResult {
	args := req.Params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	begun := time.Now()
	res, err := m.Plane.Call(ctx, sess, toolplane.CallRequest{Tool: req.Params.Name, Arguments: args, Requestor: "assistant"})
	if err != nil {
		return errorResult(ctx, err)
	}
	if m.obs != nil {
		// Auth happened once for the MCP request that carries this call, outside it.
		m.obs.Call("mcp", res.Fidelity, res.Rung, 0, res.Twin, res.Journal, time.Since(begun))
	}
	meta := map[string]any{"sessionId": sess.ID, "callId": res.CallID, "fidelity": res.Fidelity,
		"rung": res.Rung, "downgraded": res.Downgraded, "ms": res.Ms}
	if res.Fault != nil {
		meta["fault"] = callFault(res.Fault)
	}
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: res.Content}},
		IsError: res.Error,
		Meta:    mcp.Meta{MetaCall: meta},
	}
}

// MCPReceipts are an environment MCP session's receipts: the doppel session, what seeded its world, and its state.
type MCPReceipts struct {
	SessionID        string              `json:"sessionId"`
	Env              string              `json:"env"`
	Seeded           bool                `json:"seeded"`
	Seed             int64               `json:"seed"`
	SeedInstructions string              `json:"seedInstructions"`
	Scenario         *string             `json:"scenario"`
	Note             *string             `json:"note"`
	WorldHash        string              `json:"worldHash"`
	Clock            string              `json:"clock"`
	Pinned           map[string][]string `json:"pinned"`
	StateHash        string              `json:"stateHash,omitempty"`
	Trace            *TraceReceipt       `json:"trace,omitempty"`
	NCalls           int64               `json:"nCalls"`
	ExpiresAt        *time.Time          `json:"expiresAt,omitempty"`
}

// view renders the receipts, with the session's state when st is given.
func (s *envSession) view(st *toolplane.State) MCPReceipts {
	s.mu.Lock()
	o := s.opened
	s.mu.Unlock()
	return newMCPReceipts(s.start.env.Slug, o.Session, o.Receipts, st)
}

// newMCPReceipts are the receipts of session sess of environment env, from the receipts rc its world was opened
// with, and its state now when st is given.
func newMCPReceipts(env string, sess *schema.Session, rc rpc.Receipts, st *toolplane.State) MCPReceipts {
	v := MCPReceipts{SessionID: sess.ID, Env: env, Seeded: rc.Seeded, Seed: rc.Seed,
		SeedInstructions: rc.SeedInstructions, Scenario: rc.Scenario, Note: rc.Note, WorldHash: rc.WorldHash,
		Clock: rc.Clock, Pinned: rc.Pinned, StateHash: sess.StateHash, ExpiresAt: &sess.ExpiresAt,
		Trace: traceReceipt(rc.Trace)}
	if st != nil {
		v.StateHash, v.NCalls, v.ExpiresAt = st.StateHash, st.NCalls, &st.ExpiresAt
	}
	return v
}

func (s *envSession) receipts(ctx context.Context, _ *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	ctx = newRequest(ctx, s.face.logger)
	sess, err := s.current(ctx)
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	st, err := s.face.Plane.Read(ctx, sess)
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	b, err := json.Marshal(s.view(st))
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: ReceiptsURI, MIMEType: "application/json", Text: string(b)}}}, nil
}

// rpcError is a JSON-RPC error carrying the envelope: invalid params for a refusal (4xx), internal otherwise.
func rpcError(ctx context.Context, err error) error {
	e, status := EnvelopeOf(ctx, err)
	data, _ := json.Marshal(map[string]any{"httpStatus": status, "envelope": e})
	code := int64(jsonrpc.CodeInvalidParams)
	if status >= 500 {
		code = jsonrpc.CodeInternalError
	}
	return &jsonrpc.Error{Code: code, Message: e.Detail, Data: data}
}

// openSpec is how an MCP session's world is seeded, from the address's query or the initialize _meta; where is
// "query" or "_meta", for naming a bad field.
type openSpec struct {
	seed            *int64
	instrA, instrB  *string
	scenario, clock *string
	record          *bool
	faults          faults.Spec
	trace           *toolplane.TraceParam
	where           map[string]string // parameter name → query or _meta
	err             error             // the first bad _meta parameter
}

// openParams are the names an MCP address and the initialize _meta take.
var openParams = []string{"seed", "seed_instructions", "seedInstructions", "scenario", "clock", "recordOutputs", "faults", "trace"}

func specFromQuery(r *http.Request) (openSpec, error) {
	q := r.URL.Query()
	sp := openSpec{where: map[string]string{}}
	for name := range q {
		known := false
		for _, p := range openParams {
			known = known || p == name
		}
		if !known {
			return sp, Invalid("query."+name, fmt.Sprintf("unknown parameter: an MCP address takes %v", openParams))
		}
	}
	for _, name := range openParams {
		if !q.Has(name) {
			continue
		}
		if err := sp.set("query", name, q.Get(name)); err != nil {
			return sp, err
		}
	}
	return sp, nil
}

// set records one parameter given as text (query) or as a JSON value (_meta).
func (sp *openSpec) set(where, name string, v any) error {
	field := where + "." + name
	if prev, ok := sp.where[name]; ok {
		return Invalid(field, "also given in "+prev+": give it once")
	}
	sp.where[name] = where
	str := func() (*string, error) {
		s, ok := v.(string)
		if !ok {
			return nil, Invalid(field, "expected a string")
		}
		return &s, nil
	}
	var err error
	switch name {
	case "seed":
		var n int64
		switch x := v.(type) {
		case string:
			n, err = strconv.ParseInt(x, 10, 64)
		case float64:
			if x != math.Trunc(x) {
				err = fmt.Errorf("not an integer")
			}
			n = int64(x)
		default:
			err = fmt.Errorf("not an integer")
		}
		if err != nil || n < 0 || n > 1<<53-1 {
			return Invalid(field, "expected an integer from 0 to 9007199254740991")
		}
		sp.seed = &n
	case "seed_instructions":
		sp.instrA, err = str()
	case "seedInstructions":
		sp.instrB, err = str()
	case "scenario":
		sp.scenario, err = str()
	case "clock":
		sp.clock, err = str()
	case "recordOutputs":
		var b bool
		switch x := v.(type) {
		case string:
			b, err = strconv.ParseBool(x)
		case bool:
			b = x
		default:
			err = fmt.Errorf("not a boolean")
		}
		if err != nil {
			return Invalid(field, "expected true or false")
		}
		sp.record = &b
	case "faults":
		// A fault plan (as sessions.open's body takes it): JSON text in a query, an object in _meta.
		raw, ok := v.(string)
		if !ok {
			b, merr := json.Marshal(v)
			if merr != nil {
				return Invalid(field, "expected a JSON object: tool → {error_rate, timeout_rate, timeout_ms, latency}")
			}
			raw = string(b)
		}
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if derr := dec.Decode(&sp.faults); derr != nil {
			return Invalid(field, "expected a JSON object: tool → {error_rate, timeout_rate, timeout_ms, latency}: "+derr.Error())
		}
	case "trace":
		// The trace the world opens from (as sessions.open's body takes it): in a query, a held trace's id (or the
		// trace as JSON text); in _meta, the id or the trace object.
		var raw []byte
		if x, ok := v.(string); ok && !strings.HasPrefix(strings.TrimSpace(x), "{") {
			raw, _ = json.Marshal(x)
		} else if ok {
			raw = []byte(x)
		} else if raw, err = json.Marshal(v); err != nil {
			return Invalid(field, "expected a trace id or a trace {id, model, messages}")
		}
		sp.trace, err = toolplane.ParseTraceParam(field, raw)
	}
	return err
}

// merge adds the initialize request's _meta to a spec read from the query (a name given in both is refused).
func (sp openSpec) merge(meta map[string]any) openSpec {
	out := sp
	out.where = map[string]string{}
	for k, v := range sp.where {
		out.where[k] = v
	}
	for _, name := range openParams {
		if v, ok := meta[name]; ok && out.err == nil {
			out.err = out.set("_meta", name, v)
		}
	}
	return out
}

// request is the tool plane's open request of the spec.
func (sp openSpec) request(start *envStart) (toolplane.OpenRequest, error) {
	if sp.err != nil {
		return toolplane.OpenRequest{}, sp.err
	}
	var instr string
	switch {
	case sp.instrA != nil && sp.instrB != nil && *sp.instrA != *sp.instrB:
		return toolplane.OpenRequest{}, Invalid(sp.where["seedInstructions"]+".seedInstructions",
			"differs from seed_instructions: give one of the two names, or the same value under both")
	case sp.instrA != nil:
		instr = *sp.instrA
	case sp.instrB != nil:
		instr = *sp.instrB
	}
	req := toolplane.OpenRequest{WorkspaceID: start.principal.Workspace.ID, KeyID: start.principal.Key.ID,
		Env: start.env.Slug, Seed: sp.seed, SeedInstructions: instr}
	if sp.scenario != nil {
		req.Scenario = *sp.scenario
	}
	if sp.clock != nil {
		req.Clock = *sp.clock
	}
	if sp.record != nil {
		req.RecordOutputs = *sp.record
	}
	req.Faults = sp.faults
	req.Trace = sp.trace
	return req, nil
}

// relocate names a refused open parameter where it was given (query.clock, _meta.scenario) instead of in a body.
func (sp openSpec) relocate(err error) error {
	var pe *toolplane.Error
	if errors.As(err, &pe) && pe.Kind == toolplane.Invalid {
		if name, ok := strings.CutPrefix(pe.Field, "body."); ok {
			root, _, _ := strings.Cut(name, ".") // faults.<tool>.error_rate was given as faults
			if where, ok := sp.where[root]; ok {
				return &toolplane.Error{Kind: pe.Kind, Field: where + "." + name, Detail: pe.Detail}
			}
		}
	}
	return err
}

// codeWriter records the status a handler answered with.
type codeWriter struct {
	http.ResponseWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *codeWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
