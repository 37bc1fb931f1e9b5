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

	"github.com/gin-gonic/gin"
	"golang.org/x/net/websocket"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/dynwatch/dynwatch/dynamicinformer"
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

// serveWatch serves a watch as a stream of JSON lines or, when the request asks for a
// websocket, over one (see overWebSocket), as the apiserver's watch handler does.
func (a *api) serveWatch(c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder) {
	// The options a watch may take, checked as the apiserver checks them before it watches:
	// resourceVersionMatch only NotOlderThan, and only with sendInitialEvents, which needs it.
	if serr := checkOptions(q.options, true); serr != nil {
		writeStatus(c.Writer, serr)
		return
	}
	if !wsstream.IsWebSocketRequest(c.Request) {
		a.watch(c, res, t, q, out)
		return
	}
	overWebSocket(c, func(c *gin.Context) { a.watch(c, res, t, q, out) })
}

// overWebSocket runs a streaming handler over a websocket, as the apiserver serves watches:
// with the same library's handshake (golang.org/x/net/websocket: a request without an Origin
// is refused with 403, a bad version with 400; a bearer token may ride in the protocol header,
// which authentication has already taken out), then each Write as a text message. The client
// sends nothing; its closing the websocket ends the handler's request context.
func overWebSocket(c *gin.Context, handle func(*gin.Context)) {
	websocket.Handler(func(ws *websocket.Conn) {
		ctx, cancel := context.WithCancel(c.Request.Context())
		defer cancel()
		go func() {
			wsstream.IgnoreReceives(ws, 0)
			cancel()
		}()
		c.Request = c.Request.WithContext(ctx)
		c.Writer = &messages{ResponseWriter: c.Writer, ws: ws, header: http.Header{}}
		handle(c)
	}).ServeHTTP(c.Writer, c.Request)
}

// messages is a watch's response writer over a websocket: each Write, which the watch makes
// once per event, is one text message, as the apiserver frames JSON watch events. Status and
// headers were settled by the handshake; flushing is sending. The write deadline a streaming
// response sets (see streaming) applies to the websocket's connection, whose deadlines the
// hijack cleared.
type messages struct {
	gin.ResponseWriter
	ws     *websocket.Conn
	header http.Header
}

func (m *messages) Write(p []byte) (int, error) {
	if err := websocket.Message.Send(m.ws, string(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (m *messages) WriteString(s string) (int, error)  { return m.Write([]byte(s)) }
func (m *messages) Header() http.Header                { return m.header }
func (m *messages) WriteHeader(int)                    {}
func (m *messages) WriteHeaderNow()                    {}
func (m *messages) Flush()                             {}
func (m *messages) SetWriteDeadline(t time.Time) error { return m.ws.SetWriteDeadline(t) }
