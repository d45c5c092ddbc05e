package api

import (
	"log"
	"net/http"
	"time"
)

// Defaults of the connection timeouts.
const (
	// DefaultReadHeaderTimeout is how long a request's headers may take to arrive.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for its next request.
	DefaultIdleTimeout = 60 * time.Second
)

// ConnLimits are the API listener's connection timeouts (zero fields: the defaults).
type ConnLimits struct {
	// ReadHeader bounds the arrival of a request's headers, from the connection's first byte or its previous
	// request (api.read_header_timeout).
	ReadHeader time.Duration
	// Idle closes a keep-alive connection that sends no next request for this long (api.idle_timeout).
	Idle time.Duration
}

// NewHTTPServer is the http.Server the API listens with: headers must arrive within ReadHeader and an idle
// keep-alive connection is closed after Idle. Bodies get no whole-read timeout here: the body budget keeps each
// body at its minimum rate (408 under it), so a large upload at a good rate is never cut off. No write timeout
// either: long-lived answers (MCP's SSE streams, streamed tRPC batches) end by their own rules (the MCP session's
// idle timeout, the batch's last item).
func NewHTTPServer(h http.Handler, lim ConnLimits, errorLog *log.Logger) *http.Server {
	if lim.ReadHeader <= 0 {
		lim.ReadHeader = DefaultReadHeaderTimeout
	}
	if lim.Idle <= 0 {
		lim.Idle = DefaultIdleTimeout
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: lim.ReadHeader, IdleTimeout: lim.Idle, ErrorLog: errorLog}
}
