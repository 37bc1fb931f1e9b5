package webhook

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/dynwatch/dynwatch/config"
)

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

// rereadCredentials reads the bearer token and signing secret files again. When either
// changed, it makes the new values current and returns them; else nil.
func (t *Transport) rereadCredentials(cur *credentials) *credentials {
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

// sign sets the Standard Webhooks headers of a request: its id, its timestamp and, with a
// signing secret, the signature over the id, the timestamp and body; without one (or if
// signing fails), a signature the request before had is removed.
func (t *Transport) sign(h http.Header, creds *credentials, id string, body []byte, now time.Time) {
	put(h, "Webhook-Id", id)
	put(h, "Webhook-Timestamp", strconv.FormatInt(now.Unix(), 10))
	if creds.signer != nil {
		if sig, err := creds.signer.Sign(id, now, body); err == nil {
			put(h, "Webhook-Signature", sig)
			return
		}
	}
	t.unset(h, "Webhook-Signature")
}
