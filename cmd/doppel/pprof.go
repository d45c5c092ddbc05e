package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/doppel-dev/doppel/config"
)

// servePprof serves Go's profiles (net/http/pprof) alone on debug.pprof_addr until stop is called; with the setting
// empty it serves nothing. The handlers are mounted on a mux of their own, never on the API's.
func servePprof(st *stack) (stop func(), err error) {
	addr := st.cfg.Debug.PprofAddr
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &config.FieldError{Key: "debug.pprof_addr", Reason: err.Error()}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(st.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	st.log.Info("pprof listening", "addr", ln.Addr().String(), "path", "/debug/pprof/")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
