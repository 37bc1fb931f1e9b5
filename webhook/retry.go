package webhook

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/dynwatch/dynwatch/config"
)

// This file decides whether a failed delivery is retried, and when.

// rejectedError is an answer that retrying cannot change: any 4xx but 408 and 429.
type rejectedError struct{ err error }

func (e *rejectedError) Error() string { return e.err.Error() }

// retryAfterError is a retriable answer that said when to come back.
type retryAfterError struct {
	err  error
	wait time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }

// unauthorizedError is a 401: worth one more try once the credentials are read again.
type unauthorizedError struct{ err error }

func (e *unauthorizedError) Error() string { return e.err.Error() }

// classify turns an HTTP status into nil (2xx), a rejectedError, an unauthorizedError, or a
// retriable error (408, 429, 5xx), which carries Retry-After when the sink sent one.
func classify(status string, code int, header http.Header, now time.Time) error {
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusUnauthorized:
		return &unauthorizedError{errors.New(status)}
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		if wait, ok := retryAfter(header.Get("Retry-After"), now); ok {
			return &retryAfterError{errors.New(status + " (Retry-After " + wait.String() + ")"), wait}
		}
		return errors.New(status)
	default:
		return &rejectedError{errors.New(status)}
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

// nextAttempt decides when d, whose attempt at now failed with a retriable err, is tried
// again: after exponential backoff with jitter, or after Retry-After, never sooner than
// initialBackoff. It returns false when that would pass the delivery's deadline, which its
// first failure sets to now + maxElapsed and which nothing resets afterwards.
func nextAttempt(d *Delivery, err error, r config.Retry, now time.Time) (time.Time, bool) {
	if d.Deadline.IsZero() {
		d.Deadline = now.Add(r.MaxElapsed)
	}
	if d.backoff == nil {
		d.backoff = &backoff.ExponentialBackOff{
			InitialInterval:     r.InitialBackoff,
			RandomizationFactor: 0.5,
			Multiplier:          2,
			MaxInterval:         r.MaxBackoff,
		}
	}
	wait := d.backoff.NextBackOff()
	var ra *retryAfterError
	if errors.As(err, &ra) {
		wait = ra.wait
	}
	at := now.Add(max(wait, r.InitialBackoff))
	return at, !at.After(d.Deadline)
}
