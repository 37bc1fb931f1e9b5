package delivery

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/dynwatch/dynwatch/config"
)

// Transport hands one delivery at a time to a sink's destination: an HTTP webhook (package
// webhook), a JetStream stream or a Kafka topic (packages under stream/). Everything else —
// filters, queues, retries, fences, dead letters, payloads, CloudEvents — is the same for every
// kind, and is this package's.
type Transport interface {
	// Send makes one attempt to hand d, whose body is body, to the destination, returning once
	// the destination has acknowledged it (nil), with an error Rejected made when no later
	// attempt can succeed, ErrSuperseded when the destination holds a newer version of the
	// object, or another error to retry (RetryAfter: not before a time the destination named).
	// Workers call it concurrently, for different keys. It writes nothing once the fence
	// given to its constructor has lapsed. body is nil when it is d's as recorded, to be built
	// from d (journal.AppendBody): the transport builds it where it likes (a buffer of its own
	// it uses again).
	Send(ctx context.Context, d *Delivery, body []byte) error
	// Close releases its connections once no Send is in progress.
	Close()
}

// Transports builds the transport of a sink's configuration, whose requests write nothing once
// f has lapsed; log names the sink. The choice of transport by the configuration's kind is
// made above this package (app), as it is given to New.
type Transports func(cfg config.SinkConfig, log *slog.Logger, f Fence) (Transport, error)

// The classes of an attempt's answer (Delivery.Answer), which dynwatch_webhook_answers_total
// counts: a webhook's HTTP status by class (StatusClass); a stream's acknowledgement, or its
// refusal of the message (an error the broker answered); and, for either, no answer in time, or
// none at all (a connection that failed).
const (
	AnswerAck     = "ack"
	AnswerRefused = "refused"
	AnswerTimeout = "timeout"
	AnswerError   = "error"
)

// answerClasses are the classes a webhook's, or a stream's, answers come in.
var (
	webhookAnswers = []string{"2xx", "3xx", "4xx", "410", "429", "5xx", AnswerTimeout, AnswerError}
	streamAnswers  = []string{AnswerAck, AnswerRefused, AnswerTimeout, AnswerError}
)

// StatusClass is an HTTP status code's class as Delivery.Answer holds it: 410 and 429 apart
// (a receiver gone, one asking to slow down), the others by their first digit ("5xx").
func StatusClass(code int) string {
	if code == http.StatusGone || code == http.StatusTooManyRequests {
		return strconv.Itoa(code)
	}
	return strconv.Itoa(code/100) + "xx"
}

// Gone is err as the destination's request to stop sending to it (an HTTP 410, as Standard
// Webhooks has receivers ask): the sink is disabled until its configuration changes, and the
// delivery, and every one after it, dead-lettered with reason gone.
func Gone(err error) error { return &goneError{err} }

type goneError struct{ err error }

func (e *goneError) Error() string { return e.err.Error() }

// IsGone reports whether err, or an error it wraps, was made by Gone.
func IsGone(err error) bool {
	var g *goneError
	return errors.As(err, &g)
}

// Rejected is err as an answer no later attempt can change (an HTTP 4xx but 408 and 429, a
// message larger than the stream takes): the delivery is dead-lettered at once.
func Rejected(err error) error { return &rejectedError{err} }

// IsRejected reports whether err, or an error it wraps, was made by Rejected.
func IsRejected(err error) bool {
	var r *rejectedError
	return errors.As(err, &r)
}

// RetryAfter is err, retriable, with the wait the destination asked for before the next
// attempt (Retry-After); the next attempt is never sooner than the sink's initialBackoff.
func RetryAfter(err error, wait time.Duration) error { return &retryAfterError{err, wait} }

// ErrSuperseded is a delivery the destination need not have: it holds a newer version of the
// object already. It counts as delivered, and is counted apart.
var ErrSuperseded = errors.New("the destination holds a newer version of the object")
