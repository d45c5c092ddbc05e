package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

// tRPC (spec §1): every registry verb is the procedure /trpc/<verb>, spoken as @trpc/client's httpLink and
// httpBatchLink speak it with no transformer. A query is a GET with its input JSON in the `input` query parameter;
// a mutation a POST with its input as the JSON body. A batch joins the names with commas, adds ?batch=1 and keys the
// inputs "0", "1", …; it is answered with an array in order. Success is {"result":{"data":…}}; an error is
// {"error":{"message","code","data":{"code","httpStatus","path","envelope"}}} with the REST envelope at
// data.envelope. A procedure runs exactly as its REST route does (the same handler, credentials, validation and
// errors): its input's properties go where the registry's x-in says (path, query or body), and the request is served
// by the same mux in the same request context, so the envelope's requestId is this request's.

// trpcMaxBody bounds a tRPC request body.
const trpcMaxBody = 32 << 20

// DefaultTRPCMaxBatch is the most procedures one batch may name (api.trpc_max_batch).
const DefaultTRPCMaxBatch = 100

// tRPC error codes (JSON-RPC numbers) by HTTP status, as tRPC v11 defines them: TRPC_ERROR_CODES_BY_KEY in
// packages/server/src/unstable-core-do-not-import/rpc/codes.ts and JSONRPC2_TO_HTTP_CODE in
// …/http/getHTTPStatusCode.ts, read at trpc/trpc commit 340811ba5320637fbaf48fccf3dbfdd258bd34db (2026-06-20).
// A status outside the table answers INTERNAL_SERVER_ERROR (5xx) or BAD_REQUEST (4xx) with its own httpStatus.
var trpcCodes = map[int]struct {
	name string
	code int
}{
	400: {"BAD_REQUEST", -32600}, 401: {"UNAUTHORIZED", -32001}, 402: {"PAYMENT_REQUIRED", -32002},
	403: {"FORBIDDEN", -32003}, 404: {"NOT_FOUND", -32004}, 405: {"METHOD_NOT_SUPPORTED", -32005},
	408: {"TIMEOUT", -32008}, 409: {"CONFLICT", -32009}, 412: {"PRECONDITION_FAILED", -32012},
	413: {"PAYLOAD_TOO_LARGE", -32013}, 415: {"UNSUPPORTED_MEDIA_TYPE", -32015}, 422: {"UNPROCESSABLE_CONTENT", -32022},
	428: {"PRECONDITION_REQUIRED", -32028}, 429: {"TOO_MANY_REQUESTS", -32029}, 499: {"CLIENT_CLOSED_REQUEST", -32099}, 500: {"INTERNAL_SERVER_ERROR", -32603},
	501: {"NOT_IMPLEMENTED", -32603}, 502: {"BAD_GATEWAY", -32603}, 503: {"SERVICE_UNAVAILABLE", -32603},
	504: {"GATEWAY_TIMEOUT", -32603},
}

// TRPCError is a procedure's error as tRPC answers it.
type TRPCError struct {
	Message string        `json:"message"`
	Code    int           `json:"code"`
	Data    TRPCErrorData `json:"data"`
}

// TRPCErrorData carries the tRPC code name, the HTTP status, the procedure and the REST envelope.
type TRPCErrorData struct {
	Code       string    `json:"code"`
	HTTPStatus int       `json:"httpStatus"`
	Path       string    `json:"path,omitempty"`
	Envelope   *Envelope `json:"envelope"`
}

type trpcResult struct {
	Result *struct {
		Data json.RawMessage `json:"data"`
	} `json:"result,omitempty"`
	Error *TRPCError `json:"error,omitempty"`
	// timing is the procedure's Server-Timing and retryAfter its Retry-After (a 429's), passed on when it is the
	// only one.
	timing, retryAfter string
}

type trpc struct {
	*verbTable
	mux *http.ServeMux
	// web checks the console's session cookie (nil: not accepted).
	web *WebSessions
	// maxBatch is the most procedures one batch may name.
	maxBatch int
}

// newTRPC returns the handler for /trpc/…, which dispatches each procedure to its verb's route on mux.
func newTRPC(mux *http.ServeMux, a huma.API, web *WebSessions, maxBatch int) *trpc {
	if maxBatch <= 0 {
		maxBatch = DefaultTRPCMaxBatch
	}
	return &trpc{verbTable: newVerbTable(a), mux: mux, web: web, maxBatch: maxBatch}
}

// malformed is tRPC's answer to input that is not JSON, or a batch input that is not an object: BAD_REQUEST (400,
// -32600), as tRPC's own content-type handler answers it, with the envelope naming the field.
func malformed(location, message string) *Envelope {
	e := Invalid(location, message)
	e.status = http.StatusBadRequest
	return e
}

// streamed reports whether the client asks for httpBatchStreamLink's JSONL answer (tRPC's getAcceptHeader:
// trpc-accept, else an Accept listing application/jsonl).
func streamed(r *http.Request) bool {
	if v := r.Header.Get("trpc-accept"); v != "" {
		return v == "application/jsonl"
	}
	for _, t := range strings.Split(r.Header.Get("Accept"), ",") {
		if strings.TrimSpace(t) == "application/jsonl" {
			return true
		}
	}
	return false
}

func (t *trpc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The console's web session (spec §5's fourth credential) stands in for a bearer credential: checked here, once
	// per request, CSRF token and origin included for mutations; the procedures' routes read it from the context.
	if t.web != nil && r.Header.Get("Authorization") == "" {
		s, err := t.web.fromRequest(r)
		if err != nil {
			t.fail(w, r, err)
			return
		}
		if s != nil {
			r = r.WithContext(withWeb(r.Context(), s))
		}
	}
	names := strings.Split(strings.TrimPrefix(r.URL.Path, "/trpc/"), ",")
	batch := r.URL.Query().Get("batch") == "1"
	if !batch && len(names) != 1 {
		t.fail(w, r, malformed("path", "several procedures need ?batch=1"))
		return
	}
	if len(names) > t.maxBatch {
		t.fail(w, r, TooLarge("a batch of %d procedures is over the cap of %d (api.trpc_max_batch); split it", len(names), t.maxBatch))
		return
	}
	stream := streamed(r)
	if stream && !batch {
		t.fail(w, r, malformed("path", "streaming requests (trpc-accept: application/jsonl) must be batched: add ?batch=1 (a batch of 1 will do)"))
		return
	}
	var raw []byte
	switch r.Method {
	case http.MethodGet:
		raw = []byte(r.URL.Query().Get("input"))
	case http.MethodPost:
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, trpcMaxBody))
		if err != nil {
			t.fail(w, r, TooLarge("request body is over the %d-byte cap", trpcMaxBody))
			return
		}
		raw = b
	default:
		w.Header().Set("Allow", "GET, POST")
		t.fail(w, r, Errorf(http.StatusMethodNotAllowed, "tRPC takes GET (queries) and POST (mutations), not %s", r.Method))
		return
	}
	inputs := make([]json.RawMessage, len(names))
	if len(bytes.TrimSpace(raw)) > 0 {
		if !json.Valid(raw) {
			var v any
			err := json.Unmarshal(raw, &v)
			t.fail(w, r, malformed("input", "not JSON: "+err.Error()))
			return
		}
		if batch {
			var keyed map[string]json.RawMessage
			if err := json.Unmarshal(raw, &keyed); err != nil {
				t.fail(w, r, malformed("input", "a batch's input is an object keyed \"0\", \"1\", …: "+err.Error()))
				return
			}
			for i := range names {
				inputs[i] = keyed[strconv.Itoa(i)]
			}
		} else {
			inputs[0] = raw
		}
	}
	if stream {
		t.stream(w, r, names, inputs)
		return
	}
	results := make([]trpcResult, len(names))
	statuses := make([]int, len(names))
	for i, name := range names {
		statuses[i], results[i] = t.call(r, name, inputs[i])
	}
	if !batch {
		if results[0].timing != "" {
			w.Header().Set("Server-Timing", results[0].timing)
		}
		if results[0].retryAfter != "" {
			w.Header().Set("Retry-After", results[0].retryAfter)
		}
		t.write(w, statuses[0], results[0])
		return
	}
	status := statuses[0]
	for _, s := range statuses[1:] {
		if s != status {
			status = http.StatusMultiStatus
		}
	}
	t.write(w, status, results)
}

// call runs one procedure on the REST route of its verb.
func (t *trpc) call(r *http.Request, name string, input json.RawMessage) (int, trpcResult) {
	v, ok := t.verb(name)
	if !ok {
		return http.StatusNotFound, t.failure(r, name, NotFound("no procedure %q: GET /api/registry lists the verbs", name))
	}
	want := http.MethodPost
	if v.Kind == string(Query) {
		want = http.MethodGet
	}
	if r.Method != want {
		return http.StatusMethodNotAllowed, t.failure(r, name, Errorf(http.StatusMethodNotAllowed,
			"%s is a %s: send it as %s", name, v.Kind, want))
	}
	req, err := verbRequest(r.Context(), r.Header, r.RemoteAddr, v, input)
	if err != nil {
		res := t.failure(r, name, err)
		return res.Error.Data.HTTPStatus, res
	}
	a := dispatch(t.mux, req)
	if a.envelope == nil {
		res := trpcResult{Result: &struct {
			Data json.RawMessage `json:"data"`
		}{Data: a.data}, timing: a.header.Get("Server-Timing")}
		return http.StatusOK, res
	}
	res := t.failure(r, name, a.envelope)
	res.retryAfter = a.header.Get("Retry-After")
	return a.status, res
}

// scalar renders a JSON scalar as a path or query value.
func scalar(v json.RawMessage) (string, error) {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return "", err
	}
	switch y := x.(type) {
	case string:
		return y, nil
	case float64, bool:
		return strings.TrimSpace(string(v)), nil
	}
	return "", fmt.Errorf("expected a string, number or boolean")
}

func (t *trpc) failure(r *http.Request, path string, err error) trpcResult {
	e, status := EnvelopeOf(r.Context(), err)
	c, ok := trpcCodes[status]
	if !ok {
		c = trpcCodes[500]
		if status < 500 {
			c = trpcCodes[400]
		}
	}
	return trpcResult{Error: &TRPCError{Message: e.Detail, Code: c.code,
		Data: TRPCErrorData{Code: c.name, HTTPStatus: status, Path: path, Envelope: e}}}
}

// fail answers a request-wide failure (no procedure ran) with the status its error names, so the HTTP status and
// the answer's data.httpStatus agree.
func (t *trpc) fail(w http.ResponseWriter, r *http.Request, err error) { trpcFail(w, r, err) }

// trpcFail is fail for callers before the tRPC handler (the server's URL check).
func trpcFail(w http.ResponseWriter, r *http.Request, err error) {
	var t *trpc
	res := t.failure(r, "", err)
	t.write(w, res.Error.Data.HTTPStatus, res)
}

func (t *trpc) write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// recorder keeps a procedure's REST answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
