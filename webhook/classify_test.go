package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/delivery"
)

func TestRetryAfterParsesSecondsAndDates(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"", 0, false},
		{"soon", 0, false},
	} {
		if got, ok := retryAfter(tt.in, now); got != tt.want || ok != tt.ok {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestEveryAnswerIsClassified: what each kind of HTTP answer means for a delivery.
func TestEveryAnswerIsClassified(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	retryIn2s := http.Header{"Retry-After": []string{"2"}}
	for _, c := range []struct {
		name   string
		code   int
		header http.Header
		want   string // "delivered", "gone", "rejected", "unauthorized", "retried", "retried after 2s"
	}{
		{"200 is delivered", 200, nil, "delivered"},
		{"204 is delivered", 204, nil, "delivered"},
		{"299 is delivered", 299, nil, "delivered"},
		{"a redirect, not followed, is final", 302, nil, "rejected"},
		{"400 is final", 400, nil, "rejected"},
		{"401 is tried again once the credentials are read again", 401, nil, "unauthorized"},
		{"403 is final", 403, nil, "rejected"},
		{"404 is final", 404, nil, "rejected"},
		{"410 asks dynwatch to stop sending", 410, nil, "gone"},
		{"408 is retried", 408, nil, "retried"},
		{"413 is final", 413, nil, "rejected"},
		{"429 is retried", 429, nil, "retried"},
		{"429 with Retry-After waits as asked", 429, retryIn2s, "retried after 2s"},
		{"500 is retried", 500, nil, "retried"},
		{"503 with Retry-After waits as asked", 503, retryIn2s, "retried after 2s"},
		{"a Retry-After on a final answer does not make it retried", 400, retryIn2s, "rejected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := classify(fmt.Sprintf("%d %s", c.code, http.StatusText(c.code)), c.code, c.header, now)
			var unauthorized *unauthorizedError
			got := "retried"
			switch {
			case err == nil:
				got = "delivered"
			case delivery.IsGone(err):
				got = "gone"
			case delivery.IsRejected(err):
				got = "rejected"
			case errors.As(err, &unauthorized):
				got = "unauthorized"
			case strings.Contains(err.Error(), "Retry-After 2s"):
				got = "retried after 2s"
			}
			if got != c.want {
				t.Errorf("classify(%d) = %v: %s, want %s", c.code, err, got, c.want)
			}
		})
	}
}
