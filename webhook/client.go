package webhook

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/egress"
)

// roundTripper makes a webhook's requests: client, or net/http's transport (proxied) for an
// endpoint a proxy from the environment leads to.
type roundTripper interface {
	// roundTrip makes req under ctx (req's own context is not read: setting it copies the
	// request) and reads its answer's head within timeout, which bounds the reading of the
	// answer's body too; an attempt that ran out of it fails with an error that is
	// context.DeadlineExceeded.
	roundTrip(ctx context.Context, req *http.Request, timeout time.Duration) (*http.Response, error)
	CloseIdleConnections()
}

// proxied is net/http's transport, bounded in time by the request's context.
type proxied struct{ *http.Transport }

func (p proxied) roundTrip(ctx context.Context, req *http.Request, timeout time.Duration) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := p.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnClose is an answer's body whose request's context ends once it is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// The client's limits, as net/http's transport for webhooks had them.
const (
	dialTimeout      = 10 * time.Second
	handshakeTimeout = 10 * time.Second
	idleTimeout      = 90 * time.Second
	// maxHeaderBytes bounds a response's status line and headers: a receiver cannot make a
	// worker read, or hold, more (net/http's transport allows 10 MB by default).
	maxHeaderBytes = 1 << 20
)

// client is a webhook's HTTP/1.1 client: the worker that sends a request writes it and reads
// its answer itself, on a keep-alive connection of its own taken from a pool of one per
// worker. net/http's transport gives each connection a goroutine that writes and one that
// reads, and a request wakes both and the worker (three goroutines, two hand-overs); at 300
// updates a second that was a quarter of dynwatch's CPU with two webhooks. What it gives up
// against net/http's transport:
//   - HTTP/2: a TLS endpoint is offered only http/1.1 by ALPN (a worker has one request in
//     flight on a connection of its own, so multiplexing would save nothing);
//   - proxies: an endpoint a proxy from the environment leads to is sent through net/http's
//     transport instead (see newRoundTripper);
//   - noticing at once that a receiver closed an idle connection: a request on a connection
//     reused that fails before any byte of the answer is read is sent again, once, on a new
//     connection (the receiver may see it twice, as after any failed attempt; Webhook-Id is
//     the same);
//   - idle connections closed by the receiver stay open on dynwatch's side (one per worker at
//     most) until they are next taken, or idleTimeout has passed.
//
// A request's context ends it: its connection's deadline is set in the past, which fails the
// write or read under way, and the connection is closed.
type client struct {
	addr string      // host:port to dial
	tls  *tls.Config // nil for http://
	// dial dials a connection: fenced (it writes nothing once the fence has lapsed) and, with
	// an egress policy, guarded.
	dial delivery.DialFunc

	mu   sync.Mutex
	idle []*conn // most recently used last
	max  int
}

// conn is one connection of the client and its buffers.
type conn struct {
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	in   countingReader
	used time.Time // when it was last given back
}

// countingReader counts what is read from a connection and refuses to read past limit.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
}

var errHeadersTooLong = fmt.Errorf("the answer's status line and headers exceed %d bytes", maxHeaderBytes)

func (c *countingReader) Read(p []byte) (int, error) {
	if c.n >= c.limit {
		return 0, errHeadersTooLong
	}
	p = p[:min(int64(len(p)), c.limit-c.n)]
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// newRoundTripper returns the round tripper of a webhook to endpoint: a client, or net/http's
// transport when a proxy from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) applies to
// it. An egress policy uses no proxy.
func newRoundTripper(endpoint *url.URL, tlsConfig *tls.Config, workers int, f delivery.Fence, guard *egress.Policy) (roundTripper, error) {
	if guard == nil {
		proxy, err := http.ProxyFromEnvironment(&http.Request{URL: endpoint})
		if err != nil {
			return nil, fmt.Errorf("the proxy for %s: %w", config.Redacted(endpoint), err)
		}
		if proxy != nil {
			return proxied{delivery.HTTPTransport(tlsConfig, workers, f)}, nil
		}
	}
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	if guard != nil {
		dialer.Control = guard.Control
	}
	c := &client{dial: delivery.FencedDialer(f, dialer.DialContext), max: workers}
	port := endpoint.Port()
	switch endpoint.Scheme {
	case "https":
		c.tls = tlsConfig.Clone()
		if c.tls == nil {
			c.tls = &tls.Config{}
		}
		if c.tls.ServerName == "" {
			c.tls.ServerName = endpoint.Hostname()
		}
		c.tls.NextProtos = []string{"http/1.1"}
		if port == "" {
			port = "443"
		}
	case "http":
		if port == "" {
			port = "80"
		}
	default:
		return nil, fmt.Errorf("the scheme of %s: http or https", config.Redacted(endpoint))
	}
	c.addr = net.JoinHostPort(endpoint.Hostname(), port)
	return c, nil
}

// roundTrip writes req on an idle connection or a new one and reads its answer's status line
// and headers. The answer's body is read from the connection; closing it gives the
// connection back when it was read to its end, and closes it otherwise. The time left is the
// connection's deadline, not a context of its own: a timer made and stopped for every request
// was 3% of the CPU of a storm's deliveries.
func (c *client) roundTrip(ctx context.Context, req *http.Request, timeout time.Duration) (*http.Response, error) {
	deadline := time.Now().Add(timeout)
	pc := c.take()
	reused := pc != nil
	if !reused {
		var err error
		if pc, err = c.connectBy(ctx, deadline, timeout); err != nil {
			return nil, err
		}
	}
	resp, err := c.exchange(ctx, pc, req, deadline, timeout)
	if err != nil && reused && pc.in.n == 0 && ctx.Err() == nil && time.Now().Before(deadline) && req.GetBody != nil {
		// The receiver closed the idle connection before this request reached it, or as it
		// did: once more on a new one.
		if req.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
		if pc, err = c.connectBy(ctx, deadline, timeout); err != nil {
			return nil, err
		}
		resp, err = c.exchange(ctx, pc, req, deadline, timeout)
	}
	return resp, err
}

// connectBy connects, giving up at deadline (the request's timeout) as a context would.
func (c *client) connectBy(ctx context.Context, deadline time.Time, timeout time.Duration) (*conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	pc, err := c.connect(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, timedOut(timeout)
	}
	return pc, err
}

// timedOut is the error of a request that ran out of its time.
func timedOut(timeout time.Duration) error {
	return fmt.Errorf("no answer within %v: %w", timeout, context.DeadlineExceeded)
}

// exchange writes req on pc and reads its answer's head by deadline, closing pc if either
// fails.
func (c *client) exchange(ctx context.Context, pc *conn, req *http.Request, deadline time.Time, timeout time.Duration) (*http.Response, error) {
	if err := pc.nc.SetDeadline(deadline); err != nil {
		pc.nc.Close()
		return nil, err
	}
	cut := context.AfterFunc(ctx, func() { _ = pc.nc.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		cut()
		pc.nc.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, timedOut(timeout)
		}
		return nil, err
	}
	pc.in.n, pc.in.limit = 0, maxHeaderBytes
	if err := writeRequest(pc.bw, req); err != nil {
		return fail(err)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err)
	}
	var resp *http.Response
	for {
		var err error
		if resp, err = http.ReadResponse(pc.br, req); err != nil {
			return fail(err)
		}
		// An informational answer (103 Early Hints, say) comes before the final one.
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	// The head is read: what the body's reader reads is bounded by whoever reads it.
	pc.in.limit = 1<<63 - 1
	resp.Body = &body{ReadCloser: resp.Body, c: c, pc: pc, cut: cut, keep: !resp.Close}
	return resp, nil
}

// writeRequest writes req, a request with its body's length known (ContentLength), to w as
// HTTP/1.1: the request line, Host, req.Header, Content-Length, then the body. It writes what
// http.Request.Write writes for such a request, without what that costs for every request
// (a transfer writer, the headers sorted through a pool, the URL's request URI built anew):
// a webhook's worker writes one per delivery. As Request.Write, it leaves out headers with
// invalid names and those it writes itself (Host, Content-Length, Transfer-Encoding,
// Trailer), and writes a value's line breaks as spaces.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		return fmt.Errorf("invalid Host header %q", host)
	}
	// The head is appended to the writer's free buffer (a larger head grows it) and written at
	// once.
	head := append(w.AvailableBuffer(), req.Method...)
	head = append(head, ' ')
	head = append(head, req.URL.RequestURI()...)
	head = append(head, " HTTP/1.1\r\nHost: "...)
	head = append(head, host...)
	head = append(head, "\r\n"...)
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) || headerWrittenApart[k] {
			continue
		}
		for _, v := range vs {
			head = append(head, k...)
			head = append(head, ": "...)
			head = append(head, strings.TrimSpace(lineBreaksToSpaces(v))...)
			head = append(head, "\r\n"...)
		}
	}
	head = append(head, "Content-Length: "...)
	head = strconv.AppendInt(head, req.ContentLength, 10)
	head = append(head, "\r\n\r\n"...)
	if _, err := w.Write(head); err != nil {
		return err
	}
	if req.Body == nil {
		if req.ContentLength != 0 {
			return fmt.Errorf("a request of %d bytes without a body", req.ContentLength)
		}
		return nil
	}
	n, err := io.Copy(w, req.Body)
	if err == nil && n != req.ContentLength {
		err = fmt.Errorf("the request's body was %d bytes, not its Content-Length %d", n, req.ContentLength)
	}
	return err
}

// headerWrittenApart are the headers writeRequest writes from the request rather than its
// Header, as Request.Write does.
var headerWrittenApart = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// lineBreaksToSpaces returns v with its CRs and LFs as spaces (as Request.Write writes a
// header's value: a value cannot start a header of its own).
func lineBreaksToSpaces(v string) string {
	if !strings.ContainsAny(v, "\r\n") {
		return v
	}
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
}

// body is an answer's body: closed at its end, it gives its connection back; before, it
// closes the connection rather than read on (net/http's body would read to the end, however
// long that is).
type body struct {
	io.ReadCloser
	c    *client
	pc   *conn
	cut  func() bool // stops the context's cut; false if it has cut the connection
	keep bool        // the answer did not ask for the connection to be closed
	eof  bool
	done bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *body) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if b.cut() && b.eof && b.keep {
		b.c.giveBack(b.pc)
		return nil
	}
	return b.pc.nc.Close()
}

// connect dials a new connection, with its TLS handshake for https.
func (c *client) connect(ctx context.Context) (*conn, error) {
	nc, err := c.dial(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if c.tls != nil {
		tc := tls.Client(nc, c.tls)
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	pc := &conn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10)}
	pc.in.r = nc
	pc.br = bufio.NewReaderSize(&pc.in, 4<<10)
	return pc, nil
}

// take returns an idle connection used within idleTimeout, closing older ones, or nil.
func (c *client) take() *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for len(c.idle) > 0 {
		pc := c.idle[len(c.idle)-1]
		c.idle = c.idle[:len(c.idle)-1]
		if now.Sub(pc.used) < idleTimeout {
			return pc
		}
		pc.nc.Close()
	}
	return nil
}

// giveBack keeps pc for the next request, unless max are kept.
func (c *client) giveBack(pc *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.idle) >= c.max {
		pc.nc.Close()
		return
	}
	pc.used = time.Now()
	c.idle = append(c.idle, pc)
}

// CloseIdleConnections closes the idle connections (the sink is removed or reconfigured, or
// its workers stopped as a follower's are).
func (c *client) CloseIdleConnections() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pc := range c.idle {
		pc.nc.Close()
	}
	c.idle = nil
}
