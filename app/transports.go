package app

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/stream/jetstream"
	"github.com/dynwatch/dynwatch/stream/kafka"
	"github.com/dynwatch/dynwatch/webhook"
)

// transports builds a sink's transport by its kind, sending the events of cluster: the one
// place the kinds of sink are named, above the delivery core that runs them all alike.
func transports(cluster object.Cluster) delivery.Transports {
	return func(cfg config.SinkConfig, log *slog.Logger, f delivery.Fence) (delivery.Transport, error) {
		switch c := cfg.(type) {
		case *config.Webhook:
			return webhook.New(c, cluster, log, f)
		case *config.JetStream:
			return jetstream.New(c, cluster, log, f), nil
		case *config.Kafka:
			return kafka.New(c, cluster, log, f), nil
		default:
			return nil, fmt.Errorf("sink %s: no transport for %T", cfg.Shared().Name, cfg)
		}
	}
}

// signingKeys is GET /signing-keys: the public keys each webhook of the running configuration
// signs with (Standard Webhooks' v1a), so that receivers verify without a secret.
type signingKeys struct{ cur atomic.Pointer[publishedKeys] }

type publishedKeys struct {
	Webhooks []webhookKeys `json:"webhooks"`
}

type webhookKeys struct {
	Name string              `json:"name"`
	Keys []webhook.PublicKey `json:"keys"`
}

// set publishes the keys of cfg's webhooks.
func (k *signingKeys) set(cfg *config.Config) {
	p := &publishedKeys{Webhooks: []webhookKeys{}}
	for i := range cfg.Webhooks {
		w := &cfg.Webhooks[i]
		if len(w.SigningKeys) > 0 {
			p.Webhooks = append(p.Webhooks, webhookKeys{Name: w.Name, Keys: webhook.PublicKeys(w)})
		}
	}
	k.cur.Store(p)
}

func (k *signingKeys) get() any { return k.cur.Load() }
