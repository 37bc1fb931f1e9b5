package webhook

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// rawReceiver is a receiver on loopback that hands each connection to serve, counting them.
type rawReceiver struct {
	ln    net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
}

func newRawReceiver(t *testing.T, serve func(c net.Conn, r *bufio.Reader)) *rawReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rr := &rawReceiver{ln: ln}
	rr.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rr.conns.Add(1)
			rr.wg.Go(func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		rr.wg.Wait()
	})
	return rr
}

// readRequest reads one request and its body from r; false once the connection has ended.
func readRequest(r *bufio.Reader) bool {
	req, err := http.ReadRequest(r)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err == nil
}

// transportTo is a webhook transport of one worker to rr with the timeout given.
func transportTo(t *testing.T, rr *rawReceiver, timeout time.Duration) *Transport {
	t.Helper()
	endpoint := &url.URL{Scheme: "http", Host: rr.ln.Addr().String(), Path: "/hook"}
	tr, err := New(&config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: timeout}, Endpoint: endpoint},
		testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func send(t *testing.T, tr *Transport) error {
	t.Helper()
	return tr.Send(t.Context(), &delivery.Delivery{Entry: journal.Entry{Event: event("a"), ID: "id-a"}}, []byte(`{"a":1}`))
}

// TestRequestsShareOneKeptAliveConnection: a worker's requests, one after the other, go over
// one connection.
func TestRequestsShareOneKeptAliveConnection(t *testing.T) {
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		for readRequest(r) {
			if _, err := io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n"); err != nil {
				return
			}
		}
	})
	tr := transportTo(t, rr, 10*time.Second)
	for i := range 50 {
		if err := send(t, tr); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := rr.conns.Load(); n != 1 {
		t.Errorf("50 requests made %d connections; want 1", n)
	}
}

// TestAConnectionTheReceiverClosedWhileIdleIsReplacedNotFailed: a receiver that closes every
// connection after its answer, without saying so, fails no request: the request written on
// the closed connection is sent again on a new one.
func TestAConnectionTheReceiverClosedWhileIdleIsReplacedNotFailed(t *testing.T) {
	var answered atomic.Int64
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		if readRequest(r) {
			answered.Add(1)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := transportTo(t, rr, 10*time.Second)
	for i := range 20 {
		if err := send(t, tr); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := answered.Load(); n != 20 {
		t.Errorf("the receiver answered %d requests; want 20", n)
	}
}

// TestAnAnswerWithEndlessHeadersIsCutAtTheLimit: a receiver that sends headers without end
// gets a failed attempt once a MiB of them is read, not a worker reading for ever.
func TestAnAnswerWithEndlessHeadersIsCutAtTheLimit(t *testing.T) {
	var sent atomic.Int64
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		if !readRequest(r) {
			return
		}
		line := "HTTP/1.1 200 OK\r\n"
		for {
			n, err := io.WriteString(c, line)
			sent.Add(int64(n))
			if err != nil {
				return
			}
			line = "X-Padding: " + strings.Repeat("x", 1000) + "\r\n"
		}
	})
	tr := transportTo(t, rr, time.Minute)
	err := send(t, tr)
	if !errors.Is(err, errHeadersTooLong) {
		t.Fatalf("Send: %v; want %v", err, errHeadersTooLong)
	}
	tr.Close()
	rr.ln.Close()
	rr.wg.Wait()
	// What the socket buffers took besides the MiB read.
	if n := sent.Load(); n > 64<<20 {
		t.Errorf("the receiver wrote %d MB of headers before its connection was closed", n>>20)
	}
}

// TestAnEndlessBodyIsNotReadToItsEnd: the answer's first 64 KiB are read and its connection
// closed, not read to its end (which a body read to the end to keep the connection would be).
func TestAnEndlessBodyIsNotReadToItsEnd(t *testing.T) {
	var sent atomic.Int64
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		if !readRequest(r) {
			return
		}
		w := bufio.NewWriter(c)
		if _, err := fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", int64(1)<<40); err != nil {
			return
		}
		chunk := make([]byte, 32<<10)
		for {
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	tr := transportTo(t, rr, time.Minute)
	if err := send(t, tr); err != nil {
		t.Fatal(err)
	}
	rr.ln.Close()
	rr.wg.Wait()
	if n := sent.Load(); n > 64<<20 {
		t.Errorf("the receiver wrote %d MB of its body before its connection was closed", n>>20)
	}
}

// TestARequestsTimeoutCutsItsConnection: a receiver that never answers gets a failed attempt
// after the webhook's timeout, and its connection closed.
func TestARequestsTimeoutCutsItsConnection(t *testing.T) {
	closed := make(chan struct{})
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		if readRequest(r) {
			_, _ = r.ReadByte() // until the client closes the connection
			close(closed)
		}
	})
	tr := transportTo(t, rr, 200*time.Millisecond)
	if err := send(t, tr); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send: %v; want %v", err, context.DeadlineExceeded)
	}
	<-closed
}

// TestAHandshakeThatNeverEndsRunsOutOfTheRequestsTime: an https endpoint that accepts the
// connection and never answers the TLS handshake fails the attempt once the webhook's timeout
// has passed, not the handshake's own (10 s), and its connection is closed.
func TestAHandshakeThatNeverEndsRunsOutOfTheRequestsTime(t *testing.T) {
	closed := make(chan struct{})
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		_, _ = io.Copy(io.Discard, r) // the ClientHello, then until the client closes
		close(closed)
	})
	endpoint := &url.URL{Scheme: "https", Host: rr.ln.Addr().String(), Path: "/hook"}
	tr, err := New(&config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: 200 * time.Millisecond}, Endpoint: endpoint},
		testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	err = send(t, tr)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Fatalf("Send: %v; want no answer within 200ms (%v)", err, context.DeadlineExceeded)
	}
	<-closed
}

// TestAnInformationalAnswerIsSkipped: a 103 Early Hints before the final answer is read past.
func TestAnInformationalAnswerIsSkipped(t *testing.T) {
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		for readRequest(r) {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"); err != nil {
				return
			}
		}
	})
	tr := transportTo(t, rr, 10*time.Second)
	err := send(t, tr)
	if err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("Send: %v; want the final answer's 500", err)
	}
}

// proxyChild marks the process TestAProxyFromTheEnvironmentCarriesTheRequests starts with the
// proxy in its environment (net/http reads it once a process).
const proxyChild = "DYNWATCH_TEST_PROXY_CHILD"

// TestAProxyFromTheEnvironmentCarriesTheRequests: with HTTP_PROXY set, a webhook's requests
// go through the proxy (net/http's transport), with the endpoint's absolute URL.
func TestAProxyFromTheEnvironmentCarriesTheRequests(t *testing.T) {
	if os.Getenv(proxyChild) == "" {
		var seen atomic.Value
		proxy := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			seen.Store(req.Method + " " + req.RequestURI)
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
		})
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestAProxyFromTheEnvironmentCarriesTheRequests$", "-test.count=1")
		cmd.Env = append(os.Environ(), proxyChild+"=1", "HTTP_PROXY=http://"+proxy.ln.Addr().String(), "NO_PROXY=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the test with the proxy set: %v\n%s", err, out)
		}
		if got, want := seen.Load(), "POST http://receiver.invalid/hook"; got != want {
			t.Errorf("the proxy was asked %v; want %q", got, want)
		}
		return
	}
	// The endpoint's name is never resolved: the proxy is asked for it.
	endpoint := &url.URL{Scheme: "http", Host: "receiver.invalid", Path: "/hook"}
	tr, err := New(&config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: 10 * time.Second}, Endpoint: endpoint},
		testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := send(t, tr); err != nil {
		t.Fatal(err)
	}
}

// The request head written by hand reads back as Request.Write's does: the same method, URI,
// host, headers (line breaks in a value as spaces, invalid names and the headers written
// from the request left out) and body.
func TestWriteRequestReadsBackAsRequestWrite(t *testing.T) {
	u, err := url.Parse("http://receiver.invalid:8080/hooks/a%2Fb?x=1&y=%20z")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"ADDED"}`)
	newReq := func() *http.Request {
		return &http.Request{
			Method: http.MethodPost, URL: u, Host: u.Host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{
				"Content-Type":      {"application/json"},
				"User-Agent":        {"dynwatch"},
				"Ce-Subject":        {"default/a"},
				"X-Two":             {"one", "two"},
				"X-Broken":          {"a\r\nInjected: yes"},
				"X-Padded":          {"  padded \t"},
				"Bad Name":          {"dropped"},
				"Content-Length":    {"999"},
				"Transfer-Encoding": {"chunked"},
				"Host":              {"elsewhere.invalid"},
			},
			Body: io.NopCloser(strings.NewReader(string(body))), ContentLength: int64(len(body)),
		}
	}
	read := func(write func(w *bufio.Writer, r *http.Request) error) *http.Request {
		t.Helper()
		var b strings.Builder
		w := bufio.NewWriter(&b)
		if err := write(w, newReq()); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(b.String())))
		if err != nil {
			t.Fatalf("%v in %q", err, b.String())
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != string(body) {
			t.Fatalf("body %q, %v", got, err)
		}
		return r
	}
	want := read(func(w *bufio.Writer, r *http.Request) error { return r.Write(w) })
	got := read(writeRequest)
	if got.Method != want.Method || got.RequestURI != want.RequestURI || got.Host != want.Host || got.ContentLength != want.ContentLength {
		t.Errorf("got %s %s host %s length %d, want %s %s host %s length %d", got.Method, got.RequestURI, got.Host, got.ContentLength, want.Method, want.RequestURI, want.Host, want.ContentLength)
	}
	if fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
		t.Errorf("headers\n%v\nwant\n%v", got.Header, want.Header)
	}
	if got.Header.Get("Injected") != "" || got.Header.Get("Bad Name") != "" {
		t.Errorf("a value's line break or an invalid name made a header: %v", got.Header)
	}
}

// A body shorter than the request's Content-Length is an error, not a request the receiver
// waits on.
func TestWriteRequestRefusesABodyShorterThanItsLength(t *testing.T) {
	u, _ := url.Parse("http://receiver.invalid/")
	req := &http.Request{Method: http.MethodPost, URL: u, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ab")), ContentLength: 3}
	if err := writeRequest(bufio.NewWriter(io.Discard), req); err == nil {
		t.Error("no error for a body of 2 bytes with Content-Length 3")
	}
}

// TestBodiesBuiltInReusedBuffersReachTheReceiverWhole: bodies built from their entries, in
// buffers later requests reuse, by four workers at once, each arrive as AppendBody makes it,
// with its own id, whatever the sizes before it.
func TestBodiesBuiltInReusedBuffersReachTheReceiverWhole(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{} // Webhook-Id → body
	rr := newRawReceiver(t, func(c net.Conn, r *bufio.Reader) {
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			mu.Lock()
			got[req.Header.Get("Webhook-Id")] = string(b)
			mu.Unlock()
			if _, err := io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n"); err != nil {
				return
			}
		}
	})
	tr := transportTo(t, rr, 10*time.Second)
	if !tr.reuseScratch {
		t.Fatal("the client's transport does not reuse its bodies' buffers")
	}
	want := map[string]string{}
	entries := make(chan journal.Entry, 200)
	for i := range 200 {
		e := journal.Entry{Event: event(fmt.Sprintf("cm-%d", i)), ID: fmt.Sprintf("id-%d", i)}
		// Sizes that rise and fall, so that a body shorter than the one its buffer held
		// before would show the earlier one's tail.
		u, err := e.Event.Object.Decode()
		if err != nil {
			t.Fatal(err)
		}
		u.Object["data"] = map[string]any{"pad": strings.Repeat("x", (i*977)%9000)}
		e.Event.Object = object.New(u)
		want[e.ID] = string(journal.AppendBody(nil, e))
		entries <- e
	}
	close(entries)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for e := range entries {
				if err := tr.Send(t.Context(), &delivery.Delivery{Entry: e}, nil); err != nil {
					t.Errorf("Send %s: %v", e.ID, err)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: the receiver got %d bytes, not the %d AppendBody makes", id, len(got[id]), len(w))
		}
	}
}
