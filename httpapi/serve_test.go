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
