package api

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
)

// collectBodies keeps collect body buffers between requests. A body is read whole, and at the collector's default
// of 50 traces it is about 1 MB: a fresh buffer per request, grown as it is read, cost some 5 % of an ingest
// request's CPU (BenchmarkCollect's profile), in copies, clearing and collection.
var collectBodies = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody is the largest buffer collectBodies keeps.
const maxPooledBody = 8 << 20

type bodyKey struct{}

// readCollectBody reads a collect request's body whole into a buffer of collectBodies, sized by its Content-Length
// when it gives one. A body over limit bytes answers 413 (before any is read when its declared length says so); one
// that takes longer than collectBodyReadTimeout to arrive answers 408. release gives the buffer back, after which
// body must not be used.
func readCollectBody(ctx huma.Context, limit int64) (body []byte, release func(), err error) {
	r, _ := humago.Unwrap(ctx)
	tooLarge := func() error {
		return TooLarge("the body is over the collect cap of %d bytes; send fewer traces a request", limit)
	}
	if r.ContentLength > limit {
		return nil, nil, tooLarge()
	}
	ctx.SetReadDeadline(time.Now().Add(collectBodyReadTimeout))
	bufp := collectBodies.Get().(*[]byte)
	buf := (*bufp)[:0]
	if want := int(r.ContentLength) + 1; r.ContentLength >= 0 && cap(buf) < want { // + 1: room to read the end
		buf = make([]byte, 0, want)
	}
	release = func() {
		if cap(buf) <= maxPooledBody {
			*bufp = buf[:0]
			collectBodies.Put(bufp)
		}
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(len(buf), 64<<10))
		}
		n, rerr := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		var nerr net.Error
		switch {
		case int64(len(buf)) > limit:
			release()
			return nil, nil, tooLarge()
		case rerr == io.EOF:
			return buf, release, nil
		case errors.As(rerr, &nerr) && nerr.Timeout():
			release()
			return nil, nil, Errorf(http.StatusRequestTimeout, "the body took longer than %s to arrive", collectBodyReadTimeout)
		case rerr != nil:
			release()
			return nil, nil, Invalid("body", "could not read the body: "+rerr.Error())
		}
	}
}

// requestBody answers the collect body gate read for the request.
func requestBody(ctx context.Context) []byte {
	b, _ := ctx.Value(bodyKey{}).([]byte)
	return b
}
