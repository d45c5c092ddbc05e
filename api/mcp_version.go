package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP protocol versions. The stateless revision (2026-07-28, SEP-2575: no initialize and no Mcp-Session-Id; each
// request names its version and client in _meta and the Mcp-Protocol-Version, Mcp-Method and Mcp-Name headers;
// server/discover lists what a server speaks) is served beside the session-based versions (2024-11-05 …
// 2025-11-25) on the same addresses. The SDK serves the stateless revision only from a stateless handler, and MCP
// sessions only from a stateful one, so each address keeps one of each and a request goes to the one its version
// needs (mcpVersion).

// MCPStatelessVersion is the first stateless MCP revision.
const MCPStatelessVersion = "2026-07-28"

const mcpVersionHeader = "Mcp-Protocol-Version"

// mcpMethodDiscover is the stateless revision's discovery request.
const mcpMethodDiscover = "server/discover"

// mcpPeekLimit is how much of a request body mcpVersion reads to learn its method and version; a larger body is
// not a discovery request, and goes to the handler its header names.
const mcpPeekLimit = 1 << 20

// MCPSessionVersions are the session-based MCP versions the SDK serves, newest first.
func MCPSessionVersions() []string {
	return slices.DeleteFunc(mcp.SupportedProtocolVersions(), func(v string) bool { return v >= MCPStatelessVersion })
}

// mcpMessage is what mcpVersion reads of a JSON-RPC request: its id, method and _meta's protocol version.
type mcpMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Meta map[string]any `json:"_meta"`
	} `json:"params"`
}

// mcpRequest is a request to an MCP address as mcpVersion classified it.
type mcpRequest struct {
	stateless bool   // a request of the stateless revision (or a later one)
	version   string // the version it names ("" when it names none)
	method    string // its JSON-RPC method, when the body was read ("" otherwise)
	id        json.RawMessage
}

// mcpVersion classifies r: a stateless request names MCPStatelessVersion or later in its Mcp-Protocol-Version
// header, or (a POST outside any MCP session, without the header) is server/discover or names the version in its
// _meta. The body is read, and put back, only when needed: always when read is set, else only for a POST without
// the header and without Mcp-Session-Id (an MCP session's first request).
func mcpVersion(r *http.Request, read bool) mcpRequest {
	c := mcpRequest{version: r.Header.Get(mcpVersionHeader)}
	c.stateless = c.version >= MCPStatelessVersion
	if r.Method != http.MethodPost || r.Body == nil || (!read && (c.version != "" || r.Header.Get(mcpSessionHeader) != "")) {
		return c
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, mcpPeekLimit+1))
	rest := r.Body
	r.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), rest), Closer: rest}
	if err != nil || len(body) > mcpPeekLimit {
		return c
	}
	var m mcpMessage
	if json.Unmarshal(body, &m) != nil { // a batch or malformed: the SDK answers it
		return c
	}
	c.method, c.id = m.Method, m.ID
	if c.version == "" && r.Header.Get(mcpSessionHeader) == "" {
		v, _ := m.Params.Meta[mcp.MetaKeyProtocolVersion].(string)
		c.stateless = v >= MCPStatelessVersion || m.Method == mcpMethodDiscover
		c.version = v
	}
	return c
}

// versionSwitch serves an MCP address from two SDK handlers: stateless requests from the stateless one, the rest
// (initialize, requests of an MCP session, GET streams, DELETE) from the session one.
func versionSwitch(stateful, stateless http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mcpVersion(r, false).stateless {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// writeRPCError answers a JSON-RPC error for the request id with an HTTP status, as the SDK answers the refusals of
// a request's transport (400 for a protocol version it does not serve).
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int64, message string, data any) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	raw, _ := json.Marshal(data)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": code, "message": message, "data": json.RawMessage(raw)}})
}
