package webhook

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
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
		if got := ceString(tt.in); got != tt.want {
			t.Errorf("ceString(%q) = %q; want %q", tt.in, got, tt.want)
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

// TestEachRequestCarriesItsOwnHeadersAndNoneOfTheOneBefore: every request of a sink carries
// the configured headers, the URL's credentials as basic authentication, its delivery's
// CloudEvents attributes and Standard Webhooks signature, and nothing left of the request
// before it (an attribute only that one had).
func TestEachRequestCarriesItsOwnHeadersAndNoneOfTheOneBefore(t *testing.T) {
	got := make(chan http.Header, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.Header.Clone()
	}))
	defer srv.Close()
	endpoint, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	endpoint.User = url.UserPassword("user", "pass word")
	secret := []byte("a signing key of 24 bytes or more")
	cfg := &config.Webhook{Sink: config.Sink{Name: "sink", Workers: 1, Timeout: 10 * time.Second},
		Headers: []config.Header{{Name: "x-tenant", Value: "blue"}}, Endpoint: endpoint, SigningSecret: secret}
	tr, err := newHTTP(cfg, slog.New(slog.DiscardHandler), always{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	verifier, err := standardwebhooks.NewWebhookRaw(secret)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range []Delivery{
		{Entry: journal.Entry{Event: event("a"), ID: "id-a", FilterError: "no such key: spec"}},
		{Entry: journal.Entry{Event: event("b"), ID: "id-b"}},
	} {
		body := fmt.Appendf(nil, `{"n":%d}`, i)
		if err := tr.send(t.Context(), &d, body); err != nil {
			t.Fatal(err)
		}
		h := <-got
		user, pass, _ := (&http.Request{Header: h}).BasicAuth()
		for _, c := range []struct{ name, got, want string }{
			{"X-Tenant", h.Get("X-Tenant"), "blue"},
			{"basic authentication", user + ":" + pass, "user:pass word"},
			{"Content-Type", h.Get("Content-Type"), "application/json"},
			{"Ce-Id", h.Get("Ce-Id"), d.ID},
			{"Ce-Subject", h.Get("Ce-Subject"), "ns/" + d.Event.Object.GetName()},
			{"Ce-Filtererror", h.Get("Ce-Filtererror"), ceString(d.FilterError)},
			{"Webhook-Id", h.Get("Webhook-Id"), d.ID},
		} {
			if c.got != c.want {
				t.Errorf("request %d: %s is %q; want %q", i, c.name, c.got, c.want)
			}
		}
		if _, ok := h["Ce-Filtererror"]; ok && d.FilterError == "" {
			t.Errorf("request %d carries Ce-Filtererror, which only the request before had", i)
		}
		if err := verifier.Verify(body, h); err != nil {
			t.Errorf("request %d: its signature does not verify: %v", i, err)
		}
	}
}
