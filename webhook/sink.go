package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Sink delivers the events one webhook selects.
type Sink struct {
	cfg *config.Webhook
	log *slog.Logger
	j   *journal
	now func() time.Time
	sinkState
	client *http.Client
	signer *standardwebhooks.Webhook // nil without a signing secret
	dead   *deadLetters

	cancel  context.CancelFunc
	workers sync.WaitGroup
}

// sinkState is what a sink hands on to the sink that replaces it when its configuration changes.
type sinkState struct {
	queue  Queue
	m      sinkMetrics
	outbox *atomic.Int64 // outbox entries, kept by the journal
}

func newSink(cfg *config.Webhook, log *slog.Logger, j *journal, now func() time.Time, st sinkState) (*Sink, error) {
	s := &Sink{cfg: cfg, log: log.With("sink", cfg.Name), j: j, now: now, sinkState: st}
	if len(cfg.SigningSecret) > 0 {
		signer, err := standardwebhooks.NewWebhookRaw(cfg.SigningSecret)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: signing secret: %w", cfg.Name, err)
		}
		s.signer = signer
	}
	s.client = newClient(cfg.TLSConfig, cfg.Workers, cfg.Timeout)
	s.dead = newDeadLetters(cfg, s.log, st.m, newClient(cfg.TLSConfig, 1, cfg.Timeout), j)
	if cfg.TLS.InsecureSkipVerify {
		s.log.Warn("TLS certificate verification is off for this sink")
	}
	return s, nil
}

// newClient returns an HTTP client with its own transport, keeping one idle connection per
// worker. It does not follow redirects: a POST must not turn into a GET.
func newClient(tlsConfig *tls.Config, workers int, timeout time.Duration) *http.Client {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          workers,
		MaxIdleConnsPerHost:   workers,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       tlsConfig.Clone(), // nil stays nil
		// Room for the headers and a typical body, so that a request is one write.
		WriteBufferSize: 64 << 10,
	}
	return &http.Client{
		Transport:     t,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// selects reports whether the sink's filters select e.
func (s *Sink) selects(e dynamicinformer.Event) bool {
	c := s.cfg
	if len(c.EventTypes) > 0 && !slices.Contains(c.EventTypes, string(e.Type)) {
		return false
	}
	if len(c.GroupResources) > 0 && !slices.Contains(c.GroupResources, e.Resource.GroupResource()) {
		return false
	}
	if len(c.Namespaces) > 0 && !slices.Contains(c.Namespaces, e.Object.GetNamespace()) {
		return false
	}
	if !c.Labels.Empty() && !c.Labels.Matches(dynamicinformer.ObjectLabels(e.Object)) &&
		(e.OldObject == nil || !c.Labels.Matches(dynamicinformer.ObjectLabels(e.OldObject))) {
		return false
	}
	if c.Program == nil {
		return true
	}
	vars := map[string]any{
		"type":      string(e.Type),
		"object":    e.Object.Object,
		"oldObject": nil,
		"resource":  map[string]string{"group": e.Resource.Group, "version": e.Resource.Version, "resource": e.Resource.Resource},
	}
	if e.OldObject != nil {
		vars["oldObject"] = e.OldObject.Object
	}
	out, _, err := c.Program.Eval(vars)
	if err != nil {
		s.m.filterErrors.Inc()
		return false
	}
	ok, _ := out.Value().(bool)
	return ok
}

// enqueue queues d, or dead-letters it when the queue is full. It never blocks.
func (s *Sink) enqueue(d Delivery) {
	if err := s.queue.Push(d); err != nil {
		s.dead.submit(d, reasonQueueFull, 0, err)
		return
	}
	s.m.enqueued.Inc()
}

// EventID is the event's idempotency key: its object's uid and resourceVersion and its type.
// It is the same on every redelivery, and on a replay of the same change after a restart.
func EventID(e dynamicinformer.Event) string {
	return fmt.Sprintf("%s.%s.%s", e.Object.GetUID(), e.Object.GetResourceVersion(), strings.ToLower(string(e.Type)))
}

func objectKey(e dynamicinformer.Event) string {
	if uid := e.Object.GetUID(); uid != "" {
		return string(uid)
	}
	return e.Resource.String() + "/" + e.Object.GetNamespace() + "/" + e.Object.GetName()
}

// start runs the sink's workers and its dead-letter writer until stop.
func (s *Sink) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	s.dead.start()
	for range s.cfg.Workers {
		s.workers.Go(func() {
			for {
				d, err := s.queue.Pop(ctx)
				if err != nil {
					return
				}
				if !s.deliver(ctx, d) {
					s.queue.Return(d) // stopping
					return
				}
				s.queue.Done(d)
			}
		})
	}
}

// stop stops the workers; a delivery they were making goes back to the queue. With a reason,
// what is left in the queue is then dead-lettered with it; without, it stays for whoever
// takes the queue over, or in the outbox for the next start.
func (s *Sink) stop(reason string) {
	s.cancel()
	s.workers.Wait()
	if reason != "" {
		left := s.queue.Drain()
		for _, d := range left {
			s.dead.submit(d, reason, 0, errors.New("dynwatch stopped delivering to this sink"))
		}
		if len(left) > 0 {
			s.log.Warn("undelivered events dead-lettered", "events", len(left), "reason", reason)
		}
	}
	s.dead.close()
}

// deliver makes one delivery, retrying as configured until the delivery's deadline; what fails
// goes to the dead letters. It returns false when ctx ended first: the delivery is not finished.
func (s *Sink) deliver(ctx context.Context, d Delivery) bool {
	if d.Body == nil {
		d.Body = Payload(d.Event)
	}
	budget := s.cfg.Retry.MaxElapsed
	if !d.Deadline.IsZero() {
		if budget = d.Deadline.Sub(s.now()); budget <= 0 {
			s.dead.submit(d, reasonRetriesExhausted, 0, errors.New("the retry deadline passed while dynwatch was stopped"))
			return true
		}
	}
	attempts := 0
	policy := &backoff.ExponentialBackOff{
		InitialInterval:     s.cfg.Retry.InitialBackoff,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         s.cfg.Retry.MaxBackoff,
	}
	start := s.now()
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		s.m.attempts.Inc()
		if attempts > 1 {
			s.m.retries.Inc()
		}
		return struct{}{}, s.send(ctx, d, d.Body)
	}, backoff.WithBackOff(policy), backoff.WithMaxElapsedTime(budget),
		backoff.WithNotify(func(err error, wait time.Duration) {
			if d.Deadline.IsZero() && d.Seq != 0 {
				// Retrying has begun: a restart must not give the delivery a new budget.
				d.Deadline = start.Add(budget)
				s.j.submit(op{kind: opDeadline, sink: s.cfg.Name, seq: d.Seq, deadline: d.Deadline})
			}
			s.log.Debug("delivery failed, retrying", "id", d.ID, "err", err, "wait", wait)
		}))
	var rejected *rejectedError
	switch {
	case err == nil:
		s.m.delivered.Inc()
		s.m.age.Observe(s.now().Sub(d.Event.Observed).Seconds())
		s.j.ack(s.cfg.Name, d.Seq)
	case ctx.Err() != nil:
		return false
	case errors.As(err, &rejected):
		s.dead.submit(d, reasonRejected, attempts, err)
	default:
		s.dead.submit(d, reasonRetriesExhausted, attempts, err)
	}
	return true
}

// rejectedError is an answer that retrying cannot change.
type rejectedError struct{ err error }

func (e *rejectedError) Error() string { return e.err.Error() }

// send makes one attempt. It returns nil on 2xx, a backoff.Permanent rejectedError on an
// answer not worth retrying, and a retriable error otherwise.
func (s *Sink) send(ctx context.Context, d Delivery, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.Endpoint.String(), bytes.NewReader(body))
	if err != nil {
		return backoff.Permanent(&rejectedError{err})
	}
	s.setHeaders(req.Header, d, body)
	start := time.Now()
	resp, err := s.client.Do(req)
	s.m.requestDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return fmt.Errorf("POST %s: %w", s.cfg.Endpoint.Redacted(), err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		err := fmt.Errorf("POST %s: %s", s.cfg.Endpoint.Redacted(), resp.Status)
		if wait, ok := retryAfter(resp.Header.Get("Retry-After"), s.now()); ok {
			return fmt.Errorf("%w (Retry-After %s)", &backoff.RetryAfterError{Duration: wait}, wait)
		}
		return err
	default:
		return backoff.Permanent(&rejectedError{fmt.Errorf("POST %s: %s", s.cfg.Endpoint.Redacted(), resp.Status)})
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

// setHeaders sets the configured headers, the bearer token, the CloudEvents binary-mode
// attributes and, with a signing secret, the Standard Webhooks signature.
func (s *Sink) setHeaders(h http.Header, d Delivery, body []byte) {
	for _, x := range s.cfg.Headers {
		h.Set(x.Name, x.Value)
	}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "dynwatch")
	if len(s.cfg.BearerToken) > 0 {
		h.Set("Authorization", "Bearer "+string(s.cfg.BearerToken))
	}
	e := d.Event
	subject := e.Object.GetName()
	if ns := e.Object.GetNamespace(); ns != "" {
		subject = ns + "/" + subject
	}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", d.ID)
	h.Set("ce-source", resourcePath(e.Resource))
	h.Set("ce-type", "io.dynwatch.resource."+strings.ToLower(string(e.Type)))
	h.Set("ce-subject", subject)
	h.Set("ce-time", e.Observed.UTC().Format(time.RFC3339Nano))
	now := s.now()
	h.Set("webhook-id", d.ID)
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	if s.signer != nil {
		sig, err := s.signer.Sign(d.ID, now, body)
		if err == nil {
			h.Set("webhook-signature", sig)
		}
	}
}

// resourcePath is the resource's collection path in the Kubernetes API, used as ce-source.
func resourcePath(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return "/api/" + gvr.Version + "/" + gvr.Resource
	}
	return "/apis/" + gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}

// Payload is the request body for an event:
// {"type","resource":{"group","version","resource"},"object","oldObject"}.
func Payload(e dynamicinformer.Event) []byte {
	return appendPayload(make([]byte, 0, 2048), e, nil, nil)
}

// appendPayload appends e's request body to buf. objJSON and oldJSON are e.Object and
// e.OldObject already encoded, or nil.
func appendPayload(buf []byte, e dynamicinformer.Event, objJSON, oldJSON []byte) []byte {
	buf = append(buf, `{"type":`...)
	buf = dynamicinformer.AppendString(buf, string(e.Type))
	buf = append(buf, `,"resource":{"group":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Group)
	buf = append(buf, `,"version":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Version)
	buf = append(buf, `,"resource":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Resource)
	buf = append(buf, `},"object":`...)
	if objJSON != nil {
		buf = append(buf, objJSON...)
	} else {
		buf = dynamicinformer.AppendJSON(buf, e.Object.Object)
	}
	if e.OldObject != nil {
		buf = append(buf, `,"oldObject":`...)
		if oldJSON != nil {
			buf = append(buf, oldJSON...)
		} else {
			buf = dynamicinformer.AppendJSON(buf, e.OldObject.Object)
		}
	}
	return append(buf, '}')
}
