package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
)

// metaFastBody is the operation Metadata key of a verb declared with FastBody: its *fastBody.
const metaFastBody = "fastBody"

// fastBody checks a flat JSON body in one pass instead of huma's generic validation, which decodes every body a
// second time into maps to walk the schema over them (sessions.call at the API's peak: 3.2% of the server's CPU,
// and a tenth of a call's allocations, for a body the route then decodes again). The pass only says yes when the
// body surely passes the schema; any other body, bad or merely unusual (an escaped key or string, a repeated key),
// is validated as huma would, and answers huma's own error. So a body gets the same answer either way, only sooner.
//
// It handles schemas of an object whose properties are strings (with minLength, maxLength, enum) and free-form
// objects; Declare refuses FastBody for any other.
type fastBody struct {
	api      huma.API
	schema   *huma.Schema // the body's schema, as huma validates it
	props    map[string]fastProp
	required []string
	closed   bool // additionalProperties: false
}

type fastProp struct {
	object   bool // a free-form object; else a string
	min, max int  // string length bounds in characters; max < 0: none
	enum     []string
}

// newFastBody returns the checker of an operation's JSON body, or an error naming what it cannot check.
func newFastBody(a huma.API, op *huma.Operation) (*fastBody, error) {
	if op == nil {
		return nil, errors.New("no operation registered at its method and path")
	}
	if op.RequestBody == nil || op.RequestBody.Content["application/json"] == nil {
		return nil, errors.New("the operation has no JSON body")
	}
	ref := op.RequestBody.Content["application/json"].Schema
	s := ref
	if ref.Ref != "" {
		s = a.OpenAPI().Components.Schemas.SchemaFromRef(ref.Ref)
	}
	if s == nil || s.Type != huma.TypeObject || len(s.Properties) == 0 {
		return nil, errors.New("the body is not an object with properties")
	}
	f := &fastBody{api: a, schema: ref, props: map[string]fastProp{}, required: s.Required}
	if ap, ok := s.AdditionalProperties.(bool); ok && !ap {
		f.closed = true
	} else if s.AdditionalProperties != nil {
		return nil, errors.New("the body's additionalProperties is not false or absent")
	}
	if s.MinProperties != nil || s.MaxProperties != nil || len(s.DependentRequired) > 0 || s.Not != nil ||
		len(s.OneOf)+len(s.AnyOf)+len(s.AllOf) > 0 {
		return nil, errors.New("the body's schema has constraints beyond properties and required")
	}
	for name, p := range s.Properties {
		if p.Ref != "" || p.Nullable || p.Not != nil || len(p.OneOf)+len(p.AnyOf)+len(p.AllOf) > 0 {
			return nil, fmt.Errorf("property %q: not a plain schema", name)
		}
		switch p.Type {
		case huma.TypeString:
			if p.Pattern != "" || p.Format != "" || p.ContentEncoding != "" {
				return nil, fmt.Errorf("property %q: a pattern, format or encoding", name)
			}
			fp := fastProp{max: -1}
			if p.MinLength != nil {
				fp.min = *p.MinLength
			}
			if p.MaxLength != nil {
				fp.max = *p.MaxLength
			}
			for _, e := range p.Enum {
				s, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("property %q: an enum value that is not a string", name)
				}
				fp.enum = append(fp.enum, s)
			}
			f.props[name] = fp
		case huma.TypeObject:
			if ap, ok := p.AdditionalProperties.(bool); !ok || !ap || len(p.Properties) > 0 || len(p.Required) > 0 ||
				p.MinProperties != nil || p.MaxProperties != nil {
				return nil, fmt.Errorf("property %q: an object that is not free-form", name)
			}
			f.props[name] = fastProp{object: true}
		default:
			return nil, fmt.Errorf("property %q: type %q", name, p.Type)
		}
	}
	for _, r := range f.required {
		if _, ok := f.props[r]; !ok {
			return nil, fmt.Errorf("required property %q is not declared", r)
		}
	}
	return f, nil
}

// passes reports whether body surely passes the schema: false when it does not, or when telling needs huma.
func (f *fastBody) passes(body []byte) bool {
	if !json.Valid(body) {
		return false
	}
	var seen [8][]byte
	n := 0
	ok := eachMember(body, func(key, val []byte) bool {
		p, known := f.props[string(key)]
		if !known {
			return !f.closed
		}
		if n == len(seen) || slices.ContainsFunc(seen[:n], func(k []byte) bool { return bytes.Equal(k, key) }) {
			return false
		}
		seen[n] = key
		n++
		if p.object {
			return val[0] == '{'
		}
		if val[0] != '"' {
			return false
		}
		s := val[1 : len(val)-1]
		if bytes.IndexByte(s, '\\') >= 0 || !utf8.Valid(s) {
			return false
		}
		if c := utf8.RuneCount(s); c < p.min || (p.max >= 0 && c > p.max) {
			return false
		}
		if p.enum == nil {
			return true
		}
		for _, e := range p.enum {
			if string(s) == e {
				return true
			}
		}
		return false
	})
	if !ok {
		return false
	}
	for _, r := range f.required {
		if !slices.ContainsFunc(seen[:n], func(k []byte) bool { return string(k) == r }) {
			return false
		}
	}
	return true
}

// validate is huma's validation of a body (its parse into a generic value, then the schema's walk over it), for a
// body that passes did not vouch for. It writes huma's error and reports true when the body fails.
func (f *fastBody) validate(ctx huma.Context, contentType string, body []byte) bool {
	if contentType == "" {
		contentType = "application/json"
	}
	var parsed any
	if err := f.api.Unmarshal(contentType, body, &parsed); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, huma.ErrUnknownContentType) {
			status = http.StatusUnsupportedMediaType
		}
		_ = huma.WriteErr(f.api, ctx, status, "validation failed",
			&huma.ErrorDetail{Location: "body", Message: err.Error(), Value: string(body)})
		return true
	}
	res := &huma.ValidateResult{}
	pb := huma.NewPathBuffer(make([]byte, 0, 64), 0)
	pb.Push("body")
	huma.Validate(f.api.OpenAPI().Components.Schemas, f.schema, pb, huma.ModeWriteToServer, parsed, res)
	if len(res.Errors) == 0 {
		return false
	}
	status := http.StatusUnprocessableEntity
	for i := len(res.Errors) - 1; i >= 0; i-- {
		if s, ok := res.Errors[i].(huma.StatusError); ok {
			status = s.GetStatus()
			break
		}
	}
	_ = huma.WriteErr(f.api, ctx, status, "validation failed", res.Errors...)
	return true
}

// eachMember calls fn with each member of a valid JSON document's top-level object, its key unquoted as written
// and its value as written, until fn returns false. It returns false when the document is not an object, when a
// key holds an escape, or when fn returned false.
func eachMember(doc []byte, fn func(key, val []byte) bool) bool {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return false
	}
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return true
	}
	for i < len(doc) {
		end := stringEnd(doc, i)
		key := doc[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		i = skipSpace(doc, end)
		i = skipSpace(doc, i+1) // past ':'
		vend := valueEnd(doc, i)
		if !fn(key, doc[i:vend]) {
			return false
		}
		i = skipSpace(doc, vend)
		if i >= len(doc) || doc[i] == '}' {
			return true
		}
		i = skipSpace(doc, i+1) // past ','
	}
	return false
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string that starts at doc[i] (a quote) in a valid document.
func stringEnd(doc []byte, i int) int {
	for j := i + 1; j < len(doc); j++ {
		switch doc[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(doc)
}

// valueEnd returns the index just past the value that starts at doc[i] in a valid document.
func valueEnd(doc []byte, i int) int {
	switch doc[i] {
	case '"':
		return stringEnd(doc, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(doc); j++ {
			switch doc[j] {
			case '"':
				j = stringEnd(doc, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(doc)
	default:
		j := i
		for j < len(doc) && doc[j] != ',' && doc[j] != '}' && doc[j] != ']' && doc[j] != ' ' && doc[j] != '\t' &&
			doc[j] != '\n' && doc[j] != '\r' {
			j++
		}
		return j
	}
}
