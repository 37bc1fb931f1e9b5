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
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
)

// httpTransport POSTs each delivery to a webhook, in CloudEvents' binary mode, signed as
// Standard Webhooks says when the webhook has a signing secret.
type httpTransport struct {
	cfg      *config.Webhook
	log      *slog.Logger
	endpoint string // the URL with its credentials redacted, for errors and logs
	client   *http.Client
	creds    atomic.Pointer[credentials]
}

// credentials are a webhook's bearer token and signer, read again after a 401.
type credentials struct {
	token  config.Secret
	secret config.Secret
	signer *standardwebhooks.Webhook // nil without a signing secret
}

func newCredentials(name string, token, secret config.Secret) (*credentials, error) {
	c := &credentials{token: token, secret: secret}
	if len(secret) > 0 {
		signer, err := standardwebhooks.NewWebhookRaw(secret)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: signing secret: %w", name, err)
		}
		c.signer = signer
	}
	return c, nil
}

func newHTTP(cfg *config.Webhook, log *slog.Logger, f Fence) (*httpTransport, error) {
	creds, err := newCredentials(cfg.Name, cfg.BearerToken, cfg.SigningSecret)
	if err != nil {
		return nil, err
	}
	t := &httpTransport{cfg: cfg, log: log, endpoint: config.Redacted(cfg.Endpoint), client: newClient(cfg.TLSConfig, cfg.Workers, cfg.Timeout, f)}
	t.creds.Store(creds)
	if cfg.TLS.InsecureSkipVerify {
		log.Warn("TLS certificate verification is off for this sink")
	}
	return t, nil
}

func (t *httpTransport) close() { t.client.CloseIdleConnections() }

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

// send implements transport: one request; after a 401, the credential files are read again
// and, if they changed, one more. A 401 after that is final.
func (t *httpTransport) send(ctx context.Context, d *Delivery, body []byte) error {
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
		return &rejectedError{err}
	}
	return err
}

// rereadCredentials reads the bearer token and signing secret files again. When either
// changed, it makes the new values current and returns them; else nil.
func (t *httpTransport) rereadCredentials(cur *credentials) *credentials {
	c := t.cfg
	token, secret := cur.token, cur.secret
	var err error
	if c.BearerTokenFile != "" {
		if token, err = config.ReadCredential(c.BearerTokenFile); err != nil {
			t.log.Warn("read the bearer token file again after a 401", "err", err)
			return nil
		}
	}
	if c.SigningSecretFile != "" {
		if secret, err = config.ReadSigningSecret(c.SigningSecretFile); err != nil {
			t.log.Warn("read the signing secret file again after a 401", "err", err)
			return nil
		}
	}
	if bytes.Equal(token, cur.token) && bytes.Equal(secret, cur.secret) {
		return nil
	}
	fresh, err := newCredentials(c.Name, token, secret)
	if err != nil {
		return nil
	}
	if t.creds.CompareAndSwap(cur, fresh) {
		t.log.Info("credentials read again after a 401 differ: retrying with them")
		return fresh
	}
	return t.creds.Load()
}

// post makes one request for d with body.
func (t *httpTransport) post(ctx context.Context, creds *credentials, d *Delivery, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.cfg.Endpoint.String(), bytes.NewReader(body))
	if err != nil {
		return &rejectedError{fmt.Errorf("POST %s: %w", t.endpoint, err)}
	}
	t.setHeaders(req.Header, creds, *d, body, time.Now())
	resp, err := t.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, credentials included
		}
		return fmt.Errorf("POST %s: %w", t.endpoint, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err := classify(resp.Status, resp.StatusCode, resp.Header, time.Now()); err != nil {
		return fmt.Errorf("POST %s: %w", t.endpoint, err)
	}
	return nil
}

// setHeaders sets the configured headers, the bearer token, the CloudEvents binary-mode
// attributes and, with a signing secret, the Standard Webhooks signature.
func (t *httpTransport) setHeaders(h http.Header, creds *credentials, d Delivery, body []byte, now time.Time) {
	for _, x := range t.cfg.Headers {
		h.Set(x.Name, x.Value)
	}
	// Keys spelled as http.Header keeps them, which Set then need not make anew each time.
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "dynwatch")
	if len(creds.token) > 0 {
		h.Set("Authorization", "Bearer "+string(creds.token))
	}
	for _, a := range cloudEvent(d) {
		h.Set(ceHeader(a.name), ceString(a.value))
	}
	h.Set("Webhook-Id", d.ID)
	h.Set("Webhook-Timestamp", strconv.FormatInt(now.Unix(), 10))
	if creds.signer != nil {
		if sig, err := creds.signer.Sign(d.ID, now, body); err == nil {
			h.Set("Webhook-Signature", sig)
		}
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

// attribute is a CloudEvents context attribute as a binary-mode header carries it.
type attribute struct{ name, value string }

// cloudEvent returns d's CloudEvents attributes; the HTTP and NATS bindings carry their values
// through ceString, the Kafka binding as they are.
func cloudEvent(d Delivery) []attribute {
	e := d.Event
	subject := e.Object.GetName()
	if ns := e.Object.GetNamespace(); ns != "" {
		subject = ns + "/" + subject
	}
	out := []attribute{
		{"specversion", "1.0"},
		{"id", d.ID},
		{"source", resourcePath(e.Resource)},
		{"type", "io.dynwatch.resource." + e.Type.Lower()},
		{"subject", subject},
		{"time", e.Observed.UTC().Format(time.RFC3339Nano)},
	}
	if d.FilterError != "" {
		// An extension attribute: the filter could not decide, and filterErrors is deliver.
		out = append(out, attribute{"filtererror", d.FilterError})
	}
	return out
}

// ceString is a CloudEvents string attribute as the HTTP binding carries it in a header: space,
// '"', '%' and anything outside printable ASCII percent-encoded (UTF-8 bytes).
func ceString(v string) string {
	if !strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == '"' || r == '%' }) {
		return v
	}
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
