package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/egress"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Transport POSTs each delivery to a webhook, in CloudEvents' binary mode, signed as
// Standard Webhooks says when the webhook has a signing secret.
type Transport struct {
	cfg      *config.Webhook
	cluster  object.Cluster
	log      *slog.Logger
	endpoint string // the URL with its credentials redacted, for errors and logs
	// rt makes the requests (client.go), without http.Client's layer: a POST is never
	// redirected, and http.Client would copy every request's headers for a redirect it does
	// not follow.
	rt    roundTripper
	creds atomic.Pointer[credentials]
	// headers are the configured ones with their names canonical; configured is their set.
	headers    []config.Header
	configured map[string]bool
	basicAuth  string // the URL's user information as an Authorization header; "" without
	// headerMaps holds the header maps of requests whose responses are closed, for later
	// requests to fill again rather than allocate a dozen values each. (A body is not kept so:
	// the transport may read it until it closes it, which it may do after RoundTrip has
	// returned, and a body it cannot tell is in memory has its headers flushed on their own.)
	headerMaps sync.Pool
	// scratches holds what earlier requests were made of (*scratch), for later ones, when rt
	// is the client, which has written a request before it returns. At 300 updates a second
	// and two webhooks, a body of 6 KB made anew for each request was about half of what a
	// storm allocated, and so of the collector's work; the request itself, 6%.
	scratches    sync.Pool
	reuseScratch bool
}

// scratch is what a request is made of: its body, when built from its entry, the request, and
// the reader of its body.
type scratch struct {
	body []byte
	req  http.Request
	r    bytes.Reader
}

// maxPooledBody bounds the bodies kept for later requests: a large object's is let go.
const maxPooledBody = 64 << 10

// keep clears sc, but for a body no larger than maxPooledBody, and keeps it for a later
// request.
func (t *Transport) keep(sc *scratch) {
	if cap(sc.body) > maxPooledBody {
		sc.body = nil
	}
	sc.req = http.Request{}
	sc.r.Reset(nil)
	t.scratches.Put(sc)
}

// New builds the transport of a webhook, whose requests write nothing once f has lapsed.
func New(cfg *config.Webhook, cluster object.Cluster, log *slog.Logger, f delivery.Fence) (*Transport, error) {
	creds, err := newCredentials(cfg.Name, cfg.BearerToken, cfg.SigningSecrets, cfg.SigningKeys)
	if err != nil {
		return nil, err
	}
	rt, err := newRoundTripper(cfg.Endpoint, cfg.TLSConfig, cfg.Workers, f, cfg.Egress)
	if err != nil {
		return nil, fmt.Errorf("webhook %s: %w", cfg.Name, err)
	}
	t := &Transport{cfg: cfg, cluster: cluster, log: log, endpoint: config.Redacted(cfg.Endpoint), rt: rt, configured: map[string]bool{}}
	_, t.reuseScratch = rt.(*client)
	for _, h := range cfg.Headers {
		name := http.CanonicalHeaderKey(h.Name)
		t.headers = append(t.headers, config.Header{Name: name, Value: h.Value})
		t.configured[name] = true
	}
	if u := cfg.Endpoint.User; u != nil {
		password, _ := u.Password()
		t.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+password))
	}
	t.creds.Store(creds)
	if cfg.TLS.InsecureSkipVerify {
		log.Warn("TLS certificate verification is off for this sink")
	}
	return t, nil
}

// Close implements delivery.Transport: it closes the idle connections.
func (t *Transport) Close() { t.rt.CloseIdleConnections() }

// Send implements delivery.Transport: one request; after a 401, the credential files are read again
// and, if they changed, one more. A 401 after that is final.
func (t *Transport) Send(ctx context.Context, d *delivery.Delivery, body []byte) error {
	creds := t.creds.Load()
	err := t.post(ctx, creds, d, body)
	var unauthorized *unauthorizedError
	if !errors.As(err, &unauthorized) {
		return err
	}
	if fresh := t.rereadCredentials(creds); fresh != nil {
		err = t.post(ctx, fresh, d, body)
	}
	if errors.As(err, &unauthorized) {
		return delivery.Rejected(err)
	}
	return err
}

// post makes one request for d with body, within the webhook's timeout (its answer's body
// read too).
func (t *Transport) post(ctx context.Context, creds *credentials, d *delivery.Delivery, body []byte) error {
	h, _ := t.headerMaps.Get().(http.Header)
	if h == nil {
		h = make(http.Header, 16)
	}
	sc, _ := t.scratches.Get().(*scratch) // none without reuseScratch: nothing is kept then
	if sc == nil {
		sc = new(scratch)
	}
	if t.reuseScratch {
		defer t.keep(sc) // the client has written the request by the time post returns
	}
	if body == nil {
		sc.body = journal.AppendBody(sc.body[:0], d.Entry)
		body = sc.body
	}
	t.setHeaders(h, creds, *d, body, time.Now())
	sc.r.Reset(body)
	sc.req = http.Request{
		Method: http.MethodPost, URL: t.cfg.Endpoint, Host: t.cfg.Endpoint.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(&sc.r), ContentLength: int64(len(body)),
		// The client sends a request again on a new connection when the idle one it took
		// turned out closed before any of the answer was read.
		GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
	}
	req := &sc.req
	resp, err := t.rt.roundTrip(ctx, req, t.cfg.Timeout)
	if errors.Is(err, egress.ErrRefused) {
		// The address the URL led to is one the sink may not reach: final, not retried.
		return delivery.Rejected(fmt.Errorf("POST %s: %w", t.endpoint, err))
	}
	if err != nil {
		// The transport may still be writing the request: h is left to it.
		return fmt.Errorf("POST %s: %w", t.endpoint, err)
	}
	d.Answer = delivery.StatusClass(resp.StatusCode)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	t.headerMaps.Put(h) // the request is done with once its response's body is closed
	if err := classify(resp.Status, resp.StatusCode, resp.Header, time.Now()); err != nil {
		return fmt.Errorf("POST %s: %w", t.endpoint, err)
	}
	return nil
}

// setHeaders sets in h, the map of an earlier request or a new one, the configured headers,
// the bearer token (or the URL's user information), the CloudEvents binary-mode attributes
// and, with a signing secret, the Standard Webhooks signature; and removes what the request
// before had and this one has not.
func (t *Transport) setHeaders(h http.Header, creds *credentials, d delivery.Delivery, body []byte, now time.Time) {
	for _, x := range t.headers {
		put(h, x.Name, x.Value)
	}
	// Keys spelled as http.Header keeps them.
	put(h, "Content-Type", "application/json")
	put(h, "User-Agent", "dynwatch")
	switch {
	case len(creds.token) > 0:
		put(h, "Authorization", "Bearer "+string(creds.token))
	case t.basicAuth != "":
		put(h, "Authorization", t.basicAuth)
	default:
		t.unset(h, "Authorization")
	}
	var attrs [delivery.MaxAttributes]delivery.Attribute
	for _, a := range delivery.AppendCloudEvent(attrs[:0], &d, t.cluster) {
		put(h, ceHeader(a.Name), delivery.HeaderString(a.Value))
	}
	if d.FilterError == "" {
		t.unset(h, "Ce-Filtererror")
	}
	t.sign(h, creds, d.ID, body, now)
}

// put sets h's canonical key to v alone, in the value slice it has if it has one.
func put(h http.Header, key, v string) {
	if vs := h[key]; len(vs) == 1 {
		vs[0] = v
		return
	}
	h[key] = []string{v}
}

// unset removes canonical key from h, unless it is a configured header (set already).
func (t *Transport) unset(h http.Header, key string) {
	if !t.configured[key] {
		delete(h, key)
	}
}

// ceHeader is the HTTP binding's header of a CloudEvents attribute: ce- and its name, spelled
// as http.Header keeps it.
func ceHeader(name string) string {
	switch name {
	case "specversion":
		return "Ce-Specversion"
	case "id":
		return "Ce-Id"
	case "source":
		return "Ce-Source"
	case "type":
		return "Ce-Type"
	case "subject":
		return "Ce-Subject"
	case "time":
		return "Ce-Time"
	}
	return http.CanonicalHeaderKey("ce-" + name)
}
