package webhook

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/dynwatch/dynwatch/config"
)

// verifyV1a reports whether one of the v1a signatures of h verifies with pub, as a receiver
// holding only the public key verifies it.
func verifyV1a(h http.Header, body []byte, pub ed25519.PublicKey) bool {
	msg := signedContent(h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), body)
	for _, s := range strings.Fields(h.Get("Webhook-Signature")) {
		sig, ok := strings.CutPrefix(s, "v1a,")
		if !ok {
			continue
		}
		if b, err := base64.StdEncoding.DecodeString(sig); err == nil && ed25519.Verify(pub, msg, b) {
			return true
		}
	}
	return false
}

// TestEverySecretAndKeySignsAndEachVerifiesAlone: with two HMAC secrets and two Ed25519 keys,
// a request carries four signatures, and a receiver holding any one secret, or any one public
// key, verifies it; one holding another key does not.
func TestEverySecretAndKeySignsAndEachVerifiesAlone(t *testing.T) {
	secrets := []config.Secret{[]byte("a first signing key of 24 bytes"), []byte("a second signing key of 24 bytes")}
	var keys []config.Secret
	var pubs []ed25519.PublicKey
	for range 3 {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys, pubs = append(keys, config.Secret(priv)), append(pubs, pub)
	}
	cfg := &config.Webhook{Sink: config.Sink{Name: "s"}, SigningSecrets: secrets, SigningKeys: keys[:2]}
	tr := &Transport{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	creds, err := newCredentials("s", nil, secrets, keys[:2])
	if err != nil {
		t.Fatal(err)
	}
	h, body := http.Header{}, []byte(`{"type":"ADDED"}`)
	tr.sign(h, creds, "id-1", body, time.Now())
	if n := len(strings.Fields(h.Get("Webhook-Signature"))); n != 4 {
		t.Fatalf("%d signatures in %q, want 4", n, h.Get("Webhook-Signature"))
	}
	for i, s := range secrets {
		v, err := standardwebhooks.NewWebhookRaw(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Verify(body, h); err != nil {
			t.Errorf("secret %d does not verify: %v", i, err)
		}
	}
	for i, pub := range pubs {
		if got, want := verifyV1a(h, body, pub), i < 2; got != want {
			t.Errorf("public key %d verifies: %v, want %v", i, got, want)
		}
	}
	if verifyV1a(h, []byte(`{"type":"DELETED"}`), pubs[0]) {
		t.Error("a signature verifies another body")
	}
	published := PublicKeys(cfg)
	if len(published) != 2 || published[0].PublicKey != "whpk_"+base64.StdEncoding.EncodeToString(pubs[0]) || !strings.HasPrefix(published[1].PEM, "-----BEGIN PUBLIC KEY-----") {
		t.Errorf("published keys %+v", published)
	}
}
