package delivery

import (
	"errors"
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
