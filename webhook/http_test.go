package webhook

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// TestACloudEventsStringIsPercentEncodedInItsHeaderAsTheHTTPBindingSays: space, '"', '%' and
// every byte outside printable ASCII are percent-encoded (UTF-8 bytes); the rest is kept.
func TestACloudEventsStringIsPercentEncodedInItsHeaderAsTheHTTPBindingSays(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"ns/cm-1", "ns/cm-1"},
		{"", ""},
		{"a b", "a%20b"},
		{`say "hi"`, "say%20%22hi%22"},
		{"100%", "100%25"},
		{"café", "caf%C3%A9"},
		{"tab\there", "tab%09here"},
		{"del\x7f", "del%7F"},
	} {
		if got := delivery.HeaderString(tt.in); got != tt.want {
			t.Errorf("delivery.HeaderString(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestEveryAttributeHeaderIsSpelledAsHTTPHeaderKeepsIt: the headers spelled out for the
// attributes dynwatch sends are the canonical ones, as any other is made.
func TestEveryAttributeHeaderIsSpelledAsHTTPHeaderKeepsIt(t *testing.T) {
	for _, name := range []string{"specversion", "id", "source", "type", "subject", "time", "filtererror"} {
		if got, want := ceHeader(name), textproto.CanonicalMIMEHeaderKey("ce-"+name); got != want {
			t.Errorf("ceHeader(%q) = %q; want %q", name, got, want)
		}
	}
}

// testCluster is the cluster the tests' events come from.
var testCluster = object.Cluster{ID: "test-cluster", Name: "Test Cluster", InKeys: true}

// TestEachRequestCarriesItsOwnHeadersAndNoneOfTheOneBefore: every request of a sink carries
// the configured headers, the URL's credentials as basic authentication, its delivery's
// CloudEvents attributes and Standard Webhooks signature, and nothing left of the request
// before it (an attribute only that one had); and its own body, whether it was given or built
// from its entry.
func TestEachRequestCarriesItsOwnHeadersAndNoneOfTheOneBefore(t *testing.T) {
	type request struct {
		header http.Header
		body   []byte
	}
	got := make(chan request, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- request{r.Header.Clone(), body}
	}))
	defer srv.Close()
	endpoint, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	endpoint.User = url.UserPassword("user", "pass word")
	secret := []byte("a signing key of 24 bytes or more")
	cfg := &config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: 10 * time.Second},
		Headers: []config.Header{{Name: "x-tenant", Value: "blue"}}, Endpoint: endpoint, SigningSecrets: []config.Secret{secret}}
	tr, err := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	verifier, err := standardwebhooks.NewWebhookRaw(secret)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range []delivery.Delivery{
		{Entry: journal.Entry{Event: event("a"), ID: "id-a", FilterError: "no such key: spec"}},
		{Entry: journal.Entry{Event: event("b"), ID: "id-b"}},
		{Entry: journal.Entry{Event: event("c"), ID: "id-c"}},
	} {
		// The first two are given their bodies; the transport builds the last from its entry.
		body := fmt.Appendf(nil, `{"n":%d,"padding":%q}`, i, strings.Repeat("x", 100*(2-i)))
		want := body
		if i == 2 {
			body, want = nil, journal.AppendBody(nil, d.Entry)
		}
		if err := tr.Send(t.Context(), &d, body); err != nil {
			t.Fatal(err)
		}
		r := <-got
		h := r.header
		if !bytes.Equal(r.body, want) {
			t.Errorf("request %d: the body is\n%s\nwant\n%s", i, r.body, want)
		}
		user, pass, _ := (&http.Request{Header: h}).BasicAuth()
		for _, c := range []struct{ name, got, want string }{
			{"X-Tenant", h.Get("X-Tenant"), "blue"},
			{"basic authentication", user + ":" + pass, "user:pass word"},
			{"Content-Type", h.Get("Content-Type"), "application/json"},
			{"Ce-Id", h.Get("Ce-Id"), d.ID},
			{"Ce-Subject", h.Get("Ce-Subject"), "ns/" + d.Event.Object.GetName()},
			{"Ce-Filtererror", h.Get("Ce-Filtererror"), delivery.HeaderString(d.FilterError)},
			{"Ce-Cluster", h.Get("Ce-Cluster"), "test-cluster"},
			{"Ce-Clustername", h.Get("Ce-Clustername"), "Test%20Cluster"},
			{"Webhook-Id", h.Get("Webhook-Id"), d.ID},
		} {
			if c.got != c.want {
				t.Errorf("request %d: %s is %q; want %q", i, c.name, c.got, c.want)
			}
		}
		if _, ok := h["Ce-Filtererror"]; ok && d.FilterError == "" {
			t.Errorf("request %d carries Ce-Filtererror, which only the request before had", i)
		}
		if err := verifier.Verify(want, h); err != nil {
			t.Errorf("request %d: its signature does not verify: %v", i, err)
		}
	}
}

// TestARequestIsOneWrite: a request's headers and body are written through the connection's
// buffered writer in one write. (With net/http's transport, a body it could not tell was in
// memory had its headers flushed in a write of their own first, and was then copied through a
// buffer of its size made for every request.)
func TestARequestIsOneWrite(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	endpoint, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(&config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: 10 * time.Second}, Endpoint: endpoint},
		testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var writes atomic.Int64
	c := tr.rt.(*client)
	dial := c.dial
	c.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		return countingConn{c, &writes}, err
	}
	d := delivery.Delivery{Entry: journal.Entry{Event: event("a"), ID: "id-a"}}
	for _, body := range [][]byte{nil, fmt.Appendf(nil, `{"object":{"data":{"v":%q}}}`, strings.Repeat("x", 24<<10))} {
		writes.Store(0)
		const requests = 20
		for range requests {
			if err := tr.Send(t.Context(), &d, body); err != nil {
				t.Fatal(err)
			}
		}
		if n := writes.Load(); n != requests {
			t.Errorf("%d requests of a %d-byte body took %d writes; want one each", requests, len(body), n)
		}
	}
}

// countingConn counts the writes made to its connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// event is an ADDED of configmap ns/name at resourceVersion 1.
func event(name string) object.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": "ns", "name": name, "uid": "uid-" + name, "resourceVersion": "1"}}}
	return object.Event{Type: object.Added, Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Object: object.New(u), Observed: time.Now()}
}

// TestHTTPSSinksVerifyAgainstTheirCA: a webhook with tls.caFile reaches a receiver whose
// certificate that CA signed, and one without it does not.
func TestHTTPSSinksVerifyAgainstTheirCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tls  string
		fail bool
	}{{"{caFile: " + caFile + "}", false}, {"{}", true}} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		yaml := fmt.Sprintf("resources: [{version: v1, resource: configmaps}]\nwebhooks: [{name: secure, url: %s, tls: %s}]\n", srv.URL, c.tls)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := New(cfg.Sinks()[0].(*config.Webhook), testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
		if err != nil {
			t.Fatal(err)
		}
		err = tr.Send(t.Context(), &delivery.Delivery{Entry: journal.Entry{Event: event("c"), ID: "id-c"}}, []byte(`{}`))
		tr.Close()
		if (err != nil) != c.fail {
			t.Errorf("tls %s: %v; want an error: %t", c.tls, err, c.fail)
		}
	}
}
