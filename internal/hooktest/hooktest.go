// Package hooktest is a webhook receiver for tests that checks every signature as the Standard Webhooks spec says.
package hooktest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Tolerance is how far a webhook-timestamp may be from now (the spec's suggested five minutes).
const Tolerance = 5 * time.Minute

// Verify checks a webhook request as the Standard Webhooks specification describes, written from its text and
// sharing no code with the signer: the signed content is "<webhook-id>.<webhook-timestamp>.<body>", the key is
// the base64 decoding of the secret after its "whsec_" prefix, each space-delimited entry of webhook-signature is
// "v1,<base64 HMAC-SHA256>", and one entry must match in constant time; the timestamp (Unix seconds) must be
// within Tolerance of now.
func Verify(secret string, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook-timestamp %q is not Unix seconds", ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("webhook-timestamp is %s from now", d)
	}
	b64, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return errors.New("the secret does not start with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("the secret is not base64: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, entry := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no v1 signature matches")
}

// Message is one request the receiver got.
type Message struct {
	ID, Type string
	Data     map[string]any
	Body     []byte
	Header   http.Header
	// Err is why its signature did not verify (nil: it did).
	Err error
	At  time.Time
}

// Receiver is an HTTP server that records webhook requests, verifying each with Secret (set it once known). While
// Down it answers 503 and records nothing.
type Receiver struct {
	URL string

	mu     sync.Mutex
	secret string
	down   bool
	got    []Message
	srv    *httptest.Server
	notify chan struct{}
}

// NewReceiver starts a receiver on a loopback port.
func NewReceiver() *Receiver {
	r := &Receiver{notify: make(chan struct{}, 1)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() { r.srv.Close() }

// SetSecret sets the secret signatures are checked with.
func (r *Receiver) SetSecret(s string) { r.mu.Lock(); r.secret = s; r.mu.Unlock() }

// SetDown makes the receiver refuse (503) or take requests.
func (r *Receiver) SetDown(down bool) { r.mu.Lock(); r.down = down; r.mu.Unlock() }

// Messages returns what was received, in order.
func (r *Receiver) Messages() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.got...)
}

// Wait waits until ok holds for the messages received, or timeout passes; it answers the messages.
func (r *Receiver) Wait(timeout time.Duration, ok func([]Message) bool) ([]Message, bool) {
	deadline := time.After(timeout)
	for {
		ms := r.Messages()
		if ok(ms) {
			return ms, true
		}
		select {
		case <-r.notify:
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			return r.Messages(), false
		}
	}
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	if r.down {
		r.mu.Unlock()
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	m := Message{ID: req.Header.Get("webhook-id"), Body: body, Header: req.Header.Clone(), At: time.Now()}
	m.Err = Verify(r.secret, req.Header, body, time.Now())
	var env struct {
		ID   string         `json:"id"`
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil && m.Err == nil {
		m.Err = fmt.Errorf("body is not a JSON event: %w", err)
	}
	if env.ID != m.ID && m.Err == nil {
		m.Err = fmt.Errorf("body id %q differs from webhook-id %q", env.ID, m.ID)
	}
	m.Type, m.Data = env.Type, env.Data
	r.got = append(r.got, m)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}
