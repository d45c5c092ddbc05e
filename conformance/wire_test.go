package conformance

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// wire is an http.RoundTripper that keeps a client's HTTP exchanges (requests and responses with the headers MCP
// and OAuth use, bodies cut at 2 KB, credentials masked) and prints them when the test fails: the evidence for
// telling whether the client or the server broke the protocol.
type wire struct {
	rt  http.RoundTripper
	mu  sync.Mutex
	log []string
}

func newWire(t *testing.T) *wire {
	w := &wire{rt: http.DefaultTransport}
	t.Cleanup(func() {
		if t.Failed() {
			w.mu.Lock()
			defer w.mu.Unlock()
			t.Logf("the client's HTTP exchanges:\n%s", strings.Join(w.log, "\n"))
		}
	})
	return w
}

// client is an http.Client over the recorder.
func (w *wire) client() *http.Client { return &http.Client{Transport: w} }

// wireHeaders are the headers worth showing.
var wireHeaders = []string{"Authorization", "Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version",
	"Mcp-Method", "Mcp-Name", "Www-Authenticate", "Location"}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	entry := fmt.Sprintf("→ %s %s%s%s", r.Method, r.URL, headerLines(r.Header), bodyLine(body))
	resp, err := w.rt.RoundTrip(r)
	if err != nil {
		w.add(entry + "\n← error: " + err.Error())
		return nil, err
	}
	head := fmt.Sprintf("%s\n← %s%s", entry, resp.Status, headerLines(resp.Header))
	// The body is recorded as the client reads it, so a stream the client keeps open is no obstacle.
	resp.Body = &recordedBody{ReadCloser: resp.Body, done: func(b []byte) { w.add(head + bodyLine(b)) }}
	return resp, nil
}

func (w *wire) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, s)
}

func headerLines(h http.Header) string {
	var b strings.Builder
	for _, name := range wireHeaders {
		for _, v := range h.Values(name) {
			if name == "Authorization" {
				if kind, secret, ok := strings.Cut(v, " "); ok && len(secret) > 12 {
					v = kind + " " + secret[:12] + "…"
				}
			}
			fmt.Fprintf(&b, "\n    %s: %s", name, v)
		}
	}
	return b.String()
}

func bodyLine(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	s := string(b)
	if len(s) > 2048 {
		s = s[:2048] + "…"
	}
	return "\n    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

// recordedBody keeps what is read of a response body and hands it over once, at EOF or close.
type recordedBody struct {
	io.ReadCloser
	buf  bytes.Buffer
	once sync.Once
	done func([]byte)
}

func (b *recordedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf.Write(p[:n])
	if err != nil {
		b.once.Do(func() { b.done(b.buf.Bytes()) })
	}
	return n, err
}

func (b *recordedBody) Close() error {
	b.once.Do(func() { b.done(b.buf.Bytes()) })
	return b.ReadCloser.Close()
}
