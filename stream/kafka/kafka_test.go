package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/stream/streamtest"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// startKafka runs a kfake cluster of three brokers until the test ends.
func startKafka(t *testing.T, topics []string, opts ...kfake.Opt) *testbed.Kafka {
	t.Helper()
	k, err := testbed.StartKafka(t.TempDir(), 3, topics, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// kafkaSink is a Kafka sink's transport to topic on k, under fence f.
func kafkaSink(t *testing.T, k *testbed.Kafka, topic string, f delivery.Fence) *Transport {
	t.Helper()
	cfg := &config.Kafka{Sink: config.Sink{Name: "k", Timeout: 5 * time.Second}, Brokers: k.Brokers(), Topic: topic, Compression: config.CompressionNone}
	tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), f)
	t.Cleanup(tr.Close)
	return tr
}

// testCluster is the cluster the tests' events come from, with its id in every key.
var testCluster = object.Cluster{ID: "test-cluster", InKeys: true}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestEveryVersionOfAnObjectGoesToOnePartitionInOrderAsABinaryModeCloudEvent(t *testing.T) {
	k := startKafka(t, []string{"events:8"})
	tr := kafkaSink(t, k, "events", delivery.Always{})
	names := []string{"a", "b", "c", "d", "e", "f"}
	for rv := 1; rv <= 5; rv++ {
		for _, name := range names {
			if err := tr.Send(t.Context(), streamtest.ConfigMapAt("team a", name, fmt.Sprint(rv*10)), []byte(`{"v":1}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	records, err := testbed.ReadTopic(t.Context(), k.Brokers(), "events")
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != 5*len(names) {
		t.Fatalf("the topic holds %d records, want %d", len(records), 5*len(names))
	}
	partition := map[string]int32{}
	last := map[string]uint64{}
	partitions := map[int32]bool{}
	for _, r := range records {
		key := string(r.Key)
		if p, ok := partition[key]; ok && p != r.Partition {
			t.Errorf("%s is in partitions %d and %d", key, p, r.Partition)
		}
		partition[key] = r.Partition
		partitions[r.Partition] = true
		rv := object.Revision(header(r, "ce_resourceversion"))
		if rv <= last[key] {
			t.Errorf("%s: resourceVersion %d after %d", key, rv, last[key])
		}
		last[key] = rv
		for name, want := range map[string]string{
			"ce_specversion": "1.0", "ce_source": "/api/v1/configmaps", "ce_type": "io.dynwatch.resource.modified",
			"ce_partitionkey": key, "content-type": "application/json",
			// The Kafka binding carries values as they are: no percent-encoding of the space.
			"ce_subject": "team a/" + strings.TrimPrefix(key, "test-cluster/configmaps.v1|team a/"),
			"ce_id":      "u-" + strings.TrimPrefix(key, "test-cluster/configmaps.v1|team a/") + "." + fmt.Sprint(rv) + ".modified",
			"ce_cluster": "test-cluster",
		} {
			if got := header(r, name); got != want {
				t.Errorf("record %d/%d: %s is %q, want %q", r.Partition, r.Offset, name, got, want)
			}
		}
	}
	if len(partitions) < 2 {
		t.Errorf("six keys all went to partition %v: the records are not partitioned by key", partitions)
	}
}

func TestARecordTooLargeForTheTopicIsRejectedAndAMissingTopicIsNamed(t *testing.T) {
	k := startKafka(t, []string{"small"}, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "4096"}))
	tr := kafkaSink(t, k, "small", delivery.Always{})
	// The large record is sent beside small ones, as workers do: the broker refuses the batch
	// that holds it whole, and only the large one may be rejected.
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() {
			body := []byte(`{}`)
			if i == 0 {
				body = []byte(`{"v":"` + strings.Repeat("x", 8000) + `"}`)
			}
			errs[i] = tr.Send(t.Context(), streamtest.ConfigMapAt("default", fmt.Sprint("o", i), "1"), body)
		})
	}
	wg.Wait()
	if !delivery.IsRejected(errs[0]) || !strings.Contains(errs[0].Error(), "8008 bytes") {
		t.Fatalf("a record of 8 KB to a topic of 4 KB: %v; want it rejected with its size", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("small record %d sent beside the large one: %v", i+1, err)
		}
	}
	for _, timeout := range []time.Duration{5 * time.Second, 300 * time.Millisecond} {
		// With the shorter timeout, the attempt ends while the client still asks for the topic.
		missing := kafkaSink(t, k, "missing", delivery.Always{})
		missing.cfg.Timeout = timeout
		err := missing.Send(t.Context(), streamtest.ConfigMapAt("default", "x", "1"), []byte(`{}`))
		if err == nil || delivery.IsRejected(err) || !strings.Contains(err.Error(), "topic missing does not exist") {
			t.Fatalf("a missing topic, with a timeout of %s: %v; want a retriable error naming it", timeout, err)
		}
	}
}

func TestALapsedFenceProducesNothingAndTheRecordGoesOnceTheNextLeaderSends(t *testing.T) {
	k := startKafka(t, []string{"events"})
	f := &streamtest.Fence{}
	deposed := kafkaSink(t, k, "events", f)
	if err := deposed.Send(t.Context(), streamtest.ConfigMapAt("default", "x", "1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	f.Lapse.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := deposed.Send(ctx, streamtest.ConfigMapAt("default", "x", "2"), []byte(`{}`)); err == nil {
		t.Fatal("a send after the fence lapsed succeeded")
	}
	deposed.Close() // the replica follows: what its client still holds is failed
	if err := kafkaSink(t, k, "events", delivery.Always{}).Send(t.Context(), streamtest.ConfigMapAt("default", "x", "3"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	records, err := testbed.ReadTopic(t.Context(), k.Brokers(), "events")
	if err != nil {
		t.Fatal(err)
	}
	var rvs []string
	for _, r := range records {
		rvs = append(rvs, header(r, "ce_resourceversion"))
	}
	if strings.Join(rvs, ",") != "1,3" {
		t.Fatalf("the topic holds resourceVersions %v; want 1 and 3: nothing written once the fence lapsed", rvs)
	}
}

func TestTheClusterRestartedLosesNothingAcknowledged(t *testing.T) {
	k := startKafka(t, []string{"events:3"})
	tr := kafkaSink(t, k, "events", delivery.Always{})
	for i := range 20 {
		if err := tr.Send(t.Context(), streamtest.ConfigMapAt("default", fmt.Sprint("o", i%4), fmt.Sprint(i+1)), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	k.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	err := tr.Send(ctx, streamtest.ConfigMapAt("default", "o0", "100"), []byte(`{}`))
	cancel()
	if err == nil {
		t.Fatal("a send while every broker is down succeeded")
	}
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		return tr.Send(t.Context(), streamtest.ConfigMapAt("default", "o0", "100"), []byte(`{}`))
	})
	records, err := testbed.ReadTopic(t.Context(), k.Brokers(), "events")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, r := range records {
		ids[header(r, "ce_id")]++
	}
	for i := range 20 {
		if id := fmt.Sprintf("u-o%d.%d.modified", i%4, i+1); ids[id] != 1 {
			t.Errorf("%s is stored %d times, want once", id, ids[id])
		}
	}
	if ids["u-o0.100.modified"] == 0 {
		t.Error("the send retried after the restart is not stored")
	}
}
