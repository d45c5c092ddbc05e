package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/danielgtaylor/huma/v2/humatest"
)

type echoCall struct {
	Body struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Requestor string          `json:"requestor"`
	}
}

// fastAndSlow serves sessions.call's input twice, through the API's middleware and error envelope: at /fast with
// FastBody and at /slow with huma's own validation. Both echo what they decoded.
func fastAndSlow(t testing.TB) http.Handler {
	mux := http.NewServeMux()
	a := huma.NewAPI(config("fastbody", "test"), humago.NewAdapter(mux, ""))
	a.UseMiddleware(checkBodyStrings)
	echo := func(_ context.Context, in *CallInput) (*echoCall, error) {
		out := &echoCall{}
		out.Body.Name, out.Body.Arguments, out.Body.Requestor = in.Body.Name, json.RawMessage(in.Body.Arguments), in.Body.Requestor
		return out, nil
	}
	Declare(a, Verb[CallInput, echoCall]{Name: "fast.call", Method: http.MethodPost, Path: "/fast/{session_id}/call",
		FastBody: true, Handler: echo})
	Declare(a, Verb[CallInput, echoCall]{Name: "slow.call", Method: http.MethodPost, Path: "/slow/{session_id}/call",
		Handler: echo})
	return mux
}

// comparable is what must match between two answers: a success whole; an error's status, code, and its errors'
// messages, sorted (huma lists a body's errors in map order, and writes the location of a key that holds a dot
// differently by that order, so the locations and the detail quoting the first cannot be compared).
func comparable(body []byte) []byte {
	var e struct {
		Code   string `json:"code"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &e) != nil || e.Code == "" {
		return body
	}
	msgs := make([]string, len(e.Errors))
	for i, x := range e.Errors {
		msgs[i] = x.Message
	}
	slices.Sort(msgs)
	out, _ := json.Marshal(map[string]any{"code": e.Code, "messages": msgs})
	return out
}

// sameAnswer fails unless /fast and /slow answer body (sent with content type ct) alike, and returns the status.
func sameAnswer(t *testing.T, h http.Handler, ct string, body []byte) int {
	t.Helper()
	send := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	fast, slow := send("/fast/ses_1/call"), send("/slow/ses_1/call")
	if fast.Code != slow.Code || !bytes.Equal(comparable(fast.Body.Bytes()), comparable(slow.Body.Bytes())) {
		t.Fatalf("content type %q, body %q:\nFastBody: %d %s\nhuma:     %d %s", ct, body, fast.Code, fast.Body, slow.Code, slow.Body)
	}
	return fast.Code
}

var fastBodySeeds = []struct {
	ct, body string
	status   int
}{
	{"application/json", `{"name":"get_order_details","arguments":{"order_id":"#W1"}}`, 200},
	{"application/json", ` { "name" : "get_order_details" , "arguments" : { "a" : [1, {"b": "}"}] } , "requestor" : "user" } `, 200},
	{"", `{"name":"x","arguments":{},"requestor":"assistant"}`, 200},
	{"application/json; charset=utf-8", `{"name":"\u00e9t\u00e9","arguments":{}}`, 200},
	{"application/json", `{"name":"été","arguments":{}}`, 200},
	{"application/json", `{"name":"","arguments":{}}`, 422},
	{"application/json", `{"arguments":{}}`, 422},
	{"application/json", `{"name":"x"}`, 422},
	{"application/json", `{"name":"x","arguments":[]}`, 422},
	{"application/json", `{"name":"x","arguments":null}`, 422},
	{"application/json", `{"name":7,"arguments":{}}`, 422},
	{"application/json", `{"name":"x","arguments":{},"requestor":"robot"}`, 422},
	{"application/json", `{"name":"x","arguments":{},"extra":1}`, 422},
	{"application/json", `{"name":"x","name":"","arguments":{}}`, 422},
	{"application/json", `{"name":"x","arguments":{}`, 422},
	{"application/json", `[]`, 422},
	{"application/json", `null`, 422},
	{"application/json", `{"name":"x","arguments":{}} trailing`, 422},
	{"text/plain", `{"name":"x","arguments":{}}`, 415},
	{"application/json", `{"n\u0061me":"x","arguments":{}}`, 200},
}

// A body gets the same answer with FastBody as with huma's validation: the seeds cover what passes, each way to
// fail, and what the one-pass check hands to huma (escapes, repeated keys, other content types).
func TestFastBodyAnswersAsHuma(t *testing.T) {
	h := fastAndSlow(t)
	for _, s := range fastBodySeeds {
		if got := sameAnswer(t, h, s.ct, []byte(s.body)); got != s.status {
			t.Errorf("content type %q, body %s: status %d, want %d", s.ct, s.body, got, s.status)
		}
	}
	long := []byte(`{"name":"` + string(bytes.Repeat([]byte("é"), 200)) + `","arguments":{}}`)
	if got := sameAnswer(t, h, "application/json", long); got != http.StatusOK {
		t.Errorf("a name of 200 characters: status %d, want 200", got)
	}
	long = []byte(`{"name":"` + string(bytes.Repeat([]byte("é"), 201)) + `","arguments":{}}`)
	if got := sameAnswer(t, h, "application/json", long); got != http.StatusUnprocessableEntity {
		t.Errorf("a name of 201 characters: status %d, want 422", got)
	}
}

// The one-pass check vouches only for bodies huma passes: a body it accepts never answers otherwise than through
// huma's validation, and the answers are the same.
func FuzzFastBody(f *testing.F) {
	h := fastAndSlow(f)
	cts := []string{"application/json", "", "text/plain", "application/x+json"}
	for i, s := range fastBodySeeds {
		f.Add(uint8(i%len(cts)), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ct uint8, body []byte) {
		sameAnswer(t, h, cts[int(ct)%len(cts)], body)
	})
}

func TestNewFastBodyRefusesWhatItCannotCheck(t *testing.T) {
	_, a := humatest.New(t, config("fastbody", "test"))
	type nested struct {
		Body struct {
			Name  string `json:"name"`
			Inner struct {
				A string `json:"a"`
			} `json:"inner"`
		}
	}
	type patterned struct {
		Body struct {
			Name string `json:"name" pattern:"^[a-z]+$"`
		}
	}
	type counted struct {
		Body struct {
			N int `json:"n"`
		}
	}
	for _, tc := range []struct {
		name    string
		declare func()
	}{
		{"nested object", func() {
			Declare(a, Verb[nested, struct{}]{Name: "t.nested", Method: http.MethodPost, Path: "/nested", FastBody: true,
				Handler: func(context.Context, *nested) (*struct{}, error) { return &struct{}{}, nil }})
		}},
		{"pattern", func() {
			Declare(a, Verb[patterned, struct{}]{Name: "t.pattern", Method: http.MethodPost, Path: "/pattern", FastBody: true,
				Handler: func(context.Context, *patterned) (*struct{}, error) { return &struct{}{}, nil }})
		}},
		{"integer", func() {
			Declare(a, Verb[counted, struct{}]{Name: "t.int", Method: http.MethodPost, Path: "/int", FastBody: true,
				Handler: func(context.Context, *counted) (*struct{}, error) { return &struct{}{}, nil }})
		}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Declare with FastBody did not refuse", tc.name)
				}
			}()
			tc.declare()
		}()
	}
}
