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
	"time"

	"github.com/cenkalti/backoff/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Sink delivers the events one webhook selects.
type Sink struct {
	cfg    *config.Webhook
	log    *slog.Logger
	queue  Queue
	client *http.Client
	signer *standardwebhooks.Webhook // nil without a signing secret
	dead   *deadLetters
	m      sinkMetrics
	now    func() time.Time
}

func newSink(cfg *config.Webhook, log *slog.Logger, queue Queue, m sinkMetrics, now func() time.Time) (*Sink, error) {
	s := &Sink{cfg: cfg, log: log.With("sink", cfg.Name), queue: queue, m: m, now: now}
	if len(cfg.SigningSecret) > 0 {
		signer, err := standardwebhooks.NewWebhookRaw(cfg.SigningSecret)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: signing secret: %w", cfg.Name, err)
		}
		s.signer = signer
	}
	s.client = newClient(cfg.TLSConfig, cfg.Workers, cfg.Timeout)
	s.dead = newDeadLetters(cfg, s.log, m, newClient(cfg.TLSConfig, 1, cfg.Timeout))
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

// enqueue queues e, or dead-letters it when the queue is full. It never blocks.
func (s *Sink) enqueue(e dynamicinformer.Event) {
	d := Delivery{Event: e, ID: EventID(e), Key: objectKey(e), Enqueued: s.now()}
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

// run runs the workers until ctx ends, then dead-letters what is left.
func (s *Sink) run(ctx context.Context) {
	writerDone := make(chan struct{})
	go func() { s.dead.run(); close(writerDone) }()
	done := make(chan struct{})
	for range s.cfg.Workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				d, err := s.queue.Pop(ctx)
				if err != nil {
					return
				}
				s.deliver(ctx, d)
				s.queue.Done(d)
			}
		}()
	}
	for range s.cfg.Workers {
		<-done
	}
	left := s.queue.Drain()
	for _, d := range left {
		s.dead.submit(d, reasonShutdown, 0, errors.New("dynwatch stopped before delivering"))
	}
	if len(left) > 0 {
		s.log.Warn("undelivered events dead-lettered at shutdown", "events", len(left))
	}
	s.dead.close()
	<-writerDone
}

// deliver makes one delivery, retrying as configured; what fails goes to the dead letters.
func (s *Sink) deliver(ctx context.Context, d Delivery) {
	body := Payload(d.Event)
	attempts := 0
	policy := &backoff.ExponentialBackOff{
		InitialInterval:     s.cfg.Retry.InitialBackoff,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         s.cfg.Retry.MaxBackoff,
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		s.m.attempts.Inc()
		if attempts > 1 {
			s.m.retries.Inc()
		}
		return struct{}{}, s.send(ctx, d, body)
	}, backoff.WithBackOff(policy), backoff.WithMaxElapsedTime(s.cfg.Retry.MaxElapsed),
		backoff.WithNotify(func(err error, wait time.Duration) {
			s.log.Debug("delivery failed, retrying", "id", d.ID, "err", err, "wait", wait)
		}))
	var rejected *rejectedError
	switch {
	case err == nil:
		s.m.delivered.Inc()
		s.m.age.Observe(s.now().Sub(d.Event.Observed).Seconds())
	case ctx.Err() != nil:
		s.dead.submit(d, reasonShutdown, attempts, err)
	case errors.As(err, &rejected):
		s.dead.submit(d, reasonRejected, attempts, err)
	default:
		s.dead.submit(d, reasonRetriesExhausted, attempts, err)
	}
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
	buf := make([]byte, 0, 2048)
	buf = append(buf, `{"type":`...)
	buf = dynamicinformer.AppendString(buf, string(e.Type))
	buf = append(buf, `,"resource":{"group":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Group)
	buf = append(buf, `,"version":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Version)
	buf = append(buf, `,"resource":`...)
	buf = dynamicinformer.AppendString(buf, e.Resource.Resource)
	buf = append(buf, `},"object":`...)
	buf = dynamicinformer.AppendJSON(buf, e.Object.Object)
	if e.OldObject != nil {
		buf = append(buf, `,"oldObject":`...)
		buf = dynamicinformer.AppendJSON(buf, e.OldObject.Object)
	}
	return append(buf, '}')
}
