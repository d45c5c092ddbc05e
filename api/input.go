package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
)

// Text no route takes: NUL characters (SQLite refuses statements that hold them, PostgreSQL refuses them in text
// and in jsonb) and, in paths and query parameters, bytes that are not UTF-8 (PostgreSQL refuses those). The
// server turns such input into a 404 (a path names nothing that exists) or a 422 naming the parameter or body
// field, before any route runs, so no route has to check for it and none reaches the database with it.

// metaRawStrings is the operation Metadata key of routes that check their body's strings themselves (collect:
// its decoder checks the fields that are stored as text, and trace content goes to blobs whole).
const metaRawStrings = "rawStrings"

const nulMessage = "must not hold a NUL character (\\u0000)"

// badText reports whether s holds a NUL or is not UTF-8.
func badText(s string) bool { return strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) }

// checkURL answers the error for a request whose path or query holds bad text, nil for a good one.
func checkURL(r *http.Request) *Envelope {
	if badText(r.URL.Path) {
		return NotFound("no such resource: the path holds a NUL byte or bytes that are not UTF-8")
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil // huma reports a malformed query
	}
	switch name, bad := badValues(q); {
	case bad && name == "":
		return Invalid("query", "a parameter name holds a NUL byte or bytes that are not UTF-8")
	case bad:
		return Invalid("query."+name, "must not hold a NUL byte or bytes that are not UTF-8")
	}
	return nil
}

// badValues finds, in name order, the first name of v that holds bad text (answered as "") or whose values do
// (answered as the name); bad is false when every name and value is clean.
func badValues(v url.Values) (name string, bad bool) {
	names := make([]string, 0, len(v))
	for n := range v {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if badText(n) {
			return "", true
		}
		for _, x := range v[n] {
			if badText(x) {
				return n, true
			}
		}
	}
	return "", false
}

var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// checkBodyStrings is a huma middleware: a JSON body with a NUL in a string (or a key) answers 422 naming the field,
// and the route never runs. The body is read up to the operation's cap and handed on unchanged.
//
// For a verb declared with FastBody, it also checks the body against the schema (fastBody), in place of huma.
func checkBodyStrings(ctx huma.Context, next func(huma.Context)) {
	op := ctx.Operation()
	if op == nil || op.RequestBody == nil || op.Metadata[metaRawStrings] == true {
		next(ctx)
		return
	}
	fb, _ := op.Metadata[metaFastBody].(*fastBody)
	ct := ctx.Header("Content-Type")
	isJSON := jsonContent(ct)
	if !isJSON && fb == nil {
		next(ctx)
		return
	}
	r, _ := humago.Unwrap(ctx)
	if r.Body == nil || r.Body == http.NoBody {
		next(ctx)
		return
	}
	limit := op.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultCollectMaxRequestBytes
	}
	buf := bodyBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 {
			buf.Reset()
			bodyBufs.Put(buf)
		}
	}()
	// One byte past the cap tells a body over it (the route answers 413) from one that fills it.
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1)); err != nil {
		writeHumaError(ctx, Invalid("body", "could not read the body: "+err.Error()))
		return
	}
	if isJSON && bytes.Contains(buf.Bytes(), []byte(`\u0000`)) {
		if loc := nulField(buf.Bytes()); loc != "" {
			writeHumaError(ctx, Invalid(loc, nulMessage))
			return
		}
	}
	if fb != nil && buf.Len() > 0 && int64(buf.Len()) <= limit && !(isJSON && fb.passes(buf.Bytes())) &&
		fb.validate(ctx, ct, buf.Bytes()) {
		return
	}
	// The route reads what was read, then the rest (which answers 413 when over the cap).
	r.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body), Closer: r.Body}
	next(ctx)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// jsonContent reports whether a Content-Type is JSON (or absent, which routes read as JSON).
func jsonContent(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "" || ct == "application/json" || strings.HasSuffix(ct, "+json")
}

// nulField returns the location (body.a.b[2]) of the first string or key of a JSON document, in key order, that
// holds a NUL; "" when none does or the document does not parse (the route reports that).
func nulField(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	return findNUL(v, "body")
}

func findNUL(v any, at string) string {
	switch v := v.(type) {
	case string:
		if strings.IndexByte(v, 0) >= 0 {
			return at
		}
	case []any:
		for i, e := range v {
			if loc := findNUL(e, at+"["+strconv.Itoa(i)+"]"); loc != "" {
				return loc
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			loc := at + "." + strings.ReplaceAll(k, "\x00", `\u0000`)
			if strings.IndexByte(k, 0) >= 0 {
				return loc
			}
			if loc := findNUL(v[k], loc); loc != "" {
				return loc
			}
		}
	}
	return ""
}
