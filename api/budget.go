package api

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/doppel-dev/doppel/internal/osmem"
)

// Defaults of the request-body budget.
const (
	// DefaultBodyBudget is the most request-body bytes the API holds at once, over all requests.
	DefaultBodyBudget = 256 << 20
	// DefaultReturnMemoryEvery is the shortest time between two returns of memory to the OS after large bodies.
	DefaultReturnMemoryEvery = 10 * time.Second
	// largeBody is the body size from which a request counts as large: once no large body is in flight, the
	// memory they took is returned to the OS.
	largeBody = 1 << 20
	// budgetRetryAfter is the Retry-After of a request refused for want of budget, in seconds.
	budgetRetryAfter = 1
)

// errOverBudget ends the read of a body of unknown length that would take the server past its body budget.
var errOverBudget = errors.New("request body over the server's in-flight body budget")

// bodyBudget bounds the request-body bytes held at once over every route (collect, the multipart build, REST and
// tRPC JSON bodies): a request with a Content-Length takes that many bytes of the budget before its handler runs,
// one without takes them as its body is read. A request the budget cannot hold is answered 503 with Retry-After
// at once, never queued. Large bodies that finish give their memory back to the OS (rate-limited), so a spike of
// uploads does not leave the process at its peak size.
type bodyBudget struct {
	sem      *semaphore.Weighted
	size     int64
	inflight atomic.Int64
	refused  atomic.Int64
	ret      *osmem.Returner
	obs      BudgetObserver
}

// BudgetObserver is told the bytes in flight after each change and each refusal (the metrics do).
type BudgetObserver interface {
	BodyBytesInFlight(n int64)
	BodyRefused()
}

func newBodyBudget(size int64, returnEvery time.Duration, obs BudgetObserver) *bodyBudget {
	if size == 0 {
		size = DefaultBodyBudget
	}
	if size < 0 {
		return nil
	}
	b := &bodyBudget{sem: semaphore.NewWeighted(size), size: size, obs: obs}
	if returnEvery >= 0 {
		if returnEvery == 0 {
			returnEvery = DefaultReturnMemoryEvery
		}
		b.ret = osmem.New(returnEvery, nil)
	}
	return b
}

// admit takes the budget of r's body. It answers the release to run once the request is done, or the envelope
// to refuse r with. A body of unknown length is wrapped so that its bytes are taken as they are read; over is then
// set when the read ran out of budget.
func (b *bodyBudget) admit(r *http.Request) (release func(), over *atomic.Bool, e *Envelope) {
	if b == nil || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return func() {}, nil, nil
	}
	if r.ContentLength > b.size {
		return nil, nil, TooLarge("request body of %d bytes is over the server's in-flight body budget of %d bytes (api.body_budget_bytes)",
			r.ContentLength, b.size)
	}
	if r.ContentLength > 0 {
		n := r.ContentLength
		if !b.take(n) {
			return nil, nil, b.refusal()
		}
		large := n >= largeBody
		if large && b.ret != nil {
			b.ret.Begin()
		}
		return func() {
			b.give(n)
			if large && b.ret != nil {
				b.ret.End()
			}
		}, nil, nil
	}
	br := &budgetReader{ReadCloser: r.Body, b: b}
	r.Body = br
	return br.release, &br.over, nil
}

func (b *bodyBudget) take(n int64) bool {
	if !b.sem.TryAcquire(n) {
		b.refused.Add(1)
		if b.obs != nil {
			b.obs.BodyRefused()
		}
		return false
	}
	v := b.inflight.Add(n)
	if b.obs != nil {
		b.obs.BodyBytesInFlight(v)
	}
	return true
}

func (b *bodyBudget) give(n int64) {
	b.sem.Release(n)
	v := b.inflight.Add(-n)
	if b.obs != nil {
		b.obs.BodyBytesInFlight(v)
	}
}

func (b *bodyBudget) refusal() *Envelope {
	return Unavailable("the server is reading its most request-body bytes at once (%d, api.body_budget_bytes); retry after %d s",
		b.size, budgetRetryAfter)
}

// refuse answers r with e: the REST envelope, tRPC's error shape under /trpc/, or OTLP's google.rpc.Status at
// /v1/traces. A 503 carries Retry-After.
func refuse(w http.ResponseWriter, r *http.Request, e *Envelope) {
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(budgetRetryAfter))
	}
	// The body is left unread: closing the connection spares the client sending the rest of it.
	w.Header().Set("Connection", "close")
	if strings.HasPrefix(r.URL.Path, "/trpc/") {
		trpcFail(w, r, e)
		return
	}
	if r.URL.Path == tracesPath { // OTLP/HTTP's error body
		writeTraceRefusal(w, r, e)
		return
	}
	writeEnvelope(w, e.status, e)
}

// budgetReader takes a body of unknown length's bytes from the budget as they are read.
type budgetReader struct {
	io.ReadCloser
	b     *bodyBudget
	mu    sync.Mutex
	taken int64
	large bool
	over  atomic.Bool
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.ReadCloser.Read(p)
	if n > 0 {
		br.mu.Lock()
		defer br.mu.Unlock()
		if br.over.Load() || !br.b.take(int64(n)) {
			br.over.Store(true)
			return 0, errOverBudget
		}
		br.taken += int64(n)
		if !br.large && br.taken >= largeBody && br.b.ret != nil {
			br.large = true
			br.b.ret.Begin()
		}
	}
	return n, err
}

func (br *budgetReader) release() {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.taken > 0 {
		br.b.give(br.taken)
		br.taken = 0
	}
	if br.large {
		br.large = false
		br.b.ret.End()
	}
}
