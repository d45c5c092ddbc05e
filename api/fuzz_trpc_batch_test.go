package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// fuzzBatchCap is FuzzTRPCBatch's api.trpc_max_batch: small, so the fuzzer reaches past it often.
const fuzzBatchCap = 6

// FuzzTRPCBatch sends fuzzed tRPC batches — procedures picked by each byte of sel (so their count runs past the
// cap), a fuzzed batch input, GET or POST, plain or streamed (trpc-accept: application/jsonl) — and checks what
// tRPC v11's client relies on (issue 33 defect 5, issue 34 defect 9): never a 5xx; past the cap one 413
// PAYLOAD_TOO_LARGE (-32013) and nothing run; otherwise either one BAD_REQUEST/4xx error for the request or n
// items each with exactly one of result and error, every error's JSON-RPC code and name the v11 table's for its
// httpStatus, the plain batch's HTTP status the items' common status or 207, the streamed batch 200 with the same
// items once decoded as tRPC's consumer decodes them.
func FuzzTRPCBatch(f *testing.F) {
	fx := newFixture(f, schema.DriverSQLite, nil)
	h := conformanceServer(f, api.Options{DB: fx.db, TRPCMaxBatch: fuzzBatchCap, FailedCredentialsPerMinute: -1})
	procs := []string{"test.status", "envs.list", "envs.get", "keys.create", "test.nope", ""}
	byStatus := map[int]struct {
		name string
		code int
	}{}
	for _, c := range trpcV11 {
		byStatus[c.status] = struct {
			name string
			code int
		}{c.name, c.code}
	}
	for _, tc := range []struct {
		sel          []byte
		input        string
		post, stream bool
	}{
		{[]byte{0, 0}, `{"0":{"code":200},"1":{"code":409}}`, false, false},
		{[]byte{0, 1, 2}, `{"0":{"code":428},"2":{"slug":"nope"}}`, false, true},
		{[]byte{3}, `{"0":{"name":"k"}}`, true, true},
		{[]byte{0, 0, 0, 0, 0, 0, 0}, `{}`, false, false},
		{[]byte{4, 5}, `[1]`, false, true},
		{[]byte{0}, `{"0":`, true, false},
		{[]byte{}, `{"0":{"code":200}}`, false, false},
	} {
		f.Add(tc.sel, tc.input, tc.post, tc.stream)
	}
	f.Fuzz(func(t *testing.T, sel []byte, input string, post, stream bool) {
		if len(sel) > 3*fuzzBatchCap {
			sel = sel[:3*fuzzBatchCap]
		}
		names := make([]string, len(sel))
		for i, b := range sel {
			names[i] = procs[int(b)%len(procs)]
		}
		q := url.Values{"batch": {"1"}}
		var r *http.Request
		if post {
			r = httptest.NewRequest(http.MethodPost, "/trpc/x", strings.NewReader(input))
			r.Header.Set("Content-Type", "application/json")
		} else {
			q.Set("input", input)
			r = httptest.NewRequest(http.MethodGet, "/trpc/x", nil)
		}
		r.URL.Path = "/trpc/" + strings.Join(names, ",")
		r.URL.RawQuery = q.Encode()
		r.RequestURI = r.URL.RequestURI()
		if stream {
			r.Header.Set("trpc-accept", "application/jsonl")
		}
		w := fuzzSend(h, r, fx.key)
		if w.Code >= 500 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		checkItem := func(raw json.RawMessage) int {
			t.Helper()
			a := decodeTRPC(t, raw)
			if a.Error == nil {
				return http.StatusOK
			}
			e := a.Error
			want, ok := byStatus[e.Data.HTTPStatus]
			if !ok {
				// A status outside tRPC's table keeps its httpStatus under BAD_REQUEST (4xx) or
				// INTERNAL_SERVER_ERROR (5xx), as api/trpc.go documents.
				want, ok = byStatus[http.StatusBadRequest], e.Data.HTTPStatus >= 400 && e.Data.HTTPStatus < 600
				if e.Data.HTTPStatus >= 500 {
					want = byStatus[http.StatusInternalServerError]
				}
			}
			if !ok || e.Code != want.code || e.Data.Code != want.name {
				t.Fatalf("error %d %s with httpStatus %d, tRPC v11 says %+v: %s", e.Code, e.Data.Code, e.Data.HTTPStatus, want, raw)
			}
			if e.Data.Envelope["code"] == nil || e.Data.Envelope["detail"] != e.Message {
				t.Fatalf("error without the envelope: %s", raw)
			}
			return e.Data.HTTPStatus
		}
		n := max(len(names), 1) // "/trpc/" names one procedure, ""
		// A query string that is not clean UTF-8 is refused as a whole by the API's query guard (422) before any
		// route, the cap's included, reads it; the whole-request check below still holds it to the envelope.
		queryRefused := !post && (!utf8.ValidString(input) || strings.ContainsRune(input, 0))
		if n > fuzzBatchCap && !queryRefused {
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("%d procedures over the cap of %d: %d %s", n, fuzzBatchCap, w.Code, w.Body)
			}
			if a := decodeTRPC(t, w.Body.Bytes()); a.Error == nil || a.Error.Data.Code != "PAYLOAD_TOO_LARGE" || a.Error.Code != -32013 {
				t.Fatalf("over the cap: %s", w.Body)
			}
			return
		}
		body := w.Body.Bytes()
		if trimmed := strings.TrimSpace(string(body)); w.Code >= 400 && !strings.HasPrefix(trimmed, "[") {
			// The request as a whole was refused: one error, its status the HTTP status.
			if st := checkItem(body); st != w.Code {
				t.Fatalf("HTTP %d carries httpStatus %d: %s", w.Code, st, body)
			}
			return
		}
		var items []json.RawMessage
		if stream {
			if w.Code != http.StatusOK {
				t.Fatalf("streamed batch answered %d", w.Code)
			}
			for _, v := range jsonlDecode(t, body) {
				raw, _ := json.Marshal(v)
				items = append(items, raw)
			}
		} else if err := json.Unmarshal(body, &items); err != nil {
			t.Fatalf("batch answer %d: %v: %s", w.Code, err, body)
		}
		if len(items) != n {
			t.Fatalf("batch of %d answered %d items: %s", n, len(items), body)
		}
		statuses := map[int]bool{}
		for _, it := range items {
			statuses[checkItem(it)] = true
		}
		if !stream {
			want := http.StatusMultiStatus
			if len(statuses) == 1 {
				for s := range statuses {
					want = s
				}
			}
			if w.Code != want {
				t.Fatalf("batch of statuses %v answered HTTP %d, want %d (%s)", statuses, w.Code, want, fmt.Sprint(len(body)))
			}
		}
	})
}
