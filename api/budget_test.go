package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
)

// budgetServer is an API with a body budget of size bytes and one plain route, POST /test/read, that reads its
// whole body (answering 200 with the byte count, or 400 when the read failed). Each request's handler signals
// reading once it begins, so a test can hold a body open mid-read.
func budgetServer(t *testing.T, size int64) (*httptest.Server, chan struct{}) {
	t.Helper()
	reading := make(chan struct{}, 16)
	// The requests carry no credential: the address's share is set past the budget, so the server-wide bound is
	// what these tests see (budget_share_test.go tests the shares).
	opts := api.Options{BodyBudget: size, ReturnMemoryEvery: -1, BodyLimits: api.BodyLimits{PerAddress: 4 * size}, Routes: []func(huma.API, *api.Deps){
		func(_ huma.API, d *api.Deps) {
			d.Mux.HandleFunc("POST /test/read", func(w http.ResponseWriter, r *http.Request) {
				reading <- struct{}{}
				n, err := io.Copy(io.Discard, r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				_ = json.NewEncoder(w).Encode(map[string]int64{"read": n})
			})
		},
	}}
	h, _ := api.New(opts)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, reading
}

type budgetAnswer struct {
	status     int
	retryAfter string
	body       map[string]any
}

func budgetPost(t *testing.T, url string, body io.Reader, length int64) budgetAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	a := budgetAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	_ = json.Unmarshal(data, &a.body)
	return a
}

// wantRefused checks a 503 for want of budget: Retry-After, and the envelope {detail, code, requestId}.
func wantRefused(t *testing.T, what string, a budgetAnswer, envelope map[string]any) {
	t.Helper()
	if a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
		t.Fatalf("%s: status %d, Retry-After %q; want 503 with Retry-After (body %v)", what, a.status, a.retryAfter, a.body)
	}
	if envelope["code"] == "" || envelope["code"] == nil || !strings.HasPrefix(envelope["requestId"].(string), "req_") ||
		!strings.Contains(envelope["detail"].(string), "body_budget") {
		t.Errorf("%s: envelope %v, want detail naming api.body_budget_bytes, code and requestId", what, envelope)
	}
}

// Issue #13, defect 7: request bodies in flight are bounded server-wide. While one request holds most of the
// budget, another whose Content-Length does not fit is refused at once with 503 + Retry-After (REST and tRPC), a
// body of unknown length is refused once its bytes pass the budget, and the budget is whole again afterwards.
func TestBodyBudget(t *testing.T) {
	const size = 1 << 20
	srv, reading := budgetServer(t, size)

	// Hold 768 KiB of the budget: the body's first bytes are sent, the rest waits on the pipe.
	pr, pw := io.Pipe()
	held := make(chan budgetAnswer, 1)
	go func() { held <- budgetPost(t, srv.URL+"/test/read", pr, 768<<10) }()
	if _, err := pw.Write(make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	<-reading

	a := budgetPost(t, srv.URL+"/test/read", bytes.NewReader(make([]byte, 512<<10)), 512<<10)
	wantRefused(t, "REST body over the budget", a, a.body)

	a = budgetPost(t, srv.URL+"/trpc/sessions.call", bytes.NewReader(make([]byte, 512<<10)), 512<<10)
	var trpcEnv map[string]any
	if e, ok := a.body["error"].(map[string]any); ok {
		if d, ok := e["data"].(map[string]any); ok {
			trpcEnv, _ = d["envelope"].(map[string]any)
		}
	}
	wantRefused(t, "tRPC body over the budget", a, trpcEnv)

	// Unknown length (chunked): admitted, then refused once its bytes pass what is left.
	a = budgetPost(t, srv.URL+"/test/read", io.MultiReader(bytes.NewReader(make([]byte, 512<<10))), -1)
	wantRefused(t, "chunked body over the budget", a, a.body)

	// Small bodies still fit beside the held one.
	if a := budgetPost(t, srv.URL+"/test/read", strings.NewReader(`{"x":1}`), 7); a.status != http.StatusOK {
		t.Errorf("small body beside the held one: %d %v, want 200", a.status, a.body)
	}

	// A body larger than the whole budget can never be held: 413, not a retry.
	if a := budgetPost(t, srv.URL+"/test/read", bytes.NewReader(make([]byte, size+1)), size+1); a.status != http.StatusRequestEntityTooLarge {
		t.Errorf("body over the whole budget: %d %v, want 413", a.status, a.body)
	}

	if _, err := pw.Write(make([]byte, 768<<10-1024)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if a := <-held; a.status != http.StatusOK || a.body["read"] != float64(768<<10) {
		t.Fatalf("held request: %d %v, want 200 having read all of it", a.status, a.body)
	}

	// The held bytes are given back: the refused sizes fit now, with and without a length.
	if a := budgetPost(t, srv.URL+"/test/read", bytes.NewReader(make([]byte, 512<<10)), 512<<10); a.status != http.StatusOK {
		t.Errorf("after release, 512 KiB body: %d %v, want 200", a.status, a.body)
	}
	if a := budgetPost(t, srv.URL+"/test/read", io.MultiReader(bytes.NewReader(make([]byte, 900<<10))), -1); a.status != http.StatusOK {
		t.Errorf("after release, chunked 900 KiB body: %d %v, want 200", a.status, a.body)
	}
}
