package app

import (
	"fmt"
	"log/slog"

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
