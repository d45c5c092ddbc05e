package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/schema"
)

// Fuzz targets of issue #13 (reliability). Each builds its fixture once, in the f body, and sends every input
// straight to the handler. Their seed corpora (f.Add and testdata/fuzz/FuzzX) run as ordinary tests.

// fuzzSend serves one request and answers the recorder.
func fuzzSend(h http.Handler, r *http.Request, token string) *httptest.ResponseRecorder {
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// checkEnvelope fails unless w is below 500, and a 4xx answer is the JSON error envelope with a code and a detail.
func checkEnvelope(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code >= 500 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if w.Code < 400 {
		return
	}
	var e map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("%d answer is not a JSON object: %v: %s", w.Code, err, w.Body)
	}
	if c, _ := e["code"].(string); c == "" {
		t.Fatalf("%d envelope without code: %s", w.Code, w.Body)
	}
	if d, _ := e["detail"].(string); d == "" {
		t.Fatalf("%d envelope without detail: %s", w.Code, w.Body)
	}
}

// FuzzCallArguments sends POST /v1/sessions/{id}/call with a fuzzed tool name and raw arguments bytes: never a
// 5xx; a 200 carries a fidelity; a 4xx is the error envelope.
func FuzzCallArguments(f *testing.F) {
	p := newPlane(f, schema.DriverSQLite, shopBundle(f), planeOptions{})
	s := p.open(map[string]any{"seed": 7, "seedInstructions": "2 orders with status pending"})
	for _, tc := range []struct{ name, args string }{
		{"get_order_details", `{"order_id":"#W0000001"}`},
		{"cancel_pending_order", `{"order_id":"#W0000001"}`},
		{"get_order_details", `{"order_id":"#W404"}`},
		{"get_order_details", `{}`},
		{"get_order_details", `{"order_id":12}`},
		{"get_order_details", `{"order_id":null,"extra":[1,2,{"a":"b"}]}`},
		{"get_order_details", `"a string"`},
		{"get_order_details", `[1,2,3]`},
		{"get_order_details", `null`},
		{"get_order_details", `1e400`},
		{"get_order_details", `{"order_id":"\ud800"}`},
		{"get_order_details", `{"order_id":`},
		{"get_order_details", ``},
		{"cancel_pending_order", `{"order_id":"` + strings.Repeat("x", 300) + `"}`},
		{"no_such_tool", `{}`},
		{"", `{}`},
		{"get order details\x00", `{}`},
	} {
		f.Add(tc.name, []byte(tc.args))
	}
	path := "/v1/sessions/" + s.ID + "/call"
	f.Fuzz(func(t *testing.T, name string, args []byte) {
		nameJSON, _ := json.Marshal(name)
		body := append(append(append([]byte(`{"name":`), nameJSON...), `,"arguments":`...), args...)
		body = append(body, '}')
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := fuzzSend(p.h, r, s.Token)
		checkEnvelope(t, w)
		if w.Code == http.StatusOK {
			var a map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
				t.Fatalf("200 answer is not JSON: %v: %s", err, w.Body)
			}
			if fid, _ := a["fidelity"].(string); fid == "" {
				t.Fatalf("200 answer without fidelity: %s", w.Body)
			}
		}
	})
}

// FuzzSessionOpenSeed opens sessions with fuzzed seed instructions: never a 5xx; a 4xx is the error envelope;
// the same seed and instructions open the same world twice.
func FuzzSessionOpenSeed(f *testing.F) {
	p := newPlane(f, schema.DriverSQLite, shopBundle(f), planeOptions{})
	for _, tc := range []struct {
		seed  int64
		instr string
	}{
		{42, "2 orders with status pending"},
		{3, "1 order with status pending"},
		{1, "user Bob with name Bob; 3 orders for user Bob with status \"on hold\""},
		{7, "a thunderstorm over the warehouse"},
		{0, ""},
		{-1, ";;;."},
		{9, "1001 orders"},
		{9, "-3 orders"},
		{5, "ten orders with total 3.5 and status 'x'"},
		{5, "orders with"},
		{5, "\"unterminated orders"},
		{5, "2 users\n1 order for user user_0001"},
	} {
		f.Add(tc.seed, tc.instr)
	}
	path := "/v1/envs/" + p.env.Slug + "/sessions"
	open := func(t *testing.T, seed int64, instr string) (int, string) {
		body, _ := json.Marshal(map[string]any{"seed": seed, "seedInstructions": instr})
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := fuzzSend(p.h, r, p.key)
		checkEnvelope(t, w)
		if w.Code != http.StatusCreated {
			return w.Code, ""
		}
		var a map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
			t.Fatalf("open answer is not JSON: %v: %s", err, w.Body)
		}
		hash, _ := a["world_hash"].(string)
		if hash == "" {
			t.Fatalf("open answer without world_hash: %s", w.Body)
		}
		// Close it: the fuzzer opens thousands.
		id, _ := a["sessionId"].(string)
		fuzzSend(p.h, httptest.NewRequest(http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil), p.key)
		return w.Code, hash
	}
	f.Fuzz(func(t *testing.T, seed int64, instr string) {
		c1, h1 := open(t, seed, instr)
		c2, h2 := open(t, seed, instr)
		if c1 != c2 || h1 != h2 {
			t.Fatalf("seed %d, %q: %d %s then %d %s", seed, instr, c1, h1, c2, h2)
		}
	})
}

// FuzzBuildMultipart posts fuzzed multipart bodies and boundaries to POST /v1/envs/{slug}/builds: never a 5xx, a
// 4xx is the error envelope, and no temp file is left behind.
func FuzzBuildMultipart(f *testing.F) {
	tmp := f.TempDir()
	f.Setenv("TMPDIR", tmp)
	bf := newBuildFixture(f, schema.DriverSQLite)
	add := func(parts ...part) {
		body, ct := multipartBody(f, parts...)
		b := new(bytes.Buffer)
		_, _ = b.ReadFrom(body)
		f.Add(strings.TrimPrefix(ct, "multipart/form-data; boundary="), b.Bytes())
	}
	tools := `[{"name":"get_order_details","description":"d","parameters":{"type":"object","properties":{"order_id":{"type":"string"}}}}]`
	add(part{"tools", "tools.json", tools})
	add(part{"tools", "tools.json", tools}, part{"code", "get_order_details.star", "def handle(args, world):\n    return {}\n"})
	add(part{"tools", "tools.json", tools + "]"})
	add(part{"code", "get_order_details.star", "def handle(:\n"})
	add(part{"code", "x.star", strings.Repeat("# big\n", 2000) + "def handle(args, world):\n    return {}\n"})
	add(part{"nope", "", "field"})
	add()
	f.Add("b", []byte("--b\r\nContent-Disposition: form-data; name=\"tools\"; filename=\"t.json\"\r\n\r\n[]\r\n--b--\r\n"))
	f.Add("b", []byte("--b\r\nContent-Disposition: form-data; name=\"tools\"\r\n\r\n[]"))
	f.Add("", []byte("garbage"))
	f.Add("\"quoted\"", []byte("--quoted\r\n\r\n--quoted--"))
	path := "/v1/envs/" + bf.env.Slug + "/builds"
	f.Fuzz(func(t *testing.T, boundary string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		w := fuzzSend(bf.h, r, bf.key)
		checkEnvelope(t, w)
		entries, err := os.ReadDir(tmp)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			_ = os.RemoveAll(tmp + "/" + e.Name())
			t.Errorf("left behind: %s (status %d)", e.Name(), w.Code)
		}
	})
}

// FuzzTRPC sends fuzzed procedure names and inputs to /trpc, as GET or POST, batched or not: never a 5xx; the
// answer is JSON with exactly one of result and error, or for ?batch=1 an array of such (one per name), or one
// 4xx error for the batch as a whole; a single answer's HTTP status is the httpStatus its error names.
func FuzzTRPC(f *testing.F) {
	p := newPlane(f, schema.DriverSQLite, shopBundle(f), planeOptions{})
	slug := p.env.Slug
	for _, tc := range []struct {
		post, batch bool
		names       string
		input       string
	}{
		{false, false, "envs.list", ""},
		{false, false, "envs.get", `{"slug":"` + slug + `"}`},
		{false, false, "envs.get", `{"slug":12}`},
		{false, false, "envs.nope", `{}`},
		{false, false, "sessions.open", `{"slug":"` + slug + `"}`},
		{true, false, "sessions.open", `{"slug":"` + slug + `","seed":42}`},
		{true, false, "sessions.open", `{"slug":"` + slug + `","seed":"x"}`},
		{true, false, "sessions.open", `{"slug":"` + slug + `","seedInstructions":"2 orders with status pending","seed":1}`},
		{true, false, "sessions.call", `{"session_id":"ses_x","name":"get_order_details","arguments":{}}`},
		{false, true, "envs.get,envs.list", `{"0":{"slug":"` + slug + `"}}`},
		{false, true, "envs.get,envs.get,envs.list", `{"0":{"slug":"nope"},"1":[],"2":null}`},
		{true, true, "sessions.close", `{"0":{"session_id":"ses_nope"}}`},
		{false, true, "envs.list", `[1]`},
		{false, false, "envs.list,envs.get", ``},
		{true, false, "", `not json`},
		{false, true, ",,,", `{"0":1}`},
		{true, false, "envs.get", `{"slug":"` + slug + `","extra":{"deep":[1,2,3]}}`},
	} {
		f.Add(tc.post, tc.batch, tc.names, tc.input)
	}
	f.Fuzz(func(t *testing.T, post, batch bool, names, input string) {
		var r *http.Request
		q := url.Values{}
		if batch {
			q.Set("batch", "1")
		}
		if post {
			r = httptest.NewRequest(http.MethodPost, "/trpc/x", strings.NewReader(input))
			r.Header.Set("Content-Type", "application/json")
		} else {
			q.Set("input", input)
			r = httptest.NewRequest(http.MethodGet, "/trpc/x", nil)
		}
		r.URL.Path = "/trpc/" + names
		r.URL.RawPath = ""
		r.URL.RawQuery = q.Encode()
		r.RequestURI = r.URL.RequestURI()
		w := fuzzSend(p.h, r, p.key)
		if w.Code >= 500 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		// tRPC owns every path under /trpc/, unclean ones ("/trpc/..", "/trpc/a/../b") included: no redirects, no REST 404s.
		if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("content type %q (%d): %s", ct, w.Code, w.Body)
		}
		raw := w.Body.Bytes()
		if batch && len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '[' {
			var items []json.RawMessage
			if err := json.Unmarshal(raw, &items); err != nil {
				t.Fatalf("batch answer: %v: %s", err, raw)
			}
			if n := len(strings.Split(names, ",")); len(items) != n {
				t.Fatalf("batch of %d names answered %d items: %s", n, len(items), raw)
			}
			for i, it := range items {
				if err := oneOfResultError(it); err != nil {
					t.Fatalf("batch item %d: %v: %s", i, err, it)
				}
			}
			return
		}
		if err := oneOfResultError(raw); err != nil {
			t.Fatalf("%v (%d): %s", err, w.Code, raw)
		}
		// A single answer's status is the one its error names (a result's is 200).
		var a struct {
			Error *struct {
				Data struct {
					HTTPStatus int `json:"httpStatus"`
				} `json:"data"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &a)
		if a.Error != nil && a.Error.Data.HTTPStatus != w.Code || a.Error == nil && w.Code != http.StatusOK {
			t.Fatalf("status %d disagrees with the answer: %s", w.Code, raw)
		}
		if batch && w.Code < 400 {
			t.Fatalf("batch answered %d with a single item: %s", w.Code, raw)
		}
	})
}

// oneOfResultError checks a tRPC answer is a JSON object with exactly one of result and error.
func oneOfResultError(raw []byte) error {
	var a map[string]json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("not a JSON object: %v", err)
	}
	_, res := a["result"]
	_, er := a["error"]
	if res == er {
		return fmt.Errorf("result %v, error %v: want exactly one", res, er)
	}
	return nil
}
