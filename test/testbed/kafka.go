package testbed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka is a Kafka cluster for the Kafka sink's tests: franz-go's kfake, which speaks the Kafka
// protocol (idempotent producers included) in this process, with brokers on 127.0.0.1 and its
// data in a directory, so that it can be stopped and started again on the same ports and data,
// as a restarted cluster would be. A real Kafka broker cannot be built from the Go module proxy,
// which is all the test bed installs from.
type Kafka struct {
	dir   string
	ports []int
	opts  []kfake.Opt

	mu sync.Mutex
	c  *kfake.Cluster
}

// StartKafka starts a cluster of brokers brokers keeping its data in dir, with the topics
// given as name:partitions (or name, for one partition) and, besides, the options opts.
func StartKafka(dir string, brokers int, topics []string, opts ...kfake.Opt) (*Kafka, error) {
	k := &Kafka{dir: dir}
	for range brokers {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		k.ports = append(k.ports, p)
	}
	for _, t := range topics {
		name, n, _ := strings.Cut(t, ":")
		partitions := 1
		if n != "" {
			var err error
			if partitions, err = strconv.Atoi(n); err != nil {
				return nil, fmt.Errorf("topic %q: %w", t, err)
			}
		}
		k.opts = append(k.opts, kfake.SeedTopics(int32(partitions), name))
	}
	k.opts = append(k.opts, opts...)
	// As a Kafka broker by default, kfake does not sync each write: its data is synced when it
	// stops, which is how Stop and Start restart it.
	k.opts = append(k.opts, kfake.NumBrokers(brokers), kfake.Ports(k.ports...), kfake.DataDir(dir))
	return k, k.Start()
}

// Start starts the cluster, on its ports and data, if it is stopped.
func (k *Kafka) Start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		return nil
	}
	c, err := kfake.NewCluster(k.opts...)
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	k.c = c
	return nil
}

// Stop stops every broker: their connections close and their data stays in the directory.
func (k *Kafka) Stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		k.c.Close()
		k.c = nil
	}
}

// Brokers are the brokers' addresses, 127.0.0.1:port.
func (k *Kafka) Brokers() []string {
	out := make([]string, len(k.ports))
	for i, p := range k.ports {
		out[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return out
}

// ReadTopic reads every record of topic, from each partition's start to its end as it is when
// ReadTopic begins, in partition order.
func ReadTopic(ctx context.Context, brokers []string, topic string) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := endOffsets(ctx, cl, topic)
	if err != nil {
		return nil, err
	}
	var out []*kgo.Record
	next := map[int32]int64{}
	done := func() bool {
		for p, end := range ends {
			if next[p] < end {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", topic, err)
		}
		var errs []error
		fs.EachError(func(_ string, _ int32, err error) { errs = append(errs, err) })
		if len(errs) > 0 {
			return nil, fmt.Errorf("read %s: %w", topic, errors.Join(errs...))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < ends[r.Partition] {
				out = append(out, r)
			}
			next[r.Partition] = r.Offset + 1
		})
	}
	return out, nil
}

// endOffsets are the offsets just past the last record of each of topic's partitions.
func endOffsets(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("the end offsets of %s: %w", topic, err)
	}
	if err := listed.Error(); err != nil {
		return nil, fmt.Errorf("the end offsets of %s: %w", topic, err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	if len(ends) == 0 {
		return nil, fmt.Errorf("topic %s has no partitions", topic)
	}
	return ends, nil
}
