package kafka

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/dynwatch/dynwatch/delivery"
)

// CheckDurability implements delivery.DurabilityChecker: it reads the topic's replication
// factor (the fewest replicas any partition has), its min.insync.replicas (how many replicas
// hold a record the cluster acknowledges with acks=all) and its flush.messages (1: each
// replica syncs every record to disk before it counts as written).
func (t *Transport) CheckDurability(ctx context.Context) delivery.Durability {
	want := t.cfg.Durability
	cl, err := t.client()
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "%s", err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	topic := t.cfg.Topic
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "topic %s: %v", topic, err)
	}
	td, ok := details[topic]
	switch {
	case !ok:
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "topic %s: not in the cluster's metadata", topic)
	case td.Err != nil:
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "topic %s: %v", topic, td.Err)
	}
	replication := -1
	for _, p := range td.Partitions {
		if replication < 0 || len(p.Replicas) < replication {
			replication = len(p.Replicas)
		}
	}
	configs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "topic %s's configuration: %v", topic, err)
	}
	rc, err := configs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "topic %s's configuration: %v", topic, err)
	}
	setting := func(key string) (string, bool) {
		for _, c := range rc.Configs {
			if c.Key == key && c.Value != nil {
				return *c.Value, true
			}
		}
		return "", false
	}
	raw, known := setting("min.insync.replicas")
	insync, perr := strconv.Atoi(raw)
	switch {
	case !known || perr != nil:
		return delivery.Durabilityf(delivery.DurableUnknown, "ConfigUnknown", "topic %s: the brokers do not report min.insync.replicas", topic)
	case replication < want.MinReplicas:
		return delivery.Durabilityf(delivery.DurableFalse, "TooFewReplicas", "topic %s has replication factor %d; durability.minReplicas is %d", topic, replication, want.MinReplicas)
	case insync < want.MinReplicas:
		return delivery.Durabilityf(delivery.DurableFalse, "TooFewReplicas", "topic %s has min.insync.replicas %d: an acknowledged record may be on that many brokers only; durability.minReplicas is %d", topic, insync, want.MinReplicas)
	case !*want.Sync:
		return delivery.Durabilityf(delivery.DurableTrue, "Durable", "topic %s: replication factor %d, min.insync.replicas %d (durability.sync is false: not checked to be on disk)", topic, replication, insync)
	}
	switch flush, known := setting("flush.messages"); {
	case !known:
		return delivery.Durabilityf(delivery.DurableUnknown, "SyncUnknown", "topic %s: the brokers do not report flush.messages, which says whether each record is synced to disk before it is acknowledged", topic)
	case flush != "1":
		return delivery.Durabilityf(delivery.DurableFalse, "NotSynced", "topic %s has flush.messages %s: its records reach disk when the operating system writes them, not before they are acknowledged (flush.messages: 1)", topic, flush)
	}
	return delivery.Durabilityf(delivery.DurableTrue, "Durable", "topic %s: replication factor %d, min.insync.replicas %d, flush.messages 1", topic, replication, insync)
}
