package config

import (
	"fmt"
	"net/url"
	"time"
)

// Durability is what a stream sink (JetStream, Kafka) checks of its destination before it takes
// an acknowledgement as the event kept: the destination's own configuration, read at the sink's
// start and every CheckEvery, decides whether an acknowledged message survives the loss of
// power on every server at once (see docs/streams.md#what-an-acknowledgement-guarantees).
// A destination that does not is reported (the sink's Durable condition in /status, the metric
// dynwatch_sink_durable, one log line at each change) and, with Require, sent nothing: its
// events wait in the outbox, retried as for a destination that cannot be reached.
type Durability struct {
	// Require refuses to deliver while the destination is not known to be durable.
	Require bool `mapstructure:"require"`
	// MinReplicas is the fewest copies an acknowledged message must have: the stream's
	// replicas, or the topic's replication factor and min.insync.replicas.
	MinReplicas int `mapstructure:"minReplicas"`
	// Sync (the default) asks, too, that every copy be on disk before the acknowledgement: the
	// servers sync each write (JetStream: sync_interval: always; Kafka: the topic's
	// flush.messages 1). false takes MinReplicas copies in memory as durable, as replication
	// across failure domains that never lose power together makes them.
	Sync *bool `mapstructure:"sync"`
	// CheckEvery is how often the destination's configuration is read again.
	CheckEvery time.Duration `mapstructure:"checkEvery"`
	// MonitorURLs (JetStream only) are the NATS servers' monitoring endpoints
	// (http://nats-0.nats:8222), whose /varz says whether each server syncs every write to disk
	// (jetstream.sync_interval: always). No client request tells; without them that is unknown.
	MonitorURLs []string `mapstructure:"monitorURLs"`
}

// DefaultDurabilityCheckEvery is how often a stream sink reads its destination's configuration
// again unless durability.checkEvery says otherwise.
const DefaultDurabilityCheckEvery = 5 * time.Minute

func (d *Durability) setDefaults() {
	if d.MinReplicas == 0 {
		d.MinReplicas = 1
	}
	if d.CheckEvery == 0 {
		d.CheckEvery = DefaultDurabilityCheckEvery
	}
	if d.Sync == nil {
		yes := true
		d.Sync = &yes
	}
}

// validate checks d at path; monitors says whether monitorURLs may be set.
func (d *Durability) validate(path string, monitors bool, p *problems) {
	if d.MinReplicas < 1 {
		p.add(path+".minReplicas", "must be at least 1, got %d", d.MinReplicas)
	}
	if d.CheckEvery < time.Second {
		p.add(path+".checkEvery", "must be at least 1s, got %s", d.CheckEvery)
	}
	if !monitors && len(d.MonitorURLs) > 0 {
		p.add(path+".monitorURLs", "is for jetstream sinks only")
	}
	for i, raw := range d.MonitorURLs {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			p.add(fmt.Sprintf("%s.monitorURLs[%d]", path, i), "must be an http:// or https:// URL, got %q", RedactURL(raw))
			continue
		}
		if u.User != nil {
			p.add(fmt.Sprintf("%s.monitorURLs[%d]", path, i), "must not carry credentials")
		}
	}
}
