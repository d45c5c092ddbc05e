package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/yaml"
)

// The served documents: /openapi.json and /openapi.yaml (OpenAPI 3.1, huma's), /openapi-3.0.json and
// /openapi-3.0.yaml (3.0.3). huma's own downgrade to 3.0 leaves 3.1-only keywords in binary schemas
// (contentMediaType, contentEncoding), which 3.0 validators (kin-openapi, libopenapi) refuse, so the 3.0 document
// is huma's downgrade with those translated (Downgrade30).

// documentPaths are the document routes, served by serveDocuments rather than huma's config.OpenAPIPath.
const (
	docPath31JSON = "/openapi.json"
	docPath31YAML = "/openapi.yaml"
	docPath30JSON = "/openapi-3.0.json"
	docPath30YAML = "/openapi-3.0.yaml"
)

// serveDocuments mounts the four document routes on mux; each is rendered once, on first request, after every
// route has been registered.
func serveDocuments(mux *http.ServeMux, oapi *huma.OpenAPI) {
	type doc struct {
		once sync.Once
		data []byte
		err  error
	}
	render := map[string]func() ([]byte, error){
		docPath31JSON: func() ([]byte, error) { return json.Marshal(DocumentView(oapi)) },
		docPath31YAML: func() ([]byte, error) { return DocumentView(oapi).YAML() },
		docPath30JSON: func() ([]byte, error) { return Downgrade30(oapi) },
		docPath30YAML: func() ([]byte, error) {
			b, err := Downgrade30(oapi)
			if err != nil {
				return nil, err
			}
			var out bytes.Buffer
			err = yaml.Convert(&out, bytes.NewReader(b))
			return out.Bytes(), err
		},
	}
	for path, fn := range render {
		d := &doc{}
		ct := "application/openapi+json"
		if strings.HasSuffix(path, ".yaml") {
			ct = "application/openapi+yaml"
		}
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			d.once.Do(func() { d.data, d.err = fn() })
			if d.err != nil {
				WriteError(w, r, fmt.Errorf("render %s: %w", path, d.err))
				return
			}
			w.Header().Set("Content-Type", ct)
			_, _ = w.Write(d.data)
		})
	}
}

// Downgrade30 is the OpenAPI 3.0.3 document of oapi: huma's downgrade, then every schema's 3.1-only content
// keywords translated: a binary string (contentEncoding binary, or contentMediaType with format binary or no
// format) is `type: string, format: binary`; base64 content is `format: byte`.
func Downgrade30(oapi *huma.OpenAPI) ([]byte, error) {
	b, err := DocumentView(oapi).Downgrade()
	if err != nil {
		return nil, err
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	translate30(v)
	return json.Marshal(v)
}

// translate30 rewrites the 3.1-only content keywords under v in place.
func translate30(v any) {
	switch x := v.(type) {
	case map[string]any:
		_, media := x["contentMediaType"]
		enc, hasEnc := x["contentEncoding"]
		if media || hasEnc {
			delete(x, "contentMediaType")
			delete(x, "contentEncoding")
			switch {
			case enc == "base64":
				x["format"] = "byte"
			case x["format"] == nil || x["format"] == "binary" || enc == "binary":
				x["format"] = "binary"
			}
			if x["type"] == nil {
				x["type"] = "string"
			}
		}
		if x["format"] == "base64" { // huma's downgrade of contentEncoding: base64
			x["format"] = "byte"
		}
		// A 3.1 nullable reference (anyOf with a null type) is 3.0's allOf with nullable.
		if branches, ok := x["anyOf"].([]any); ok {
			var rest []any
			for _, b := range branches {
				if m, ok := b.(map[string]any); ok && m["type"] == "null" && len(m) == 1 {
					continue
				}
				rest = append(rest, b)
			}
			if len(rest) < len(branches) {
				x["nullable"] = true
				delete(x, "anyOf")
				if len(rest) == 1 {
					x["allOf"] = rest
				} else {
					x["anyOf"] = rest
				}
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if strings.HasPrefix(k, "x-") {
				continue // extensions hold names, not schemas
			}
			translate30(x[k])
		}
	case []any:
		for _, e := range x {
			translate30(e)
		}
	}
}

// omitEncodings is the operation metadata key that keeps an operation's multipart encoding objects out of the
// documents (documentView).
const omitEncodings = "doppel.omitEncodings"

// defaultEncodings keeps op's multipart encoding objects out of the documents. huma writes one from each part's
// contentType tag, which lists every type the server accepts ("application/json,application/octet-stream"): valid
// OpenAPI, but ogen takes one media type per part and skips the operation otherwise, even with one listed. Every
// part of the forms it is used on is a file (format: binary), whose default content type,
// application/octet-stream, the server accepts; each part's description names the others. The live operation
// keeps them: huma checks each part's content type against them when it reads a form.
func defaultEncodings(op *huma.Operation) {
	if op == nil || op.RequestBody == nil {
		return
	}
	if op.Metadata == nil {
		op.Metadata = map[string]any{}
	}
	op.Metadata[omitEncodings] = true
}

// DocumentView is oapi as the documents show it: a copy in which the operations defaultEncodings marked carry no
// multipart encoding objects. oapi itself, which the routes read at request time, is left as it is.
func DocumentView(oapi *huma.OpenAPI) *huma.OpenAPI {
	view := *oapi
	view.Paths = make(map[string]*huma.PathItem, len(oapi.Paths))
	for path, item := range oapi.Paths {
		if item == nil {
			view.Paths[path] = nil
			continue
		}
		c := *item
		for _, op := range []**huma.Operation{&c.Get, &c.Put, &c.Post, &c.Delete, &c.Options, &c.Head, &c.Patch, &c.Trace} {
			if *op != nil && (*op).RequestBody != nil && (*op).Metadata[omitEncodings] == true {
				*op = withoutEncodings(*op)
			}
		}
		view.Paths[path] = &c
	}
	return &view
}

// withoutEncodings is a copy of op whose request body's media types carry no encoding objects.
func withoutEncodings(op *huma.Operation) *huma.Operation {
	o := *op
	rb := *op.RequestBody
	rb.Content = make(map[string]*huma.MediaType, len(op.RequestBody.Content))
	for ct, mt := range op.RequestBody.Content {
		if mt != nil {
			m := *mt
			m.Encoding = nil
			mt = &m
		}
		rb.Content[ct] = mt
	}
	o.RequestBody = &rb
	return &o
}

// nullableRef documents property prop of component schema name, a $ref to a struct the server answers as null
// when absent (a nil pointer), as `anyOf: [{$ref}, {type: null}]`; huma writes the bare $ref, which null breaks.
// The 3.0 document gets `allOf: [{$ref}], nullable: true` (translate30).
func nullableRef(oapi *huma.OpenAPI, name, prop string) {
	if oapi.Components == nil || oapi.Components.Schemas == nil {
		return
	}
	s := oapi.Components.Schemas.Map()[name]
	if s == nil || s.Properties[prop] == nil || s.Properties[prop].Ref == "" {
		return
	}
	p := s.Properties[prop]
	s.Properties[prop] = &huma.Schema{Description: p.Description, AnyOf: []*huma.Schema{{Ref: p.Ref}, {Type: "null"}}}
}
