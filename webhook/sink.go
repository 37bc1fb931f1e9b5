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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cel.dev/cel-go/cel"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Sink delivers the events one webhook selects. It lives as long as its webhook's name is
// configured: a reload that changes the webhook swaps its settings and restarts its workers,
// and keeps its queue, its outbox window, its dead letters and its metrics.
type Sink struct {
	name  string
	log   *slog.Logger
	j     *journal.Journal
	now   func() time.Time
	queue *Queue
	m     sinkMetrics
	dead  *deadLetters
	fence Fence
	cur   atomic.Pointer[settings]

	// win is the queue's window over the outbox, with a state store: when the queue is full,
	// later deliveries stay in the outbox only (spilled) and are read back in order, from
	// sequence next on, as the queue empties. last is the highest sequence queued.
	win struct {
		sync.Mutex
		spilled    bool
		next, last uint64
	}

	// filterLog lets through at most one log line a second of the filter's errors.
	filterLog rate.Sometimes

	run     sync.Mutex // guards cancel and workers
	cancel  context.CancelFunc
	workers sync.WaitGroup

	stopReplay context.CancelFunc // ends its initialState replay; guarded by the Dispatcher's life
}

// settings is what a webhook's configuration decides, replaced whole when it changes.
type settings struct {
	cfg      *config.Webhook
	endpoint string // the URL with its credentials redacted, for errors and logs
	client   *http.Client
	token    config.Secret
	signer   *standardwebhooks.Webhook // nil without a signing secret
}

func newSettings(cfg *config.Webhook, token, signingSecret config.Secret, f Fence) (*settings, error) {
	st := &settings{cfg: cfg, endpoint: config.Redacted(cfg.Endpoint), token: token}
	if len(signingSecret) > 0 {
		signer, err := standardwebhooks.NewWebhookRaw(signingSecret)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: signing secret: %w", cfg.Name, err)
		}
		st.signer = signer
	}
	st.client = newClient(cfg.TLSConfig, cfg.Workers, cfg.Timeout, f)
	return st, nil
}

func newSink(cfg *config.Webhook, log *slog.Logger, j *journal.Journal, now func() time.Time, m *metrics, f Fence) (*Sink, error) {
	st, err := newSettings(cfg, cfg.BearerToken, cfg.SigningSecret, f)
	if err != nil {
		return nil, err
	}
	s := &Sink{name: cfg.Name, log: log.With("sink", cfg.Name), j: j, now: now, queue: NewQueue(cfg.QueueSize), fence: f,
		filterLog: rate.Sometimes{Interval: time.Second}}
	s.m = m.forSink(s.name, s.queue)
	s.cur.Store(st)
	s.dead = newDeadLetters(s.name, s.log, s.m, j, cfg)
	if cfg.TLS.InsecureSkipVerify {
		s.log.Warn("TLS certificate verification is off for this sink")
	}
	return s, nil
}

// newClient returns an HTTP client with its own transport, keeping one idle connection per
// worker. It does not follow redirects: a POST must not turn into a GET. Its connections
// write nothing once the fence has lapsed.
func newClient(tlsConfig *tls.Config, workers int, timeout time.Duration, f Fence) *http.Client {
	dial := fencedDialer(f, (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dial,
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

func (s *Sink) cfg() *config.Webhook { return s.cur.Load().cfg }

// Name implements journal.Target.
func (s *Sink) Name() string { return s.name }

// InitialState implements journal.Target: the webhook's initialState.
func (s *Sink) InitialState() bool { return s.cfg().InitialState }

// Selects implements journal.Target: it reports whether the sink's filters select e. An event
// its filter cannot decide on is counted, logged (at most a line a second, naming the object,
// never its content) and, as filterErrors says, selected with the error (deadLetter, deliver)
// or left out (drop).
func (s *Sink) Selects(e dynamicinformer.Event) (bool, error) {
	c := s.cfg()
	if len(c.EventTypes) > 0 && !slices.Contains(c.EventTypes, string(e.Type)) {
		return false, nil
	}
	if len(c.GroupResources) > 0 && !slices.Contains(c.GroupResources, e.Resource.GroupResource()) {
		return false, nil
	}
	if len(c.Namespaces) > 0 && !slices.Contains(c.Namespaces, e.Object.GetNamespace()) {
		return false, nil
	}
	if !c.Labels.Empty() && !c.Labels.Matches(e.Object.Labels()) &&
		(e.OldObject == nil || !c.Labels.Matches(e.OldObject.Labels())) {
		return false, nil
	}
	if c.Program == nil {
		return true, nil
	}
	ok, err := evaluate(c.Program, e)
	if err == nil {
		return ok, nil
	}
	s.m.filterErrors.Inc()
	s.filterLog.Do(func() {
		s.log.Warn("the filter could not decide on an event", "resource", object.ResourceName(e.Resource), "namespace", e.Object.GetNamespace(),
			"name", e.Object.GetName(), "type", string(e.Type), "filterErrors", string(c.FilterErrors), "err", err)
	})
	return c.FilterErrors != config.FilterErrorsDrop, fmt.Errorf("filter: %w", err)
}

// evaluate runs a filter on e, its objects decoded from the JSON the cache keeps.
func evaluate(p cel.Program, e dynamicinformer.Event) (bool, error) {
	obj, err := e.Object.Decode()
	if err != nil {
		return false, err
	}
	vars := map[string]any{
		"type":      string(e.Type),
		"object":    obj.Object,
		"oldObject": nil,
		"resource":  map[string]string{"group": e.Resource.Group, "version": e.Resource.Version, "resource": e.Resource.Resource},
	}
	if e.OldObject != nil {
		old, err := e.OldObject.Decode()
		if err != nil {
			return false, err
		}
		vars["oldObject"] = old.Object
	}
	out, _, err := p.Eval(vars)
	if err != nil {
		return false, err
	}
	ok, isBool := out.Value().(bool)
	if !isBool {
		return false, fmt.Errorf("the filter returned %s, not a bool", out.Type().TypeName())
	}
	return ok, nil
}

// Queue implements journal.Target: it queues e. Without a state store (e.Seq 0) a full queue
// dead-letters it. With one, e is already in the outbox: when the queue is full, or the
// replica is not the leader, it stays there only, and so does every later entry, until refill
// reads them back in order.
func (s *Sink) Queue(e journal.Entry) {
	d := Delivery{Entry: e}
	if d.Seq == 0 {
		if err := s.queue.Push(d); err != nil {
			s.dead.submit(d, reasonQueueFull, err)
			return
		}
		s.m.enqueued.Inc()
		return
	}
	s.win.Lock()
	defer s.win.Unlock()
	if d.Seq <= s.win.last || s.win.spilled {
		return // already read back from the outbox, or to be
	}
	if s.queue.Push(d) != nil {
		s.win.spilled, s.win.next = true, d.Seq
		return
	}
	s.win.last = d.Seq
	s.m.enqueued.Inc()
}

// spill marks the whole outbox as not yet queued: the restore at start, and while the replica
// does not lead.
func (s *Sink) spill() {
	s.win.Lock()
	s.win.spilled, s.win.next = true, 0
	s.win.Unlock()
}

// refill reads spilled outbox entries back into the queue, oldest first, once the queue has
// room for half its capacity (or at once when force is set).
func (s *Sink) refill(force bool) {
	s.win.Lock()
	defer s.win.Unlock()
	if !s.win.spilled {
		return
	}
	room := s.queue.Room()
	if room == 0 || !force && room < s.cfg().QueueSize/2 {
		return
	}
	next, end, err := s.j.ReadOutbox(s.name, s.win.next, room, func(e journal.Entry) bool {
		if s.queue.Push(Delivery{Entry: e}) != nil { // the capacity shrank under us: read it again later
			return false
		}
		s.win.last = e.Seq
		s.m.enqueued.Inc()
		return true
	})
	s.win.next, s.win.spilled = next, !end // after an error, what was read stays read
	if err != nil {
		s.log.Error("read the outbox back into the queue", "err", err)
	}
}

func (s *Sink) startWorkers(ctx context.Context) {
	s.run.Lock()
	defer s.run.Unlock()
	ctx, s.cancel = context.WithCancel(ctx)
	for range s.cfg().Workers {
		s.workers.Go(func() { s.work(ctx) })
	}
}

// stopWorkers stops the workers; a delivery in progress goes back to the head of the queue.
func (s *Sink) stopWorkers() {
	s.run.Lock()
	defer s.run.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
	s.workers.Wait()
}

// reconfigure puts new settings of the same webhook into effect: the workers stop, the
// settings are swapped, and the workers start again under ctx (nil: not running).
func (s *Sink) reconfigure(ctx context.Context, st *settings) {
	s.stopWorkers()
	old := s.cur.Swap(st)
	old.client.CloseIdleConnections()
	s.queue.SetCapacity(st.cfg.QueueSize)
	s.dead.setTarget(st.cfg)
	if ctx != nil {
		s.startWorkers(ctx)
		s.refill(false)
	}
}

// deadLetterQueue dead-letters every delivery left in the queue with reason: without a store,
// there is nowhere else for them to go.
func (s *Sink) deadLetterQueue(reason string) {
	left := s.queue.Drain()
	for _, d := range left {
		s.dead.submit(d, reason, errors.New("dynwatch stopped delivering to this sink"))
	}
	if len(left) > 0 {
		s.log.Warn("undelivered events dead-lettered", "events", len(left), "reason", reason)
	}
}

// work delivers until ctx ends. A failed attempt that may be retried goes back to the queue
// with the time of its next attempt, so the worker moves on to other objects. Under leader
// election a request is made only while the fence holds, and is cut short when it lapses.
func (s *Sink) work(ctx context.Context) {
	for {
		d, err := s.queue.Pop(ctx)
		if err != nil {
			return
		}
		sendCtx, cancel, held := s.fence.Bound(ctx)
		if !held {
			// The lease may have passed to another replica: deliver nothing until it is renewed.
			cancel()
			s.queue.Return(d)
			s.fence.Wait(ctx)
			continue
		}
		cut := s.deliver(sendCtx, &d)
		cancel()
		if cut {
			s.queue.Return(d) // stopped, or the lease lapsed: delivered later, here or by the next leader
			if ctx.Err() != nil {
				return
			}
			continue
		}
		s.refill(false)
	}
}

// deliver makes d, fails it for good (dead letter) or queues it to retry. It reports whether
// ctx cut it short, in which case d is still to be made and the caller returns it to the queue.
func (s *Sink) deliver(ctx context.Context, d *Delivery) (cut bool) {
	if d.FilterError != "" && s.cfg().FilterErrors != config.FilterErrorsDeliver {
		// Recorded under deadLetter (or drop, since a reload): the filter decided nothing.
		s.dead.submit(*d, reasonFilterError, errors.New(d.FilterError))
		s.queue.Done(*d)
		return false
	}
	if !d.Deadline.IsZero() && s.now().After(d.Deadline) {
		s.dead.submit(*d, reasonRetriesExhausted, errors.New("the retry deadline passed while dynwatch was stopped"))
		s.queue.Done(*d)
		return false
	}
	st := s.cur.Load()
	err := s.attempt(ctx, st, d)
	var rejected *rejectedError
	switch {
	case err == nil:
		s.m.delivered.Inc()
		s.m.age.Observe(s.now().Sub(d.Event.Observed).Seconds())
		s.j.Ack(s.name, d.Seq)
		s.queue.Done(*d)
	case ctx.Err() != nil || s.fence.Lapsed():
		return true // stopped, or no longer certainly the leader: not a failed attempt
	case errors.As(err, &rejected):
		s.dead.submit(*d, reasonRejected, err)
		s.queue.Done(*d)
	default:
		firstFailure := d.Deadline.IsZero()
		at, ok := nextAttempt(d, err, st.cfg.Retry, s.now())
		if !ok {
			s.dead.submit(*d, reasonRetriesExhausted, err)
			s.queue.Done(*d)
			break
		}
		if firstFailure {
			// Retrying has begun: neither a reload nor a restart gives it a new budget.
			s.j.SetDeadline(s.name, d.Seq, d.Deadline)
		}
		s.log.Debug("delivery failed, retrying", "id", d.ID, "err", err, "at", at)
		s.queue.Retry(*d, at)
	}
	return false
}

// attempt makes one request for d; after a 401 it reads the credential files again and, if
// they changed, makes one more. It returns nil on 2xx, a rejectedError when retrying cannot
// help, or a retriable error.
func (s *Sink) attempt(ctx context.Context, st *settings, d *Delivery) error {
	if d.Body == nil {
		d.Body = journal.Payload(d.Event)
	}
	body, err := shape(d.Body, st.cfg.Payload)
	if err != nil {
		return &rejectedError{err} // the recorded body is damaged: no attempt can send it
	}
	err = s.send(ctx, st, d, body)
	var unauthorized *unauthorizedError
	if !errors.As(err, &unauthorized) {
		return err
	}
	if fresh := s.rereadCredentials(st); fresh != nil {
		if body, err = shape(d.Body, fresh.cfg.Payload); err != nil { // a reload may have changed it meanwhile
			return &rejectedError{err}
		}
		err = s.send(ctx, fresh, d, body)
	}
	if errors.As(err, &unauthorized) {
		return &rejectedError{err}
	}
	return err
}

// rereadCredentials reads the bearer token and signing secret files again. When either
// changed, it makes the new values current and returns the new settings; else nil.
func (s *Sink) rereadCredentials(st *settings) *settings {
	c := st.cfg
	token, secret := st.token, config.Secret(nil)
	var err error
	if c.BearerTokenFile != "" {
		if token, err = config.ReadBearerToken(c.BearerTokenFile); err != nil {
			s.log.Warn("read the bearer token file again after a 401", "err", err)
			return nil
		}
	}
	if c.SigningSecretFile != "" {
		if secret, err = config.ReadSigningSecret(c.SigningSecretFile); err != nil {
			s.log.Warn("read the signing secret file again after a 401", "err", err)
			return nil
		}
	}
	if bytes.Equal(token, st.token) && (c.SigningSecretFile == "" || bytes.Equal(secret, c.SigningSecret)) {
		return nil
	}
	fresh, err := newSettings(c, token, secret, s.fence)
	if err != nil {
		return nil
	}
	fresh.client = st.client
	if s.cur.CompareAndSwap(st, fresh) {
		s.log.Info("credentials read again after a 401 differ: retrying with them")
		return fresh
	}
	return s.cur.Load()
}

// send makes one request for d with body.
func (s *Sink) send(ctx context.Context, st *settings, d *Delivery, body []byte) error {
	d.Attempts++
	s.m.attempts.Inc()
	if d.Attempts > 1 {
		s.m.retries.Inc()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.cfg.Endpoint.String(), bytes.NewReader(body))
	if err != nil {
		return &rejectedError{fmt.Errorf("POST %s: %w", st.endpoint, err)}
	}
	st.setHeaders(req.Header, *d, body, s.now())
	start := time.Now()
	resp, err := st.client.Do(req)
	s.m.requestDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, credentials included
		}
		return fmt.Errorf("POST %s: %w", st.endpoint, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err := classify(resp.Status, resp.StatusCode, resp.Header, s.now()); err != nil {
		return fmt.Errorf("POST %s: %w", st.endpoint, err)
	}
	return nil
}

// setHeaders sets the configured headers, the bearer token, the CloudEvents binary-mode
// attributes and, with a signing secret, the Standard Webhooks signature.
func (st *settings) setHeaders(h http.Header, d Delivery, body []byte, now time.Time) {
	for _, x := range st.cfg.Headers {
		h.Set(x.Name, x.Value)
	}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "dynwatch")
	if len(st.token) > 0 {
		h.Set("Authorization", "Bearer "+string(st.token))
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
	if d.FilterError != "" {
		// A CloudEvents extension attribute: the filter could not decide, and filterErrors
		// is deliver.
		h.Set("ce-filtererror", ceString(d.FilterError))
	}
	h.Set("webhook-id", d.ID)
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	if st.signer != nil {
		if sig, err := st.signer.Sign(d.ID, now, body); err == nil {
			h.Set("webhook-signature", sig)
		}
	}
}

// ceString is a CloudEvents string attribute as the HTTP binding carries it in a header: space,
// '"', '%' and anything outside printable ASCII percent-encoded (UTF-8 bytes).
func ceString(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// resourcePath is the resource's collection path in the Kubernetes API, used as ce-source.
func resourcePath(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return "/api/" + gvr.Version + "/" + gvr.Resource
	}
	return "/apis/" + gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}
