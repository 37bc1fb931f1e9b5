package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of the Kafka sink: franz-go's kfake cluster in this process on 127.0.0.1, or, when
// DYNWATCH_TEST_KAFKA_BROKERS names them (host:port, comma-separated, plain and without
// authentication), a real cluster, on which the tests create topics of their own and skip
// stopping the brokers.

// kafkaCluster is what the Kafka tests produce to: the brokers, and a way to stop and start
// them again (nil on a real cluster).
type kafkaCluster struct {
	brokers []string
	fake    *testbed.Kafka
}

// startKafka returns the cluster the test produces to: a real one if the environment names it,
// else a kfake cluster of three brokers that lasts until the test ends.
func startKafka(t *testing.T) kafkaCluster {
	t.Helper()
	if brokers := os.Getenv("DYNWATCH_TEST_KAFKA_BROKERS"); brokers != "" {
		return kafkaCluster{brokers: strings.Split(brokers, ",")}
	}
	k, err := testbed.StartKafka(t.TempDir(), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return kafkaCluster{brokers: k.Brokers(), fake: k}
}

// createTopic creates topic with partitions partitions and the topic configuration configs.
func (k kafkaCluster) createTopic(t *testing.T, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(t.Context(), partitions, -1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// kafkaRecord is one record of the topic, as the test reads it back.
type kafkaRecord struct {
	partition int32
	offset    int64
	key, ceID string
	rv        uint64
}

func readRecords(t *testing.T, brokers []string, topic string) []kafkaRecord {
	t.Helper()
	rs, err := testbed.ReadTopic(t.Context(), brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]kafkaRecord, len(rs))
	for i, r := range rs {
		out[i] = kafkaRecord{partition: r.Partition, offset: r.Offset, key: string(r.Key)}
		for _, h := range r.Headers {
			switch h.Key {
			case "ce_id":
				out[i].ceID = string(h.Value)
			case "ce_resourceversion":
				out[i].rv = object.Revision(string(h.Value))
			}
		}
	}
	return out
}

// checkTopic waits until the last record of every object carries its current
// resourceVersion, then reads the topic and checks that every object's records are in one
// partition, and that in it the first arrival of each event id comes after the first arrivals
// of the object's older versions.
func checkTopic(t *testing.T, brokers []string, topic string, u *updater) {
	t.Helper()
	var records []kafkaRecord
	id := clusterID(t, cluster.Config)
	testbed.Eventually(t, 90*time.Second, func() error {
		records = readRecords(t, brokers, topic)
		last := map[string]uint64{}
		for _, r := range records {
			last[r.key] = r.rv
		}
		var behind []string
		for _, cm := range u.objects {
			key := id + "/configmaps.v1|" + cm.Namespace + "/" + cm.Name
			if got := last[key]; got != object.Revision(cm.ResourceVersion) {
				behind = append(behind, fmt.Sprintf("%s at %d, not %s", cm.Name, got, cm.ResourceVersion))
			}
		}
		if len(behind) > 0 {
			return fmt.Errorf("%d of %d objects' last records are not their last version: %v", len(behind), len(u.objects), behind[:min(5, len(behind))])
		}
		return nil
	})
	partition := map[string]int32{}
	newest := map[string]kafkaRecord{}
	seen := map[string]bool{}
	duplicates := 0
	for _, r := range records {
		if p, ok := partition[r.key]; ok && p != r.partition {
			t.Errorf("%s has records in partitions %d and %d", r.key, p, r.partition)
		}
		partition[r.key] = r.partition
		if seen[r.ceID] {
			duplicates++
			continue
		}
		seen[r.ceID] = true
		if prev, ok := newest[r.key]; ok && r.rv <= prev.rv {
			t.Errorf("%s: the first arrival of resourceVersion %d (offset %d) after that of %d (offset %d)", r.key, r.rv, r.offset, prev.rv, prev.offset)
		}
		newest[r.key] = r
	}
	wanted := 0
	for _, id := range u.want {
		if seen[id] {
			wanted++
		}
	}
	t.Logf("%d changes made; the topic holds %d records of %d keys, %d of them changes made (the rest a restart's differences), %d repeated ids",
		len(u.want), len(records), len(partition), wanted, duplicates)
}

func TestKafkaHoldsEveryObjectsLastVersionInOrderThroughABrokerRestartAndADynwatchKill(t *testing.T) {
	ns := namespace(t)
	k := startKafka(t)
	topic := "dynwatch-" + ns
	k.createTopic(t, topic, 6, nil)
	dir := t.TempDir()
	r := &replica{name: "r0", config: filepath.Join(dir, "config.yaml")}
	writeFile(t, r.config, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
kafka: [{name: topic, brokers: [%s], topic: %s, workers: 8, timeout: 2s, retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, strings.Join(k.brokers, ", "), topic, filepath.Join(dir, "state")))
	startAll(t, []*replica{r})
	u := newUpdater(t, ns, 200)

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	// The cluster is down from change 400 to 800, so that the outbox fills; dynwatch is killed
	// at 1,200, while records are on their way.
	u.run(t, 2000, 200, func(i int) {
		switch {
		case i == 400 && k.fake != nil:
			k.fake.Stop()
		case i == 800 && k.fake != nil:
			if err := k.fake.Start(); err != nil {
				t.Fatal(err)
			}
		case i == 1200:
			if err := r.proc().Kill(); err != nil {
				t.Fatal(err)
			}
			restart(t, r, &wg, errs)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkTopic(t, k.brokers, topic, u)
}

func TestATooLargeRecordIsDeadLetteredAMissingTopicNamedAndUnreachableBrokersHoldUpOnlyTheirSink(t *testing.T) {
	ns := namespace(t)
	k := startKafka(t)
	small := "4096"
	topic := "dynwatch-" + ns
	k.createTopic(t, topic, 1, map[string]*string{"max.message.bytes": &small})
	nowhere, err := testbed.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
kafka:
- {name: unreachable, brokers: ['127.0.0.1:%[5]d'], topic: %[3]s, timeout: 1s, deadLetter: {file: %[4]s/unreachable.jsonl}, retry: {initialBackoff: 100ms, maxBackoff: 200ms, maxElapsed: 1s}}
- {name: small, brokers: [%[2]s], topic: %[3]s, deadLetter: {file: %[4]s/small.jsonl}, retry: {initialBackoff: 100ms, maxBackoff: 200ms, maxElapsed: 1s}}
- {name: missing, brokers: [%[2]s], topic: %[3]s-missing, deadLetter: {file: %[4]s/missing.jsonl}, retry: {initialBackoff: 100ms, maxBackoff: 200ms, maxElapsed: 1s}}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, strings.Join(k.brokers, ", "), topic, dir, nowhere))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	createSmallAndLarge(t, ns)
	onlyLargeDeadLettered(t, filepath.Join(dir, "small.jsonl"))
	waitDeadLetters(t, filepath.Join(dir, "missing.jsonl"), 60*time.Second, `"reason":"retries_exhausted"`, "topic "+topic+"-missing does not exist")
	waitDeadLetters(t, filepath.Join(dir, "unreachable.jsonl"), 60*time.Second, `"reason":"retries_exhausted"`, "no broker could say why")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	testbed.Eventually(t, 30*time.Second, func() error {
		rs, err := testbed.ReadTopic(ctx, k.brokers, topic)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if strings.HasSuffix(string(r.Key), "/small") {
				return nil
			}
		}
		return fmt.Errorf("the small object is not in %s: %d records", topic, len(rs))
	})
}
