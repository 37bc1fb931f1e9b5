package webhook

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/dynwatch/dynwatch/config"
)

// credentials are a webhook's bearer token and signers, read again after a 401.
type credentials struct {
	token   config.Secret
	secrets []config.Secret             // the HMAC keys
	keys    []config.Secret             // the Ed25519 private keys
	signers []*standardwebhooks.Webhook // one per secret
}

func newCredentials(name string, token config.Secret, secrets, keys []config.Secret) (*credentials, error) {
	c := &credentials{token: token, secrets: secrets, keys: keys}
	for i, secret := range secrets {
		signer, err := standardwebhooks.NewWebhookRaw(secret)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: signing secret %d: %w", name, i, err)
		}
		c.signers = append(c.signers, signer)
	}
	for i, k := range keys {
		if len(k) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("webhook %s: signing key %d: %d bytes, not an Ed25519 private key", name, i, len(k))
		}
	}
	return c, nil
}

// same reports whether c holds the credentials given.
func (c *credentials) same(token config.Secret, secrets, keys []config.Secret) bool {
	eq := func(a, b config.Secret) bool { return bytes.Equal(a, b) }
	return bytes.Equal(token, c.token) && slices.EqualFunc(secrets, c.secrets, eq) && slices.EqualFunc(keys, c.keys, eq)
}

// rereadCredentials reads the bearer token, signing secret and signing key files again. When
// any changed, it makes the new values current and returns them; else nil.
func (t *Transport) rereadCredentials(cur *credentials) *credentials {
	c := t.cfg
	token := cur.token
	var err error
	if c.BearerTokenFile != "" {
		if token, err = config.ReadCredential(c.BearerTokenFile); err != nil {
			t.log.Warn("read the bearer token file again after a 401", "err", err)
			return nil
		}
	}
	secrets, err := c.ReadSigningSecrets()
	if err != nil {
		t.log.Warn("read the signing secret files again after a 401", "err", err)
		return nil
	}
	keys, err := c.ReadSigningKeys()
	if err != nil {
		t.log.Warn("read the signing key files again after a 401", "err", err)
		return nil
	}
	if cur.same(token, secrets, keys) {
		return nil
	}
	fresh, err := newCredentials(c.Name, token, secrets, keys)
	if err != nil {
		return nil
	}
	if t.creds.CompareAndSwap(cur, fresh) {
		t.log.Info("credentials read again after a 401 differ: retrying with them")
		return fresh
	}
	return t.creds.Load()
}

// sign sets the Standard Webhooks headers of a request: its id, its timestamp and, with signing
// secrets or keys, the signatures over the id, the timestamp and body, space-separated: v1 (an
// HMAC-SHA256) for each secret, then v1a (Ed25519) for each key. Without any (or if signing
// fails), a signature the request before had is removed.
func (t *Transport) sign(h http.Header, creds *credentials, id string, body []byte, now time.Time) {
	put(h, "Webhook-Id", id)
	ts := strconv.FormatInt(now.Unix(), 10)
	put(h, "Webhook-Timestamp", ts)
	var sigs []string
	for _, s := range creds.signers {
		sig, err := s.Sign(id, now, body)
		if err != nil {
			t.unset(h, "Webhook-Signature")
			return
		}
		sigs = append(sigs, sig)
	}
	if len(creds.keys) > 0 {
		msg := signedContent(id, ts, body)
		for _, k := range creds.keys {
			sigs = append(sigs, "v1a,"+base64.StdEncoding.EncodeToString(ed25519.Sign(ed25519.PrivateKey(k), msg)))
		}
	}
	if len(sigs) == 0 {
		t.unset(h, "Webhook-Signature")
		return
	}
	put(h, "Webhook-Signature", strings.Join(sigs, " "))
}

// signedContent is what Standard Webhooks signs: "{id}.{timestamp}.{body}".
func signedContent(id, ts string, body []byte) []byte {
	msg := make([]byte, 0, len(id)+len(ts)+2+len(body))
	msg = append(append(append(append(msg, id...), '.'), ts...), '.')
	return append(msg, body...)
}

// PublicKey is one of a webhook's signing keys as receivers verify with it: Standard Webhooks'
// whpk_ form (base64 of the 32-byte Ed25519 public key), its PKIX PEM, and an id, the first 16
// hex digits of the key's SHA-256.
type PublicKey struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey"`
	PEM       string `json:"pem"`
}

// PublicKeys are the public keys of cfg's signing keys, in order.
func PublicKeys(cfg *config.Webhook) []PublicKey {
	out := make([]PublicKey, 0, len(cfg.SigningKeys))
	for _, k := range cfg.SigningKeys {
		pub := ed25519.PrivateKey(k).Public().(ed25519.PublicKey)
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			continue // an Ed25519 public key always marshals
		}
		sum := sha256.Sum256(pub)
		out = append(out, PublicKey{ID: hex.EncodeToString(sum[:8]), PublicKey: "whpk_" + base64.StdEncoding.EncodeToString(pub),
			PEM: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))})
	}
	return out
}
