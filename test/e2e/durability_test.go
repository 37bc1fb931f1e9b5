package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of the stream sinks' durability checks (docs/streams.md#what-an-acknowledgement-
// guarantees): what each destination's configuration says an acknowledgement guarantees is
// reported in /status, the metric and the log, and durability.require holds every event in the
// outbox until the destination is made durable.

// sinkDurability is one sink's durable in /status.
type sinkDurability struct {
	Status, Reason, Message string
}

// durabilities reads every sink's durable from /status, by sink name.
func durabilities(t *testing.T, api string) map[string]sinkDurability {
	t.Helper()
	code, body, err := get(t.Context(), api+"/status")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/status: %d, %v: %s", code, err, body)
	}
	var st struct {
		Sinks []struct {
			Name    string
			Durable *sinkDurability
		}
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	out := map[string]sinkDurability{}
	for _, s := range st.Sinks {
		if s.Durable != nil {
			out[s.Name] = *s.Durable
		}
	}
	return out
}

// waitDurability waits until /status reports each sink in want with the status and reason
// given as "Status/Reason", and dynwatch_sink_durable agrees.
func waitDurability(t *testing.T, p *runner.Process, want map[string]string) {
	t.Helper()
	api, metrics, _ := p.WaitListening(t.Context())
	testbed.Eventually(t, time.Minute, func() error {
		got := durabilities(t, api)
		for sink, w := range want {
			d, ok := got[sink]
			if !ok || d.Status+"/"+d.Reason != w {
				return fmt.Errorf("sink %s: durable %+v, want %s", sink, d, w)
			}
			status, _, _ := strings.Cut(w, "/")
			if v := metricValue(t, metrics, fmt.Sprintf(`dynwatch_sink_durable{sink=%q,status=%q}`, sink, status)); v != 1 {
				return fmt.Errorf("sink %s: dynwatch_sink_durable{status=%q} is %v", sink, status, v)
			}
		}
		return nil
	})
}

// createConfigMaps creates n configmaps c-0 … in ns.
func createConfigMaps(t *testing.T, ns string, n int) {
	t.Helper()
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	for i := range n {
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// updateConfigMaps sets a value in each of the configmaps c-0 … of ns.
func updateConfigMaps(t *testing.T, ns string, n int) {
	t.Helper()
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	for i := range n {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}, Data: map[string]string{"v": "1"}}
		if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// logLines counts the lines of p's log that contain every one of parts.
func logLines(p *runner.Process, parts ...string) int {
	n := 0
	for line := range strings.SplitSeq(p.Log(), "\n") {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// TestAStreamWhoseServerDoesNotSyncEveryWriteIsReportedAndUnderRequireSentNothingUntilItDoes:
// on a nats-server with the default sync_interval (2 minutes), a file stream's sinks report
// False/NotSynced when they may read the server's /varz, Unknown/SyncUnknown when they may
// not, and a memory stream's False/MemoryStorage; the sink without require delivers every
// event, the one with require none, each reported once in the log over several checks. Once
// the server is restarted with sync_interval: always, the held sink finds the stream durable
// and delivers every event it held, each object's in order.
func TestAStreamWhoseServerDoesNotSyncEveryWriteIsReportedAndUnderRequireSentNothingUntilItDoes(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	nc := startNATS(t, 1)
	file := createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "FILE", Subjects: []string{"held.>", "told.>", "blind.>"}})
	createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "MEM", Subjects: []string{"mem.>"}, Storage: jetstream.MemoryStorage})
	sink := func(name, stream, durability string) string {
		return fmt.Sprintf("- {name: %[1]s, servers: [%[2]s], subjectPrefix: %[1]s, stream: %[3]s, workers: 1, retry: {initialBackoff: 100ms, maxBackoff: 500ms, maxElapsed: 1h}, durability: %[4]s}\n",
			name, nc.URLs()[0], stream, durability)
	}
	monitor := nc.MonitorURLs()[0]
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
state: {path: %s}
jetstream:
%s%s%s%sapi: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, filepath.Join(t.TempDir(), "state.db"),
		sink("held", "FILE", fmt.Sprintf("{require: true, checkEvery: 1s, monitorURLs: [%s]}", monitor)),
		sink("told", "FILE", fmt.Sprintf("{checkEvery: 1s, monitorURLs: [%s]}", monitor)),
		sink("blind", "FILE", "{checkEvery: 1s}"),
		sink("mem", "MEM", "{checkEvery: 1s}")))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitDurability(t, p, map[string]string{"held": "False/NotSynced", "told": "False/NotSynced", "blind": "Unknown/SyncUnknown", "mem": "False/MemoryStorage"})
	const n = 5
	createConfigMaps(t, ns, n)
	updateConfigMaps(t, ns, n)
	// subjects are the events a sink published, "c-0 ADDED" …, in the stream's order.
	subjects := func(prefix string) []string {
		var out []string
		for _, m := range readStream(t, file) {
			if strings.HasPrefix(m.subject, prefix+".") && strings.Contains(m.subject, ".c-") {
				out = append(out, m.subject[strings.LastIndexByte(m.subject, '.')+1:]+" "+m.ceType)
			}
		}
		return out
	}
	testbed.Eventually(t, time.Minute, func() error {
		if got := subjects("told"); len(got) != 2*n {
			return fmt.Errorf("the sink without require delivered %v", got)
		}
		return nil
	})
	// Several checks later, the held sink has still sent nothing, and each sink's status was
	// logged once.
	time.Sleep(3 * time.Second)
	if got := subjects("held"); len(got) != 0 {
		t.Fatalf("the sink under require delivered %v to a stream that does not sync every write", got)
	}
	api, metrics, _ := p.WaitListening(t.Context())
	if v := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="held"}`); v < 2*n {
		t.Errorf("the held sink's outbox holds %v events, want at least %d", v, 2*n)
	}
	if d := durabilities(t, api)["held"]; !strings.Contains(d.Message, "every 2m0s") {
		t.Errorf("the held sink's durability message does not name the server's sync interval: %q", d.Message)
	}
	if c := logLines(p, `"sink":"held"`, "not known to be durable", `"reason":"NotSynced"`); c != 1 {
		t.Errorf("the held sink's status was logged %d times over several checks, want once", c)
	}

	// The server, restarted syncing every write: the held sink delivers what it held, in order.
	nc.Kill(0)
	nc.SyncAlways(0, true)
	if err := nc.Restart(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	waitDurability(t, p, map[string]string{"held": "True/Durable", "told": "True/Durable", "blind": "Unknown/SyncUnknown"})
	testbed.Eventually(t, time.Minute, func() error {
		if got := subjects("held"); len(got) != 2*n {
			return fmt.Errorf("the held sink delivered %v", got)
		}
		return nil
	})
	got := subjects("held")
	for i := range n {
		added := slices.Index(got, fmt.Sprintf("c-%d %s", i, "io.dynwatch.resource.added"))
		modified := slices.Index(got, fmt.Sprintf("c-%d %s", i, "io.dynwatch.resource.modified"))
		if added < 0 || modified < added {
			t.Errorf("the held sink delivered %v: c-%d's ADDED and MODIFIED not both, in order", got, i)
		}
	}
	if c := logLines(p, `"sink":"held"`, "is durable"); c != 1 {
		t.Errorf("the held sink's durability was logged %d times, want once", c)
	}
}

// TestATopicWithTooFewInSyncReplicasIsReportedAndUnderRequireSentNothingUntilItHasThem: a
// topic with min.insync.replicas 1 is False/TooFewReplicas for a sink that asks for 2 copies,
// which under require sends nothing, and the sink that asks for one synced copy is told that
// flush.messages is not 1 (NotSynced) or, on kfake, which does not report it, that it is not
// known (SyncUnknown). Once min.insync.replicas is raised to 2, the held sink finds the topic
// durable and delivers every event it held.
func TestATopicWithTooFewInSyncReplicasIsReportedAndUnderRequireSentNothingUntilItHasThem(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	k := startKafka(t)
	one := "1"
	k.createTopic(t, "held", 1, map[string]*string{"min.insync.replicas": &one})
	k.createTopic(t, "synced", 1, nil)
	brokers := strings.Join(k.brokers, ", ")
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
kafka:
- {name: held, brokers: [%[2]s], topic: held, workers: 1, retry: {initialBackoff: 100ms, maxBackoff: 500ms, maxElapsed: 1h}, durability: {minReplicas: 2, sync: false, require: true, checkEvery: 1s}}
- {name: synced, brokers: [%[2]s], topic: synced, durability: {checkEvery: 1s}}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, brokers))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	syncedWant := "False/NotSynced"
	if k.fake != nil {
		syncedWant = "Unknown/SyncUnknown" // kfake reports no flush.messages
	}
	waitDurability(t, p, map[string]string{"held": "False/TooFewReplicas", "synced": syncedWant})
	const n = 5
	createConfigMaps(t, ns, n)
	names := func(topic string) []string {
		var out []string
		for _, r := range readRecords(t, k.brokers, topic) {
			if _, name, ok := strings.Cut(r.key, "|"+ns+"/"); ok && strings.HasPrefix(name, "c-") {
				out = append(out, name)
			}
		}
		return out
	}
	testbed.Eventually(t, time.Minute, func() error {
		if got := names("synced"); len(got) != n {
			return fmt.Errorf("the sink without require delivered %v", got)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if got := names("held"); len(got) != 0 {
		t.Fatalf("the sink under require delivered %v to a topic with min.insync.replicas 1", got)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	two := "2"
	resp, err := kadm.NewClient(cl).AlterTopicConfigs(t.Context(), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "min.insync.replicas", Value: &two}}, "held")
	if err == nil {
		_, err = resp.On("held", nil)
	}
	if err != nil {
		t.Fatalf("set min.insync.replicas of held: %v", err)
	}
	waitDurability(t, p, map[string]string{"held": "True/Durable"})
	testbed.Eventually(t, time.Minute, func() error {
		if got := names("held"); len(got) != n {
			return fmt.Errorf("the held sink delivered %v", got)
		}
		return nil
	})
}
