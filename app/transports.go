package app

import (
	"fmt"
	"log/slog"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/stream/jetstream"
	"github.com/dynwatch/dynwatch/stream/kafka"
	"github.com/dynwatch/dynwatch/webhook"
)

// transports builds a sink's transport by its kind: the one place the kinds of sink are
// named, above the delivery core that runs them all alike.
func transports(cfg config.SinkConfig, log *slog.Logger, f delivery.Fence) (delivery.Transport, error) {
	switch c := cfg.(type) {
	case *config.Webhook:
		return webhook.New(c, log, f)
	case *config.JetStream:
		return jetstream.New(c, log, f), nil
	case *config.Kafka:
		return kafka.New(c, log, f), nil
	default:
		return nil, fmt.Errorf("sink %s: no transport for %T", cfg.Shared().Name, cfg)
	}
}
