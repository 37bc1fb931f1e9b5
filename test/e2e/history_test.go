package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
	"github.com/dynwatch/dynwatch/test/validate"
)

// The churn the recorded watches run under.
const (
	churnObjects = 12               // configmaps the writes go round
	churnFor     = 15 * time.Second // how long they last
	churnEvery   = 25 * time.Millisecond
	churnAtLeast = 200 // writes, however long a loaded machine takes over them
)

// TestEveryWatchThroughTheQueryAPIKeepsTheApiserversHistory records, while configmaps of one
// namespace are created, updated and deleted at random (the seed is logged, and DYNWATCH_TEST_SEED
// sets it), the apiserver's own watch of them from before the first write (the reference history)
// and five watches through dynwatch's query API: one resumed from a list's resourceVersion, one
// that asks for initial events, one of a single object by field selector, one by a label selector
// that the writes move objects into and out of, and one resumed from a resourceVersion some
// seconds old; and three paged lists through it, one by the label selector, with a configmap
// created between each two pages, and one by the label selector at that older resourceVersion,
// which dynwatch answers from the resource's history (on, with a state store). Once every watch has received its last change, each must keep every
// promise package validate checks against the reference: Ordered, Unique, Atomic, Bookmarkable,
// Reliable, Resumable, and the initial state at its bookmark; and each list's pages must share a
// resourceVersion and hold the objects as the reference had them there. A webhook beside them,
// which answers the first attempt at four changes in ten 503, 429, slowly or too late (the seed
// chooses which), must take every change, first arrivals in order per object, each under one id,
// and no version the apiserver never had. The faults of dynwatch and the apiserver are
// TestRobustness's.
func TestEveryWatchThroughTheQueryAPIKeepsTheApiserversHistory(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("DYNWATCH_TEST_SEED"), 10, 64); err == nil {
		seed = s // the writes and the webhook's faults of a run to look at again; their timing is the machine's
	}
	t.Logf("seed %d (DYNWATCH_TEST_SEED=%[1]d makes the same writes and faults)", seed)
	rec, late := recordHistory(t, cluster, runner.Options{}, seed)
	for _, err := range late {
		t.Error(err)
	}
	for _, v := range rec.Violations() {
		t.Error(v)
	}
	if t.Failed() {
		writeRecord(t, rec, fmt.Sprintf("dynwatch-history-%d.json", seed))
	}
}

// TestEachBuildBrokenForAValidatorFailsIt records the history test's watches, lists and sinks
// (recordHistory) through builds of dynwatch broken on purpose, each by a failpoint
// (runner.BuildWithFailpoints) that breaks one promise, and demands that the validator of that
// promise finds it: a validator that cannot fail checks nothing. Other validators may find the
// same break too; each run logs how many violations each validator found. The build that serves
// each change at the next resourceVersion runs on a test bed of its own, whose resourceVersions
// only the run's writes advance: the next resourceVersion is then the next change's, which
// Atomic must miss.
func TestEachBuildBrokenForAValidatorFailsIt(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		failpoint, validator string
		quiet                bool // on a test bed of its own, whose resourceVersions only the run's writes advance
	}{
		{"loseFirstInitialObject", "InitialState", false}, // httpapi: a watch's first initial object is not sent
		{"bookmarkAtChange", "Bookmarkable", false},       // httpapi: a bookmark at a change's resourceVersion before it
		{"serveAtNextRevision", "Atomic", true},           // httpapi: a change served at the resourceVersion after its own
		{"retryOutOfTurn", "InOrder", false},              // delivery: a retry queued apart from its object's later changes
		{"newIDOnRetry", "StableIDs", false},              // delivery: each retry under an id of its own
		{"dropDeletions", "Converged", false},             // delivery: each deletion acknowledged and never sent
		{"pageFromCacheNow", "Paged", false},              // httpapi: a list's later page read from the cache now
		{"nameEveryManager", "Attributed", false},         // dynamicinformer: every change names every manager of its object
	} {
		t.Run(b.failpoint, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			bed := cluster
			if b.quiet {
				bed = ownCluster(t, testbed.Options{})
			}
			rec, _ := recordHistory(t, bed, runner.Options{
				Binary: failpointBinary(t), Env: []string{"GOFAIL_FAILPOINTS=" + b.failpoint + "=return"},
			}, seed)
			found := map[string]int{}
			for _, v := range rec.Violations() {
				found[v.Validator]++
			}
			t.Logf("violations found, by validator: %v", found)
			if found[b.validator] == 0 {
				t.Errorf("%s found nothing on a build broken by the failpoint %s", b.validator, b.failpoint)
			}
		})
	}
}

// recordHistory runs dynwatch (as o says, on c) delivering a namespace's configmaps to a
// webhook whose faults the seed chooses, churns them as the seed says, and records the
// apiserver's own watch of them, five watches and three paged lists through dynwatch's query
// API, and the webhook's deliveries (see TestEveryWatchThroughTheQueryAPIKeepsTheApiserversHistory);
// and, apart, each wait that ran out (a change that did not come, a watch that ended).
func recordHistory(t *testing.T, c *testbed.Cluster, o runner.Options, seed uint64) (validate.Record, []error) {
	t.Helper()
	ns := namespaceIn(t, c.Config)
	// The webhook's faults, chosen for each change by the seed (seededAnswer).
	rc := newJudge(t, func(r received, n int, h http.Header) int { return seededAnswer(seed, r, n, h) })
	sinks := recordedSinks(t, c.Config, rc)
	o.Config, o.Kubeconfig = filepath.Join(t.TempDir(), "config.yaml"), c.Kubeconfig
	writeFile(t, o.Config, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s], history: {retain: 1h}}]
state: {path: %q}
%s
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 5000}
metrics: {address: "127.0.0.1:0"}
`, ns, filepath.Join(t.TempDir(), "state"), sinks.config("1s")))
	p := startReady(t, o)
	api, _, _ := p.WaitListening(t.Context())
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	upstream := dynamic.NewForConfigOrDie(c.Config).Resource(gvr).Namespace(ns)
	through := dynamic.NewForConfigOrDie(&rest.Config{Host: api}).Resource(gvr).Namespace(ns)

	list, err := upstream.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reference := record(t, "the apiserver", upstream, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})

	churned := make(chan struct{})
	go func() { defer close(churned); churnConfigMaps(t, c.Config, ns, seed) }()

	var streams []*recording
	time.Sleep(2 * time.Second)
	streams = append(streams, resumeFromList(t, "resumed from a list", through, metav1.ListOptions{}))
	time.Sleep(2 * time.Second)
	yes := true
	streams = append(streams, record(t, "initial events", through, metav1.ListOptions{
		SendInitialEvents: &yes, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	}))
	streams[1].stream.SendInitialEvents = true
	time.Sleep(2 * time.Second)
	one := fields.OneTermEqualSelector("metadata.name", "cm-03").String()
	streams = append(streams, resumeFromList(t, "cm-03 alone", through, metav1.ListOptions{FieldSelector: one}))
	streams[2].stream.Selects = validate.Selector{Name: "cm-03"}
	time.Sleep(2 * time.Second)
	teamA := validate.Selector{Labels: "team=a"}
	streams = append(streams, resumeFromList(t, "team=a by label selector", through, metav1.ListOptions{LabelSelector: "team=a"}))
	streams[3].stream.Selects = teamA
	// Between a list's pages, a configmap is created, and the next page asked for once
	// dynwatch's cache has it: a later page must still be read from its first page's snapshot.
	cms := kubernetes.NewForConfigOrDie(c.Config).CoreV1().ConfigMaps(ns)
	created := 0
	between := func() {
		created++
		name := fmt.Sprintf("paged-%02d", created)
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, time.Minute, func() error {
			_, err := through.Get(t.Context(), name, metav1.GetOptions{})
			return err
		})
	}
	lists := []validate.List{
		pagedList(t, "in pages of 3", through, metav1.ListOptions{Limit: 3}, between),
		pagedList(t, "team=a in pages of 2", through, metav1.ListOptions{Limit: 2, LabelSelector: "team=a"}, between),
	}
	lists[1].Selects = teamA
	// A watch from some changes ago: the churn lasts until it has made churnAtLeast writes, so
	// the reference comes to hold ten changes however slow the machine is.
	testbed.Eventually(t, 5*time.Minute, func() error {
		if n := len(reference.events()); n < 10 {
			return fmt.Errorf("the apiserver's watch has %d changes, not yet 10", n)
		}
		return nil
	})
	old := reference.events()
	from := old[len(old)*2/3].Revision // some seconds ago
	streams = append(streams, record(t, "resumed from an older revision", through, metav1.ListOptions{ResourceVersion: strconv.FormatUint(from, 10), AllowWatchBookmarks: true}))
	// The same older revision listed, from the history: by label selector, for a list at a
	// past resourceVersion counts no remainingItemCount (docs/history.md).
	lists = append(lists, pagedList(t, "team=a at an older revision, from the history, in pages of 2", through, metav1.ListOptions{
		Limit: 2, LabelSelector: "team=a", ResourceVersion: strconv.FormatUint(from, 10), ResourceVersionMatch: metav1.ResourceVersionMatchExact,
	}, func() {}))
	lists[2].Selects = teamA
	<-churned
	// One object certainly ends deleted: its last state is a deletion each sink must have. Once
	// the reference has it, it has every change before.
	if err := cms.Delete(t.Context(), "paged-01", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, time.Minute, func() error {
		if !slices.ContainsFunc(reference.events(), func(e validate.Event) bool { return e.Type == validate.Deleted && e.Key == ns+"/paged-01" }) {
			return errors.New("the apiserver's watch has not had the last write yet")
		}
		return nil
	})

	rec := validate.Record{Seed: seed, History: reference.events(), Lists: lists}
	var late []error
	deadline := time.Now().Add(time.Minute)
	for _, s := range streams {
		if err := s.waitFor(rec.History, deadline); err != nil {
			late = append(late, err)
		}
	}
	for _, s := range streams {
		s.stop()
		got := s.snapshot()
		if s.err != nil {
			late = append(late, fmt.Errorf("%s: %w", got.Name, s.err))
		}
		rec.Streams = append(rec.Streams, got)
		t.Logf("%s: %d events", got.Name, len(got.Events))
	}
	reference.stop()
	if reference.err != nil {
		late = append(late, fmt.Errorf("the reference: %w", reference.err))
	}
	for _, l := range lists {
		t.Logf("%s: %d pages", l.Name, len(l.Pages))
	}

	rec.Sinks = sinks.converged(t, time.Minute, []recorded{{source: configmapsSource, history: rec.History, attribution: reference.attr.attribution(), exact: true}})[0]
	for _, sink := range rec.Sinks {
		t.Logf("%s: %d deliveries of %d changes", sink.Name, len(sink.Deliveries), len(rec.History))
		if v := validate.Converged(rec.History, sink); len(v) > 0 {
			late = append(late, fmt.Errorf("%s: %d objects' last state not delivered within a minute, such as %s", sink.Name, len(v), v[0]))
		}
	}
	return rec, late
}

// sinks are the three a recorded run delivers to, each of a transport of its own: a webhook
// (whose answers the run chooses), a JetStream stream on a nats-server of the run's own, and a
// Kafka topic on kfake brokers of the run's own.
type sinks struct {
	webhook *receiver
	nats    *testbed.NATS
	stream  jetstream.Stream
	kafka   kafkaCluster
	selects validate.Selector // what they select: every object unless set
	cluster string            // the cluster every delivery names
}

const recordedTopic = "dynwatch"

// recordedSinks starts the sinks a run on cluster c records.
func recordedSinks(t *testing.T, c *rest.Config, webhook *receiver) sinks {
	t.Helper()
	s := sinks{webhook: webhook, nats: startNATS(t, 1), kafka: startKafka(t), cluster: clusterID(t, c)}
	s.stream = createStream(t, s.nats.URLs(), jetstream.StreamConfig{Name: "DYNWATCH", Subjects: []string{"dw.>"}})
	s.kafka.createTopic(t, recordedTopic, 3, nil)
	return s
}

// config is the sinks' part of dynwatch's configuration, the webhook's timeout as given.
func (s sinks) config(timeout string) string {
	return fmt.Sprintf(`webhooks: [{name: r, url: %s, timeout: %s, retry: {initialBackoff: 10ms, maxBackoff: 100ms}}]
jetstream: [{name: stream, servers: [%s], subjectPrefix: dw, stream: DYNWATCH, retry: {initialBackoff: 10ms, maxBackoff: 100ms}}]
kafka: [{name: topic, brokers: [%s], topic: %s, retry: {initialBackoff: 10ms, maxBackoff: 100ms}}]`,
		s.webhook.URL, timeout, strings.Join(s.nats.URLs(), ", "), strings.Join(s.kafka.brokers, ", "), recordedTopic)
}

// configmapsSource is the ce-source of configmaps' deliveries: their collection's path.
const configmapsSource = "/api/v1/configmaps"

// recorded is one resource a run recorded: the ce-source of its deliveries, its history, and
// where dynwatch listed it again.
type recorded struct {
	source  string
	history validate.History
	gaps    []validate.Gap
	// attribution is who made each version of history (see validate.Sink); exact, that
	// dynwatch followed every change one by one from the start.
	attribution map[string]validate.Attribution
	exact       bool
}

// held is what each sink holds now of the resource r, as package validate reads it: the
// webhook's deliveries in order of arrival, the stream's messages in sequence order, the
// topic's records partition by partition in offset order (an object's records are in one
// partition).
func (s sinks) held(t *testing.T, r recorded) []validate.Sink {
	t.Helper()
	out := []validate.Sink{
		{Name: "the webhook", Deliveries: deliveries(t, s.webhook, r.source)},
		{Name: "JetStream", Deliveries: streamDeliveries(t, s.stream, r.source)},
		{Name: "Kafka", Deliveries: topicDeliveries(t, s.kafka.brokers, r.source)},
	}
	for i := range out {
		out[i].Selects, out[i].Gaps, out[i].Cluster, out[i].Attribution, out[i].ExactManagers = s.selects, r.gaps, s.cluster, r.attribution, r.exact
	}
	return out
}

// converged waits, up to within, until every sink has received each object's last state in
// each resource's history, and returns what they hold then, resource by resource.
func (s sinks) converged(t *testing.T, within time.Duration, rs []recorded) [][]validate.Sink {
	t.Helper()
	for end := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
		got, done := make([][]validate.Sink, len(rs)), true
		for i, r := range rs {
			got[i] = s.held(t, r)
			for _, sink := range got[i] {
				done = done && len(validate.Converged(r.history, sink)) == 0
			}
		}
		if done || time.Now().After(end) {
			return got
		}
	}
}

// ceType is a delivery's type from its CloudEvents type.
func ceType(typ string) string {
	return strings.ToUpper(strings.TrimPrefix(typ, "io.dynwatch.resource."))
}

// streamDeliveries are the messages of s of the resource source names, in sequence order, as
// package validate reads them.
func streamDeliveries(t *testing.T, s jetstream.Stream, source string) []validate.Delivery {
	t.Helper()
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []validate.Delivery
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("read message %d: %v", seq, err)
		}
		if m.Header.Get("ce-source") != source {
			continue
		}
		d := validate.Delivery{ID: m.Header.Get("ce-id"), Type: ceType(m.Header.Get("ce-type")), Cluster: m.Header.Get("ce-cluster"),
			Key: m.Header.Get("ce-subject"), Revision: object.Revision(m.Header.Get("ce-resourceversion"))}
		d.Managers, d.Named = namedManagers(m.Data)
		out = append(out, d)
	}
	return out
}

// topicDeliveries are the records of the recorded topic of the resource source names, as
// package validate reads them.
func topicDeliveries(t *testing.T, brokers []string, source string) []validate.Delivery {
	t.Helper()
	rs, err := testbed.ReadTopic(t.Context(), brokers, recordedTopic)
	if err != nil {
		t.Fatal(err)
	}
	var out []validate.Delivery
	for _, r := range rs {
		var d validate.Delivery
		of := ""
		for _, h := range r.Headers {
			switch h.Key {
			case "ce_id":
				d.ID = string(h.Value)
			case "ce_type":
				d.Type = ceType(string(h.Value))
			case "ce_subject":
				d.Key = string(h.Value)
			case "ce_resourceversion":
				d.Revision = object.Revision(string(h.Value))
			case "ce_source":
				of = string(h.Value)
			case "ce_cluster":
				d.Cluster = string(h.Value)
			}
		}
		d.Managers, d.Named = namedManagers(r.Value)
		if of == source {
			out = append(out, d)
		}
	}
	return out
}

// deliveries are what rc received of the resource source names, as package validate reads them.
func deliveries(t *testing.T, rc *receiver, source string) []validate.Delivery {
	t.Helper()
	var out []validate.Delivery
	for _, r := range rc.got() {
		if r.source != source {
			continue
		}
		if r.parseErr != nil {
			t.Fatalf("a delivery the receiver could not read: %v", r.parseErr)
		}
		meta, _ := r.payload.Object["metadata"].(map[string]any)
		ns, _ := meta["namespace"].(string)
		name, _ := meta["name"].(string)
		rv, _ := meta["resourceVersion"].(string)
		rev, err := strconv.ParseUint(rv, 10, 64)
		if err != nil {
			t.Fatalf("a delivery of %s/%s with resourceVersion %q", ns, name, rv)
		}
		d := validate.Delivery{ID: r.ceID, Type: r.payload.Type, Key: ns + "/" + name, Revision: rev, Refused: r.code/100 != 2, Cluster: r.header.Get("Ce-Cluster")}
		d.Managers, d.Named = namedManagers(r.body)
		out = append(out, d)
	}
	return out
}

// churnConfigMaps creates, updates and deletes the configmaps cm-00 to cm-11 of ns at random, one write
// every churnEvery, for churnFor and at least churnAtLeast writes; each write labels the configmap team=a or team=b at random,
// so that it comes into and goes out of a label-selected watch.
func churnConfigMaps(t *testing.T, c *rest.Config, ns string, seed uint64) {
	cms := kubernetes.NewForConfigOrDie(c).CoreV1().ConfigMaps(ns)
	r := rand.New(rand.NewPCG(seed, seed))
	exists := map[string]bool{}
	end := time.Now().Add(churnFor)
	for n := 0; n < churnAtLeast || time.Now().Before(end); n++ {
		time.Sleep(churnEvery)
		name := fmt.Sprintf("cm-%02d", r.IntN(churnObjects))
		meta := metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": []string{"a", "b"}[r.IntN(2)]}}
		manager := []string{"churn-a", "churn-b"}[r.IntN(2)] // whom each version names
		var err error
		switch {
		case !exists[name]:
			_, err = cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{FieldManager: manager})
			exists[name] = err == nil
		case r.IntN(10) < 7:
			_, err = cms.Update(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": strconv.Itoa(r.IntN(1 << 20))}}, metav1.UpdateOptions{FieldManager: manager})
		default:
			err = cms.Delete(t.Context(), name, metav1.DeleteOptions{})
			exists[name] = err != nil
		}
		if err != nil && !apierrors.IsConflict(err) {
			t.Errorf("churn: %v", err)
			return
		}
	}
}

// pagedList lists res with opts, following each page's continue token, as package validate
// reads a list; between pages it calls between.
func pagedList(t *testing.T, name string, res dynamic.ResourceInterface, opts metav1.ListOptions, between func()) validate.List {
	t.Helper()
	l := validate.List{Name: name}
	for {
		page, err := res.List(t.Context(), opts)
		if err != nil {
			t.Fatalf("%s, page %d: %v", name, len(l.Pages), err)
		}
		rv, err := strconv.ParseUint(page.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Fatalf("%s, page %d: resourceVersion %q", name, len(l.Pages), page.GetResourceVersion())
		}
		p := validate.Page{Revision: rv, Continue: page.GetContinue() != "", Remaining: page.GetRemainingItemCount()}
		for _, o := range page.Items {
			orv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
			p.Items = append(p.Items, validate.Event{Key: o.GetNamespace() + "/" + o.GetName(), Revision: orv, Labels: labels.Set(o.GetLabels()).String()})
		}
		l.Pages = append(l.Pages, p)
		if page.GetContinue() == "" {
			return l
		}
		between()
		// A later page is asked for by its continue token alone, which holds the list's
		// resourceVersion.
		opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = page.GetContinue(), "", ""
	}
}

// recording is one watch, as it is received.
type recording struct {
	mu     sync.Mutex
	attr   *attributor // who made each version it received
	stream validate.Stream
	err    error // an ERROR event, or the watch ending before stop
	w      watch.Interface
	done   chan struct{}
	closed bool
}

// record opens a watch with opts and records every event it receives until stop.
func record(t *testing.T, name string, res dynamic.ResourceInterface, opts metav1.ListOptions) *recording {
	t.Helper()
	w, err := res.Watch(t.Context(), opts)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	r := &recording{stream: validate.Stream{Name: name}, w: w, done: make(chan struct{}), attr: newAttributor()}
	if opts.ResourceVersion != "" {
		r.stream.From, _ = strconv.ParseUint(opts.ResourceVersion, 10, 64)
	}
	t.Cleanup(r.stop)
	go r.read()
	return r
}

// resumeFromList lists with opts and records a watch resumed from the list's resourceVersion.
func resumeFromList(t *testing.T, name string, res dynamic.ResourceInterface, opts metav1.ListOptions) *recording {
	t.Helper()
	list, err := res.List(t.Context(), opts)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	opts.ResourceVersion, opts.AllowWatchBookmarks = list.GetResourceVersion(), true
	return record(t, name, res, opts)
}

func (r *recording) read() {
	defer close(r.done)
	for e := range r.w.ResultChan() {
		r.mu.Lock()
		if e.Type == watch.Error {
			if !r.closed { // client-go reports its own stop as an error from the stream
				r.err = fmt.Errorf("ERROR event: %w", apierrors.FromObject(e.Object))
			}
			r.mu.Unlock()
			continue
		}
		u, ok := e.Object.(*unstructured.Unstructured)
		if !ok {
			r.err = fmt.Errorf("a %s event of a %T", e.Type, e.Object)
			r.mu.Unlock()
			continue
		}
		rv, err := strconv.ParseUint(u.GetResourceVersion(), 10, 64)
		if err != nil {
			r.err = fmt.Errorf("a %s event with resourceVersion %q", e.Type, u.GetResourceVersion())
		}
		ev := validate.Event{Type: string(e.Type), Revision: rv}
		if e.Type == watch.Bookmark {
			ev.InitialEventsEnd = u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
		} else {
			ev.Key, ev.Labels = u.GetNamespace()+"/"+u.GetName(), labels.Set(u.GetLabels()).String()
			r.attr.see(e.Type, ev.Key, rv, u)
		}
		r.stream.Events = append(r.stream.Events, ev)
		r.mu.Unlock()
	}
	r.mu.Lock()
	if !r.closed && r.err == nil {
		r.err = fmt.Errorf("the watch ended after %d events", len(r.stream.Events))
	}
	r.mu.Unlock()
}

// events are the changes recorded so far.
func (r *recording) events() []validate.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stream.Events)
}

// snapshot is the stream as recorded so far.
func (r *recording) snapshot() validate.Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stream
	s.Events = slices.Clone(s.Events)
	return s
}

// waitFor waits until the stream has received the last change of history it sees, or until
// deadline.
func (r *recording) waitFor(history validate.History, deadline time.Time) error {
	s := r.snapshot()
	seen := history.View(s)
	if len(seen) == 0 {
		return nil
	}
	last := seen[len(seen)-1]
	for !slices.Contains(r.events(), last) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s had not arrived by the deadline", s.Name, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// stop ends the watch and waits until its last event is recorded.
func (r *recording) stop() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.w.Stop()
	<-r.done
}
