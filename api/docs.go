package api

import (
	"encoding/json"
	"html/template"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	swaggerFiles "github.com/swaggo/files/v2"
)

func apiDescription() string {
	var b strings.Builder
	b.WriteString("doppel builds a working double (a twin) of an AI agent's tool backend from the agent's recorded traces, " +
		"and serves it so agents can run against it in isolated, deterministically seeded sessions.\n\n" +
		"## Authentication\n\nEvery request carries `Authorization: Bearer <credential>`: a workspace key (`mk_live_…`) for " +
		"environment routes, a session token (`ms_…`, or the key that opened the session) for session routes, an MCP token " +
		"(`mcp_at_…`) for MCP. Missing or invalid: 401. Not granted: 403 with `access` pending or denied. " +
		"Another workspace's resource: 404, never 403.\n\n" +
		"## Errors\n\nEvery error, on every route — validation, unknown routes, wrong methods, panics — answers with one JSON envelope " +
		"`{detail, code, requestId}` (schema `Envelope`), plus `errors` (422: each bad field as a path), `access` (403), " +
		"`meter` and `cardWouldLift` (402). Every response carries the request id in the `X-Request-Id` header.\n\n" +
		"| status | code | meaning |\n| --- | --- | --- |\n")
	for _, c := range Codes() {
		b.WriteString("| " + statusKey(c.Status) + " | `" + c.Code + "` | " + c.Meaning + " |\n")
	}
	return b.String()
}

type docParam struct {
	Name, In, Type, Description string
	Required                    bool
}

type docResponse struct {
	Status, Description, Schema string
}

type docOp struct {
	Method, Path, ID, Summary, Description string
	Security                               []string
	Params                                 []docParam
	Body                                   string
	Responses                              []docResponse
}

type docPage struct {
	Title, Version string
	Codes          []CodeInfo
	Ops            []docOp
	Envelope       string
}

var docsTemplate = template.Must(template.New("docs").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}} reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
code,pre{font:13px/1.4 ui-monospace,monospace;background:#f4f4f4}pre{padding:.6rem;overflow:auto}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
.op{border-top:2px solid #333;margin-top:2rem}.m{font-weight:bold;text-transform:uppercase}
</style></head><body>
<h1>{{.Title}} <small>{{.Version}}</small></h1>
<p>The machine-readable description is <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1, also <a href="/openapi.yaml">YAML</a>); verbs with their input schemas are at <a href="/api/registry">/api/registry</a>.</p>
<h2>Authentication</h2>
<p>Send <code>Authorization: Bearer &lt;credential&gt;</code>. Workspace keys (<code>mk_live_…</code>) for environment routes;
session tokens (<code>ms_…</code>) or the key that opened the session for session routes; MCP tokens (<code>mcp_at_…</code>) for MCP.
Missing or invalid: 401. Not granted: 403 with <code>access</code>. Another workspace's resource: 404.</p>
<h2>Errors</h2>
<p>Every error on every route is one JSON envelope; every response carries <code>X-Request-Id</code>.</p>
<pre>{{.Envelope}}</pre>
<table><tr><th>status</th><th>code</th><th>meaning</th></tr>
{{range .Codes}}<tr><td>{{.Status}}</td><td><code>{{.Code}}</code></td><td>{{.Meaning}}</td></tr>{{end}}
</table>
<h2>Routes</h2>
{{range .Ops}}<div class="op" id="{{.ID}}">
<h3><span class="m">{{.Method}}</span> <code>{{.Path}}</code></h3>
<p><b>{{.Summary}}</b>{{if .ID}} — <code>{{.ID}}</code>{{end}}</p>
{{if .Description}}<p>{{.Description}}</p>{{end}}
<p>Credential: {{if .Security}}{{range $i, $s := .Security}}{{if $i}} or {{end}}<code>{{$s}}</code>{{end}}{{else}}none{{end}}</p>
{{if .Params}}<table><tr><th>parameter</th><th>in</th><th>type</th><th>required</th><th>description</th></tr>
{{range .Params}}<tr><td><code>{{.Name}}</code></td><td>{{.In}}</td><td>{{.Type}}</td><td>{{if .Required}}yes{{else}}no{{end}}</td><td>{{.Description}}</td></tr>{{end}}</table>{{end}}
{{if .Body}}<p>Request body (JSON Schema):</p><pre>{{.Body}}</pre>{{end}}
<table><tr><th>status</th><th>description</th><th>body</th></tr>
{{range .Responses}}<tr><td>{{.Status}}</td><td>{{.Description}}</td><td><code>{{.Schema}}</code></td></tr>{{end}}</table>
</div>{{end}}
</body></html>
`))

// registerDocs serves a self-contained HTML reference at /docs, rendered from the OpenAPI document
// (no scripts or CDN, so it works offline).
// registerDocs serves the API reference: /docs is Swagger UI (its built assets embedded from the
// github.com/swaggo/files/v2 module, served from this binary, nothing fetched from elsewhere) over /openapi.json,
// where "Authorize" takes a workspace key and "Try it out" sends real requests; /docs/reference is the same
// reference as one static page without scripts.
func registerDocs(mux *http.ServeMux, a huma.API) {
	mux.HandleFunc("GET /docs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := swaggerPage.Execute(w, a.OpenAPI().Info.Title); err != nil {
			loggerFrom(r.Context()).ErrorContext(r.Context(), "render docs", "error", err)
		}
	})
	mux.HandleFunc("GET /docs/doppel-init.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = io.WriteString(w, swaggerInit)
	})
	for _, name := range swaggerAssets {
		mux.HandleFunc("GET /docs/"+name, func(w http.ResponseWriter, r *http.Request) {
			http.ServeFileFS(w, r, swaggerFiles.FS, name)
		})
	}
	mux.HandleFunc("GET /docs/reference", func(w http.ResponseWriter, r *http.Request) {
		page := docsPage(a.OpenAPI())
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := docsTemplate.Execute(w, page); err != nil {
			loggerFrom(r.Context()).ErrorContext(r.Context(), "render docs", "error", err)
		}
	})
}

// swaggerAssets are the Swagger UI files /docs loads (the module's own index and initializer, which point at a
// sample API, are not served).
var swaggerAssets = []string{"swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js",
	"favicon-32x32.png", "favicon-16x16.png", "oauth2-redirect.html"}

var swaggerPage = template.Must(template.New("swagger").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.}} — API reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/docs/swagger-ui.css"><link rel="icon" type="image/png" href="/docs/favicon-32x32.png">
</head><body>
<p style="font:14px system-ui,sans-serif;margin:.5rem 1rem">Authorize with a workspace key (<code>mk_live_…</code>) to try
calls. A page without scripts: <a href="/docs/reference">/docs/reference</a>. The document: <a href="/openapi.json">/openapi.json</a>.</p>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/swagger-ui-standalone-preset.js"></script>
<script src="/docs/doppel-init.js"></script>
</body></html>
`))

// swaggerInit starts Swagger UI on this server's OpenAPI document; the key given to "Authorize" stays in the
// browser's storage across reloads.
const swaggerInit = `window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  persistAuthorization: true,
  tryItOutEnabled: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  layout: "StandaloneLayout"
});
`

func docsPage(oapi *huma.OpenAPI) docPage {
	page := docPage{Title: oapi.Info.Title, Version: oapi.Info.Version, Codes: Codes()}
	if env := oapi.Components.Schemas.Map()["Envelope"]; env != nil {
		b, _ := json.MarshalIndent(env, "", "  ")
		page.Envelope = string(b)
	}
	paths := make([]string, 0, len(oapi.Paths))
	for p := range oapi.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		item := oapi.Paths[p]
		for _, op := range []*huma.Operation{item.Get, item.Post, item.Put, item.Patch, item.Delete} {
			if op == nil || op.Hidden {
				continue
			}
			d := docOp{Method: op.Method, Path: p, ID: op.OperationID, Summary: op.Summary, Description: op.Description}
			for _, req := range op.Security {
				for name := range req {
					d.Security = append(d.Security, name)
				}
			}
			sort.Strings(d.Security)
			for _, prm := range op.Parameters {
				typ := ""
				if prm.Schema != nil {
					typ = prm.Schema.Type
				}
				d.Params = append(d.Params, docParam{Name: prm.Name, In: prm.In, Type: typ, Description: prm.Description, Required: prm.Required})
			}
			if op.RequestBody != nil {
				if mt, ok := op.RequestBody.Content["application/json"]; ok && mt.Schema != nil {
					s := mt.Schema
					if name, ok := strings.CutPrefix(s.Ref, componentPrefix); ok {
						if c := oapi.Components.Schemas.Map()[name]; c != nil {
							s = c
						}
					}
					b, _ := json.MarshalIndent(s, "", "  ")
					d.Body = string(b)
				}
			}
			codes := make([]string, 0, len(op.Responses))
			for c := range op.Responses {
				codes = append(codes, c)
			}
			sort.Strings(codes)
			for _, c := range codes {
				resp := op.Responses[c]
				schemaName := ""
				for _, mt := range resp.Content {
					if mt.Schema != nil {
						schemaName = strings.TrimPrefix(mt.Schema.Ref, componentPrefix)
						if schemaName == "" {
							schemaName = mt.Schema.Type
						}
					}
				}
				d.Responses = append(d.Responses, docResponse{Status: c, Description: resp.Description, Schema: schemaName})
			}
			page.Ops = append(page.Ops, d)
		}
	}
	return page
}
