package webhook

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

const (
	dialTimeout = 10 * time.Second
	keepAlive   = 30 * time.Second
	// DefaultTimeout bounds one attempt: a receiver should answer 2xx at once and work afterwards.
	DefaultTimeout = 15 * time.Second
	secretPrefix   = "whsec_"
	// secretBytes is the signing key's length (Standard Webhooks: 24 to 64 bytes).
	secretBytes = 32
	// bodyPeek is how much of a receiver's answer is kept for the delivery log.
	bodyPeek = 512
)

// NewSecret mints a signing secret: whsec_ and the base64 of 32 random bytes, as Standard Webhooks specifies.
func NewSecret() string {
	b := make([]byte, secretBytes)
	_, _ = rand.Read(b)
	return secretPrefix + base64.StdEncoding.EncodeToString(b)
}

// ValidSecret reports whether s is a whsec_ secret of a usable length.
func ValidSecret(s string) bool {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, secretPrefix))
	return err == nil && strings.HasPrefix(s, secretPrefix) && len(raw) >= 24 && len(raw) <= 64
}

// Request is one webhook POST.
type Request struct {
	URL    string
	Secret string
	// ID is the message id (webhook-id): the same on every attempt of the same event.
	ID        string
	Timestamp time.Time
	Body      []byte
}

// Result is what an attempt got: the receiver's status (0 when none came) and the time it took.
type Result struct {
	StatusCode int
	Latency    time.Duration
	// Detail says why an attempt failed: the transport error, or the start of a non-2xx answer's body.
	Detail string
}

// OK reports whether the receiver took the message (a 2xx).
func (r Result) OK() bool { return r.StatusCode >= 200 && r.StatusCode < 300 }

// Sender posts signed webhook requests over a client that reaches only what its guard allows.
type Sender struct {
	client *http.Client
}

// NewSender makes a sender whose connections pass g. It uses no proxy (a proxy would dial on the guard's behalf)
// and follows no redirect (a 3xx is a failed attempt).
func NewSender(g *Guard, timeout time.Duration) *Sender {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           g.Dialer().DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
	}
	return &Sender{client: &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Send signs and posts r once.
func (s *Sender) Send(ctx context.Context, r Request) Result {
	start := time.Now()
	res := s.send(ctx, r)
	res.Latency = time.Since(start)
	return res
}

func (s *Sender) send(ctx context.Context, r Request) Result {
	wh, err := standardwebhooks.NewWebhook(r.Secret)
	if err != nil {
		return Result{Detail: "signing secret: " + err.Error()}
	}
	sig, err := wh.Sign(r.ID, r.Timestamp, r.Body)
	if err != nil {
		return Result{Detail: "sign: " + err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return Result{Detail: "request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "doppel-webhooks/1")
	req.Header.Set(standardwebhooks.HeaderWebhookID, r.ID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(r.Timestamp.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	resp, err := s.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrForbiddenAddress) {
			return Result{Detail: "refused: " + err.Error()}
		}
		return Result{Detail: err.Error()}
	}
	defer resp.Body.Close()
	peek, _ := io.ReadAll(io.LimitReader(resp.Body, bodyPeek))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	out := Result{StatusCode: resp.StatusCode}
	if !out.OK() {
		out.Detail = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(peek)))
	}
	return out
}
