package delivery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
)

// poster is the tests' transport, since the webhook transport's package stands on this one: it
// POSTs a delivery's body to the webhook's URL with its Webhook-Id, and reads the answer as the
// webhook transport does (2xx done; 408, 429 and 5xx retried, after Retry-After seconds when
// given; any other answer final).
type poster struct {
	url    string
	client *http.Client
}

// testTransports builds a poster for a webhook, whatever its kind of sink in the test.
func testTransports(cfg config.SinkConfig, _ *slog.Logger, f Fence) (Transport, error) {
	c, ok := cfg.(*config.Webhook)
	if !ok {
		return nil, errors.New("the tests' transport is a webhook's")
	}
	return &poster{url: c.Endpoint.String(), client: newClient(nil, c.Workers, c.Timeout, f)}, nil
}

func (p *poster) Send(ctx context.Context, d *Delivery, body []byte) error {
	if body == nil {
		body = journal.AppendBody(nil, d.Entry)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Webhook-Id", d.ID)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	d.Answer = StatusClass(resp.StatusCode)
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusGone:
		return Gone(errors.New(resp.Status))
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			return RetryAfter(errors.New(resp.Status), time.Duration(secs)*time.Second)
		}
		return errors.New(resp.Status)
	default:
		return Rejected(errors.New(resp.Status))
	}
}

func (p *poster) Close() { p.client.CloseIdleConnections() }
