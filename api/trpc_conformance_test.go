package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// trpcV11 is tRPC v11's mapping, copied from its source at trpc/trpc commit
// 340811ba5320637fbaf48fccf3dbfdd258bd34db: TRPC_ERROR_CODES_BY_KEY (packages/server/src/unstable-core-do-not-import/
// rpc/codes.ts) gives the JSON-RPC code of each name, JSONRPC2_TO_HTTP_CODE (…/http/getHTTPStatusCode.ts) its HTTP
// status. PARSE_ERROR (-32700, 400) is left out: tRPC's own handlers answer unparsable input BAD_REQUEST
// (…/http/contentType.ts), as doppel does.
var trpcV11 = []struct {
	name   string
	code   int
	status int
}{
	{"BAD_REQUEST", -32600, 400}, {"UNAUTHORIZED", -32001, 401}, {"PAYMENT_REQUIRED", -32002, 402},
	{"FORBIDDEN", -32003, 403}, {"NOT_FOUND", -32004, 404}, {"METHOD_NOT_SUPPORTED", -32005, 405},
	{"TIMEOUT", -32008, 408}, {"CONFLICT", -32009, 409}, {"PRECONDITION_FAILED", -32012, 412},
	{"PAYLOAD_TOO_LARGE", -32013, 413}, {"UNSUPPORTED_MEDIA_TYPE", -32015, 415},
	{"UNPROCESSABLE_CONTENT", -32022, 422}, {"PRECONDITION_REQUIRED", -32028, 428},
	{"TOO_MANY_REQUESTS", -32029, 429}, {"CLIENT_CLOSED_REQUEST", -32099, 499},
	{"INTERNAL_SERVER_ERROR", -32603, 500}, {"NOT_IMPLEMENTED", -32603, 501}, {"BAD_GATEWAY", -32603, 502},
	{"SERVICE_UNAVAILABLE", -32603, 503}, {"GATEWAY_TIMEOUT", -32603, 504},
}

type statusIn struct {
	Code int `query:"code" minimum:"200" maximum:"599"`
}

type echoOut struct {
	Body struct {
		Code int `json:"code"`
	}
}

// conformanceServer is an API with two test verbs: test.status answers the envelope of any status (200: a
// result), test.count a mutation taking a body.
func conformanceServer(t testing.TB, opts api.Options) http.Handler {
	t.Helper()
	opts.Routes = append(opts.Routes, func(a huma.API, _ *api.Deps) {
		huma.Register(a, huma.Operation{OperationID: "test.status", Method: http.MethodGet, Path: "/test/status"},
			func(_ context.Context, in *statusIn) (*echoOut, error) {
				if in.Code != 200 {
					return nil, api.Errorf(in.Code, "answered %d as asked", in.Code)
				}
				out := &echoOut{}
				out.Body.Code = 200
				return out, nil
			})
	})
	h, _ := api.New(opts)
	return h
}

func trpcGet(h http.Handler, target string, header map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Issue 34, defect 9: every error class answers as tRPC v11 does — HTTP status, JSON-RPC code, data.code and
// data.httpStatus — with the envelope in data; malformed input is BAD_REQUEST (400, -32600), not 422.
func TestTRPCErrorConformance(t *testing.T) {
	h := conformanceServer(t, api.Options{})
	check := func(t *testing.T, w *httptest.ResponseRecorder, name string, code, status int) {
		t.Helper()
		if w.Code != status {
			t.Errorf("HTTP status %d, want %d (%s)", w.Code, status, w.Body)
		}
		a := decodeTRPC(t, w.Body.Bytes())
		if a.Error == nil {
			t.Fatalf("want a %s error, got %s", name, w.Body)
		}
		envCode, _ := a.Error.Data.Envelope["code"].(string)
		wantTRPCError(t, json.RawMessage(w.Body.Bytes()), status, name, code, a.Error.Data.Path, envCode)
	}
	for _, c := range trpcV11 {
		t.Run(c.name, func(t *testing.T) {
			in, _ := json.Marshal(map[string]int{"code": c.status})
			w := trpcGet(h, "/trpc/test.status?input="+url.QueryEscape(string(in)), nil)
			check(t, w, c.name, c.code, c.status)
			// In a batch beside a success: the item keeps its class, the batch answers 207.
			w = trpcGet(h, "/trpc/test.status,test.status?batch=1&input="+url.QueryEscape(fmt.Sprintf(`{"0":%s,"1":{"code":200}}`, in)), nil)
			var items []json.RawMessage
			if err := json.Unmarshal(w.Body.Bytes(), &items); err != nil || len(items) != 2 || w.Code != http.StatusMultiStatus {
				t.Fatalf("batch: %d %s", w.Code, w.Body)
			}
			item := decodeTRPC(t, items[0])
			if item.Error == nil {
				t.Fatalf("batch item 0: %s", items[0])
			}
			envCode, _ := item.Error.Data.Envelope["code"].(string)
			wantTRPCError(t, items[0], c.status, c.name, c.code, "test.status", envCode)
		})
	}
	malformed := []struct{ what, target, body string }{
		{"bad JSON in ?input=", "/trpc/test.status?input=" + url.QueryEscape(`{"code":`), ""},
		{"non-object batch input", "/trpc/test.status?batch=1&input=" + url.QueryEscape(`[1,2]`), ""},
		{"bad JSON batch input", "/trpc/test.status?batch=1&input=" + url.QueryEscape(`{"0":`), ""},
		{"bad JSON body", "/trpc/keys.create", `{"name":`},
		{"several procedures without ?batch=1", "/trpc/test.status,test.status", ""},
		{"stream without ?batch=1", "/trpc/test.status", "stream"},
	}
	for _, m := range malformed {
		t.Run(m.what, func(t *testing.T) {
			var w *httptest.ResponseRecorder
			switch {
			case m.body == "stream":
				w = trpcGet(h, m.target, map[string]string{"trpc-accept": "application/jsonl"})
			case m.body != "":
				r := httptest.NewRequest(http.MethodPost, m.target, strings.NewReader(m.body))
				r.Header.Set("Content-Type", "application/json")
				w = httptest.NewRecorder()
				h.ServeHTTP(w, r)
			default:
				w = trpcGet(h, m.target, nil)
			}
			check(t, w, "BAD_REQUEST", -32600, 400)
			if env := decodeTRPC(t, w.Body.Bytes()).Error.Data.Envelope; env["code"] != "invalid" || len(env["errors"].([]any)) == 0 {
				t.Errorf("envelope %v: want code invalid naming the field", env)
			}
		})
	}
}

// Issue 33, defect 5: a batch names at most api.trpc_max_batch procedures (413 PAYLOAD_TOO_LARGE, -32013, before
// any runs), and each item counts against the rate limits as a request of its own: a batch of bad credentials
// spends the address's failed credentials one item at a time.
func TestTRPCBatchCap(t *testing.T) {
	fx := newFixture(t, schema.DriverSQLite, nil)
	h := conformanceServer(t, api.Options{DB: fx.db, TRPCMaxBatch: 40})
	names := func(n int, name string) string {
		s := make([]string, n)
		for i := range s {
			s[i] = name
		}
		return strings.Join(s, ",")
	}
	w := trpcGet(h, "/trpc/"+names(41, "envs.list")+"?batch=1", map[string]string{"Authorization": "Bearer " + fx.key})
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("41 procedures over a cap of 40: %d %s", w.Code, w.Body)
	}
	wantTRPCError(t, w.Body.Bytes(), 413, "PAYLOAD_TOO_LARGE", -32013, "", "tooLarge")
	if !strings.Contains(w.Body.String(), "api.trpc_max_batch") {
		t.Errorf("413 does not name api.trpc_max_batch: %s", w.Body)
	}
	// The default cap is 100.
	if w := trpcGet(conformanceServer(t, api.Options{DB: fx.db}), "/trpc/"+names(101, "envs.list")+"?batch=1", nil); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("101 procedures under the default cap: %d", w.Code)
	}

	w = trpcGet(h, "/trpc/"+names(40, "envs.list")+"?batch=1", map[string]string{"Authorization": "Bearer mk_live_" + strings.Repeat("x", 40)})
	var items []json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &items); err != nil || len(items) != 40 {
		t.Fatalf("batch of 40 bad credentials: %d %s", w.Code, w.Body)
	}
	counts := map[string]int{}
	for _, it := range items {
		counts[decodeTRPC(t, it).Error.Data.Code]++
	}
	if counts["UNAUTHORIZED"] != api.DefaultFailedCredentialBurst || counts["TOO_MANY_REQUESTS"] != 40-api.DefaultFailedCredentialBurst {
		t.Errorf("batch of 40 bad credentials: %v, want %d UNAUTHORIZED then TOO_MANY_REQUESTS", counts, api.DefaultFailedCredentialBurst)
	}
}

// jsonlDecode rebuilds a streamed batch as tRPC's jsonlStreamConsumer does: the head's placeholders are filled as
// the chunks that settle them arrive, each chunk's own placeholders in turn by later chunks.
func jsonlDecode(t testing.TB, body []byte) []any {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<24)
	if !sc.Scan() {
		t.Fatal("no head line")
	}
	var head map[string][]json.RawMessage
	if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
		t.Fatalf("head %s: %v", sc.Bytes(), err)
	}
	pending := map[int]func(enc []json.RawMessage){}
	var decode func(enc []json.RawMessage, set func(any))
	decode = func(enc []json.RawMessage, set func(any)) {
		var wrapped []any
		if err := json.Unmarshal(enc[0], &wrapped); err != nil {
			t.Fatalf("encoded value %s: %v", enc[0], err)
		}
		var v any
		if len(wrapped) == 1 {
			v = wrapped[0]
		}
		set(v)
		for _, def := range enc[1:] {
			var d []any
			if err := json.Unmarshal(def, &d); err != nil || len(d) != 3 || d[1] != float64(0) {
				t.Fatalf("chunk definition %s", def)
			}
			key, chunk := d[0], int(d[2].(float64))
			pending[chunk] = func(enc []json.RawMessage) {
				decode(enc, func(x any) {
					if key == nil {
						set(x)
					} else {
						v.(map[string]any)[key.(string)] = x
					}
				})
			}
		}
	}
	out := make([]any, len(head))
	for k, enc := range head {
		var i int
		fmt.Sscan(k, &i)
		decode(enc, func(x any) { out[i] = x })
	}
	for sc.Scan() {
		var chunk []json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &chunk); err != nil || len(chunk) != 3 {
			t.Fatalf("chunk line %s: %v", sc.Bytes(), err)
		}
		var id, status int
		_ = json.Unmarshal(chunk[0], &id)
		_ = json.Unmarshal(chunk[1], &status)
		var enc []json.RawMessage
		if err := json.Unmarshal(chunk[2], &enc); err != nil || status != 0 {
			t.Fatalf("chunk %s: status %d %v", sc.Bytes(), status, err)
		}
		f, ok := pending[id]
		if !ok {
			t.Fatalf("chunk %d settles nothing pending", id)
		}
		delete(pending, id)
		f(enc)
	}
	if len(pending) != 0 {
		t.Fatalf("%d chunks never settled", len(pending))
	}
	return out
}

// Issue 34, defect 9: trpc-accept: application/jsonl (httpBatchStreamLink) answers the batch as tRPC's JSONL
// stream; decoded as tRPC's consumer does, each item equals the plain batch's answer for it.
func TestTRPCStreamedBatch(t *testing.T) {
	h := conformanceServer(t, api.Options{})
	target := "/trpc/test.status,test.status,test.nope,test.status?batch=1&input=" +
		url.QueryEscape(`{"0":{"code":200},"1":{"code":409},"3":{"code":200}}`)
	plain := trpcGet(h, target, nil)
	streamed := trpcGet(h, target, map[string]string{"trpc-accept": "application/jsonl"})
	if streamed.Code != http.StatusOK || streamed.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("streamed batch: %d %s %s", streamed.Code, streamed.Header().Get("Content-Type"), streamed.Body)
	}
	if lines := strings.Count(streamed.Body.String(), "\n"); lines != 1+3+1+1+3 {
		t.Errorf("streamed batch has %d lines, want 9 (head, 3 a result, 1 an error):\n%s", lines, streamed.Body)
	}
	got := jsonlDecode(t, streamed.Body.Bytes())
	var want []any
	if err := json.Unmarshal(plain.Body.Bytes(), &want); err != nil || len(want) != 4 {
		t.Fatalf("plain batch: %s", plain.Body)
	}
	for i := range want {
		// The envelopes' requestIds differ (two requests); everything else is the same.
		for _, v := range []any{got[i], want[i]} {
			if e, ok := v.(map[string]any)["error"].(map[string]any); ok {
				delete(e["data"].(map[string]any)["envelope"].(map[string]any), "requestId")
			}
		}
		g, _ := json.Marshal(got[i])
		w, _ := json.Marshal(want[i])
		if !bytes.Equal(g, w) {
			t.Errorf("item %d: streamed %s, plain %s", i, g, w)
		}
	}
	// The Accept header asks for it too.
	if w := trpcGet(h, target, map[string]string{"Accept": "application/json, application/jsonl"}); !strings.HasPrefix(w.Body.String(), `{"0":[[0],[null,0,0]]`) {
		t.Errorf("Accept: application/jsonl: %s", w.Body)
	}
}
