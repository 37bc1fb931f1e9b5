package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ShutdownTimeout bounds how long Serve waits for requests in flight when its context ends.
const ShutdownTimeout = 5 * time.Second

// ServerOptions say how Serve serves.
type ServerOptions struct {
	// Read and Write bound reading a request and writing its response; 0 means none.
	// Handlers that stream (watches) lift both for their own requests.
	Read, Write time.Duration
	// TLS, when set, serves HTTPS (HTTP/2 included) with this configuration.
	TLS *tls.Config
}

// Serve listens on addr and serves h until ctx ends, then shuts down gracefully. It logs the
// address it listens on (useful with port 0) and its scheme under the message "listening".
func Serve(ctx context.Context, log *slog.Logger, addr string, h http.Handler, t ServerOptions) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         t.TLS,
	}
	scheme := "http"
	if t.TLS != nil {
		scheme = "https"
	}
	log.Info("listening", "address", ln.Addr().String(), "scheme", scheme)
	errc := make(chan error, 1)
	go func() {
		if t.TLS != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", addr, err)
	}
	return nil
}

// streaming lifts the server's read deadline for a long-lived response (net/http cancels a
// request whose connection read deadline passes) and bounds writing it by d instead.
func streaming(w http.ResponseWriter, d time.Duration) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(d))
}
