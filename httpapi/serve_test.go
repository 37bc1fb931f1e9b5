package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/net/websocket"
)

// TestStreamsOutliveTheServerTimeouts streams for longer than the server's read and write
// timeouts, as a watch does, and checks the client receives every line.
func TestStreamsOutliveTheServerTimeouts(t *testing.T) {
	r := gin.New()
	r.GET("/stream", func(c *gin.Context) {
		streaming(c.Writer, time.Minute)
		c.Status(http.StatusOK)
		for i := range 6 {
			fmt.Fprintf(c.Writer, "line %d\n", i)
			c.Writer.Flush()
			time.Sleep(250 * time.Millisecond)
		}
	})
	addrs := make(chan string, 1)
	logAddr := slog.New(addrHandler{addrs})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, logAddr, "127.0.0.1:0", r, ServerOptions{Read: 400 * time.Millisecond, Write: 400 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	resp, err := http.Get("http://" + <-addrs + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 6 {
		t.Fatalf("received %d lines (%v) over 1.5s; the 400ms server timeouts cut the stream", len(lines), strings.Join(lines, "|"))
	}
}

// TestAWebSocketStreamOutlivesTheServerTimeoutsAndEndsWithItsClient streams over a
// websocket for longer than the server's read and write timeouts, bounding its writes as a
// watch does: every Write arrives as one message; when the client hangs up, the handler's
// context ends.
func TestAWebSocketStreamOutlivesTheServerTimeoutsAndEndsWithItsClient(t *testing.T) {
	ended := make(chan struct{})
	r := gin.New()
	r.GET("/stream", func(c *gin.Context) {
		overWebSocket(c, func(c *gin.Context) {
			if err := http.NewResponseController(c.Writer).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Errorf("a stream over a websocket cannot bound its writes: %v", err)
			}
			for i := range 6 {
				if c.Request.Context().Err() != nil {
					return // the client is gone, or so the server believes
				}
				fmt.Fprintf(c.Writer, "line %d\n", i)
				c.Writer.Flush()
				time.Sleep(250 * time.Millisecond)
			}
			<-c.Request.Context().Done()
			close(ended)
		})
	})
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, slog.New(addrHandler{addrs}), "127.0.0.1:0", r, ServerOptions{Read: 400 * time.Millisecond, Write: 400 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := <-addrs
	ws, err := websocket.Dial("ws://"+addr+"/stream", "", "http://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for range 6 {
		var msg string
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			t.Fatalf("after %v: %v; the 400ms server timeouts cut the stream", lines, err)
		}
		lines = append(lines, msg)
	}
	if got := strings.Join(lines, ""); got != "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\n" {
		t.Errorf("received %q; want six messages, one line each", got)
	}
	_ = ws.Close()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Error("the handler's context did not end within 5s of the client hanging up")
	}
}

// addrHandler captures the address Serve logs.
type addrHandler struct{ addrs chan string }

func (h addrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h addrHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "address" {
			h.addrs <- a.Value.String()
		}
		return true
	})
	return nil
}
func (h addrHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h addrHandler) WithGroup(string) slog.Handler      { return h }
