package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/danielgtaylor/huma/v2"
)

// verbTable is the registry as the in-process transports (tRPC, MCP) dispatch it: every verb by name, in
// registry order, read once after all routes are registered.
type verbTable struct {
	api   huma.API
	once  sync.Once
	list  []RegistryVerb
	verbs map[string]RegistryVerb
}

func newVerbTable(a huma.API) *verbTable { return &verbTable{api: a} }

func (t *verbTable) load() {
	t.once.Do(func() {
		t.list = Registry(t.api.OpenAPI())
		t.verbs = make(map[string]RegistryVerb, len(t.list))
		for _, v := range t.list {
			t.verbs[v.Name] = v
		}
	})
}

// verb returns the verb named name.
func (t *verbTable) verb(name string) (RegistryVerb, bool) {
	t.load()
	v, ok := t.verbs[name]
	return v, ok
}

// all returns every verb, sorted by name.
func (t *verbTable) all() []RegistryVerb {
	t.load()
	return t.list
}

// verbRequest builds the REST request of a verb from its input object (a tRPC input, an MCP tool's arguments): path
// parameters into the path, query parameters into the query, the rest into the JSON body. The credential and client
// headers of from go with it, so the route authenticates the caller exactly as over REST.
func verbRequest(ctx context.Context, from http.Header, remoteAddr string, v RegistryVerb, input json.RawMessage) (*http.Request, error) {
	fields := map[string]json.RawMessage{}
	if trimmed := bytes.TrimSpace(input); len(trimmed) > 0 && !bytes.Equal(trimmed, []byte("null")) {
		if err := json.Unmarshal(trimmed, &fields); err != nil {
			return nil, Invalid("input", "expected a JSON object of the verb's input (GET /api/registry): "+err.Error())
		}
	}
	props, _ := v.Input["properties"].(map[string]any)
	path := v.Path
	query := url.Values{}
	body := map[string]json.RawMessage{}
	var whole json.RawMessage
	for k, val := range fields {
		p, ok := props[k].(map[string]any)
		if !ok {
			return nil, Invalid("input."+k, "unknown field")
		}
		switch in, _ := p["x-in"].(string); in {
		case "path", "query", "header":
			s, err := scalar(val)
			if err != nil {
				return nil, Invalid("input."+k, err.Error())
			}
			if in == "path" {
				// An empty or dot segment would make an unclean REST path, which http.ServeMux redirects.
				switch s {
				case "":
					return nil, Invalid("input."+k, "must not be empty")
				case ".", "..":
					return nil, NotFound("no such resource: input.%s is %q", k, s)
				}
				path = strings.ReplaceAll(path, "{"+k+"}", url.PathEscape(s))
			} else if in == "query" {
				query.Set(k, s)
			}
		default:
			if w, _ := p["x-body"].(string); w == "whole" {
				whole = val // the verb's body is not an object of fields: this property is all of it
				continue
			}
			body[k] = val
		}
	}
	if strings.Contains(path, "{") {
		for k := range props {
			if strings.Contains(path, "{"+k+"}") {
				return nil, Invalid("input."+k, "required property is missing")
			}
		}
	}
	u := path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader = http.NoBody
	if whole != nil {
		rd = bytes.NewReader(whole)
	} else if len(body) > 0 {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, v.Method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("verb %s: %w", v.Name, err)
	}
	for _, h := range []string{"Authorization", "Cookie", "User-Agent", "X-Forwarded-For"} {
		if val := from.Get(h); val != "" {
			req.Header.Set(h, val)
		}
	}
	req.RemoteAddr = remoteAddr
	if rd != http.NoBody {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// answer is a verb's REST answer: its status and headers, its body (JSON; null when empty) on success, its envelope
// on failure.
type answer struct {
	status   int
	header   http.Header
	data     json.RawMessage
	envelope *Envelope
}

// dispatch serves a verb's REST request on mux in process.
func dispatch(mux http.Handler, req *http.Request) answer {
	rec := &recorder{header: http.Header{}}
	mux.ServeHTTP(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	a := answer{status: rec.status, header: rec.header}
	if rec.status < 300 {
		a.data = bytes.TrimSpace(rec.body.Bytes())
		if len(a.data) == 0 {
			a.data = json.RawMessage("null")
		}
		return a
	}
	e := &Envelope{}
	if json.Unmarshal(rec.body.Bytes(), e) != nil || e.Code == "" {
		e = NewError(rec.status, strings.TrimSpace(rec.body.String()))
	}
	e.status = rec.status
	a.envelope = e
	return a
}
