package main

import (
	"context"
	"net"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/config"
)

// traceIngest is where the API puts the OTLP trace ingest it serves, for OTLP/gRPC to share.
func (s *stack) traceIngest() *api.TraceIngest { return &s.otlp }

// serveOTLPGRPC serves OTLP/gRPC trace export on otlp.grpc_addr (off when empty) over the API's trace ingest, and
// answers how to stop it (gracefully, within 5s).
func serveOTLPGRPC(st *stack) (func(), error) {
	addr := st.cfg.OTLP.GRPCAddr
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &config.FieldError{Key: "otlp.grpc_addr", Reason: err.Error()}
	}
	srv := api.NewGRPCServer(api.NewTraceService(st.traceIngest()), st.cfg.API.IdleTimeout)
	go func() { _ = srv.Serve(ln) }()
	st.log.Info("OTLP/gRPC trace export listening", "addr", ln.Addr().String())
	return func() {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		select {
		case <-done:
		case <-ctx.Done():
			srv.Stop()
		}
	}, nil
}
