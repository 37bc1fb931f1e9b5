package webhook

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/dynwatch/dynwatch/delivery"
)

// This file decides what an HTTP answer means for a delivery: done, final, or retried when.

// unauthorizedError is a 401: worth one more try once the credentials are read again.
type unauthorizedError struct{ err error }

func (e *unauthorizedError) Error() string { return e.err.Error() }

// classify turns an HTTP status into nil (2xx), the receiver's request to stop (410,
// delivery.Gone), a rejection (delivery.Rejected), an unauthorizedError, or a retriable error
// (408, 429, 5xx), which carries Retry-After when the sink sent one.
func classify(status string, code int, header http.Header, now time.Time) error {
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusUnauthorized:
		return &unauthorizedError{errors.New(status)}
	case code == http.StatusGone:
		return delivery.Gone(errors.New(status))
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		if wait, ok := retryAfter(header.Get("Retry-After"), now); ok {
			return delivery.RetryAfter(errors.New(status+" (Retry-After "+wait.String()+")"), wait)
		}
		return errors.New(status)
	default:
		return delivery.Rejected(errors.New(status))
	}
}

// retryAfter parses a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
