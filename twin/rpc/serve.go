package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/doppel-dev/doppel/internal/atomicfile"
	"github.com/doppel-dev/doppel/internal/osmem"
)

// Loader loads the runtime a twin hosts (reads and parses its bundle).
type Loader func(ctx context.Context) (Runtime, error)

// ServeOptions configures Serve.
type ServeOptions struct {
	// Listen is the host:port to bind; port 0 picks a free one. Empty means 127.0.0.1:0.
	Listen string
	// Load loads the bundle once the listener is bound (BundleFile, BundleBlob). Required.
	Load Loader
	// AddrFile, when set, receives the bound host:port (written atomically) as soon as the listener is bound.
	AddrFile string
	// Announce, when set, receives one line "listening on HOST:PORT" as soon as the listener is bound.
	Announce io.Writer
	// OnListen, when set, is called with the bound host:port as soon as the listener is bound.
	OnListen func(addr string)
	Logger   *slog.Logger
	// MaxBodyBytes bounds request bodies (zero: DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Memory, when set, is told each time a session's world is dropped (ServerOptions.Memory).
	Memory *osmem.Returner
	// ShutdownTimeout bounds the graceful shutdown when ctx ends (zero: 5s).
	ShutdownTimeout time.Duration
	// Server, when set, is the server to serve (e.g. one its caller also reaches directly through
	// NewLocalClient); nil makes one. Serve retires it when it stops. MaxBodyBytes, Logger and Memory are then its
	// own.
	Server *Server
}

// ListenPrefix starts the line Serve writes to ServeOptions.Announce.
const ListenPrefix = "listening on "

// Serve runs a twin: it binds the listener, announces the address (health answers from then on), loads the bundle,
// becomes ready, and serves until ctx ends; then it shuts down gracefully and returns nil. A bundle that fails to
// load ends Serve with that error, so a supervising driver sees the process exit.
func Serve(ctx context.Context, opts ServeOptions) error {
	if opts.Load == nil {
		return errors.New("twin/rpc: ServeOptions.Load is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := opts.Server
	if srv == nil {
		srv = NewServer(ServerOptions{MaxBodyBytes: opts.MaxBodyBytes, Logger: log, Memory: opts.Memory})
	}
	defer srv.release()
	listen := opts.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("twin/rpc: listen on %s: %w", listen, err)
	}
	addr := ln.Addr().String()

	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	shutdown := func() error {
		srv.retired.Store(true)
		timeout := opts.ShutdownTimeout
		if timeout <= 0 {
			timeout = 5 * time.Second
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}

	if err := announce(opts, addr); err != nil {
		_ = shutdown()
		return err
	}
	log.Info("twin listening", "addr", addr)

	start := time.Now()
	loaded := make(chan error, 1)
	go func() {
		rt, err := opts.Load(ctx)
		if err == nil {
			srv.SetRuntime(rt)
			log.Info("twin ready", "bundle", rt.BundleHash(), "load", time.Since(start).String())
		}
		loaded <- err
	}()

	for {
		select {
		case err := <-loaded:
			if err != nil {
				_ = shutdown()
				return fmt.Errorf("twin/rpc: load bundle: %w", err)
			}
			loaded = nil
		case err := <-served:
			return fmt.Errorf("twin/rpc: serve on %s: %w", addr, err)
		case <-ctx.Done():
			return shutdown()
		}
	}
}

func announce(opts ServeOptions, addr string) error {
	if opts.AddrFile != "" {
		if err := atomicfile.Write(opts.AddrFile, []byte(addr+"\n")); err != nil {
			return fmt.Errorf("twin/rpc: write addr file: %w", err)
		}
	}
	if opts.Announce != nil {
		if _, err := fmt.Fprintf(opts.Announce, "%s%s\n", ListenPrefix, addr); err != nil {
			return fmt.Errorf("twin/rpc: announce address: %w", err)
		}
	}
	if opts.OnListen != nil {
		opts.OnListen(addr)
	}
	return nil
}
