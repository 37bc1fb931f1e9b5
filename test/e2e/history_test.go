package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

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

	"github.com/dynwatch/dynwatch/test/testbed"
	"github.com/dynwatch/dynwatch/test/validate"
)

// The churn the recorded watches run under.
const (
	churnObjects = 12               // configmaps the writes go round
	churnFor     = 15 * time.Second // how long they last
	churnEvery   = 25 * time.Millisecond
)

// TestEveryWatchThroughTheQueryAPIKeepsTheApiserversHistory records, while configmaps of one
// namespace are created, updated and deleted at random (the seed is logged, and
// DYNWATCH_TEST_SEED sets it), the apiserver's own watch of them from before the first write
// (the reference history) and five watches through dynwatch's query API: one resumed from a
// list's resourceVersion, one that asks for initial events, one of a single object by field
// selector, one by a label selector that the writes move objects into and out of, and one
// resumed from a resourceVersion some seconds old; and two paged lists through it, one by the
// label selector. Once every watch has received its last change, each must keep every promise
// package validate checks against the reference: Ordered, Unique, Atomic, Bookmarkable,
// Reliable, Resumable, and the initial state at its bookmark; and each list's pages must share
// a resourceVersion and hold the objects as the reference had them there. A webhook beside
// them, which answers the first attempt at four changes in ten 503, 429, slowly or too late
// (the seed chooses which), must take every change, first arrivals in order per object, each
// under one id, and no version the apiserver never had. No fault is injected in dynwatch or
// the apiserver yet: those are the catalogue's to come.
func TestEveryWatchThroughTheQueryAPIKeepsTheApiserversHistory(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("DYNWATCH_TEST_SEED"), 10, 64); err == nil {
		seed = s // the writes and the webhook's faults of a run to look at again; their timing is the machine's
	}
	t.Logf("seed %d (DYNWATCH_TEST_SEED=%[1]d makes the same writes and faults)", seed)
	// The webhook's faults, chosen for each change by the seed (seededAnswer).
	rc := newJudge(t, func(r received, n int, h http.Header) int { return seededAnswer(seed, r, n, h) })
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s, timeout: 1s, retry: {initialBackoff: 10ms, maxBackoff: 100ms}}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 5000}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, _, _ := p.WaitListening(t.Context())
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	upstream := dynamic.NewForConfigOrDie(cluster.Config).Resource(gvr).Namespace(ns)
	through := dynamic.NewForConfigOrDie(&rest.Config{Host: api}).Resource(gvr).Namespace(ns)

	list, err := upstream.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reference := record(t, "the apiserver", upstream, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})

	churned := make(chan struct{})
	go func() { defer close(churned); churnConfigMaps(t, ns, seed) }()

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
	streams[2].stream.Match = func(e validate.Event) bool { return e.Key == ns+"/cm-03" }
	time.Sleep(2 * time.Second)
	teamA := func(e validate.Event) bool { return e.Labels == "team=a" }
	streams = append(streams, resumeFromList(t, "team=a by label selector", through, metav1.ListOptions{LabelSelector: "team=a"}))
	streams[3].stream.Match = teamA
	lists := []validate.List{
		pagedList(t, "in pages of 3", through, metav1.ListOptions{Limit: 3}),
		pagedList(t, "team=a in pages of 2", through, metav1.ListOptions{Limit: 2, LabelSelector: "team=a"}),
	}
	lists[1].Match, lists[1].Selectors = teamA, true
	old := reference.events()
	if len(old) < 10 {
		t.Fatalf("the apiserver's watch has %d changes 8 s into the churn", len(old))
	}
	from := old[len(old)*2/3].Revision // some seconds ago
	streams = append(streams, record(t, "resumed from an older revision", through, metav1.ListOptions{ResourceVersion: strconv.FormatUint(from, 10), AllowWatchBookmarks: true}))
	<-churned

	history := validate.History(reference.events())
	for _, s := range streams {
		s.waitFor(t, history)
	}
	for _, s := range streams {
		s.stop()
		got := s.snapshot()
		if s.err != nil {
			t.Errorf("%s: %v", got.Name, s.err)
		}
		for _, v := range validate.Watch(history, got) {
			t.Error(v)
		}
		t.Logf("%s: %d events", got.Name, len(got.Events))
	}
	reference.stop()
	if reference.err != nil {
		t.Errorf("the reference: %v", reference.err)
	}
	for _, l := range lists {
		for _, v := range validate.Paged(history, l) {
			t.Error(v)
		}
		t.Logf("%s: %d pages", l.Name, len(l.Pages))
	}

	// The webhook: every change, in order per object, each under one id.
	sink := validate.Sink{Name: "the webhook"}
	testbed.Eventually(t, time.Minute, func() error {
		sink.Deliveries = deliveries(t, rc)
		if v := validate.Converged(history, sink); len(v) > 0 {
			return fmt.Errorf("%d objects' last state not delivered yet, such as %s", len(v), v[0])
		}
		return nil
	})
	for _, v := range append(validate.Deliveries(history, sink), validate.Delivered(history, sink)...) {
		t.Error(v)
	}
	t.Logf("the webhook: %d deliveries of %d changes", len(sink.Deliveries), len(history))
}

// deliveries are what rc received, as package validate reads them.
func deliveries(t *testing.T, rc *receiver) []validate.Delivery {
	t.Helper()
	var out []validate.Delivery
	for _, r := range rc.got() {
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
		out = append(out, validate.Delivery{ID: r.ceID, Type: r.payload.Type, Key: ns + "/" + name, Revision: rev, Refused: r.code/100 != 2})
	}
	return out
}

// churnConfigMaps creates, updates and deletes the configmaps cm-00 to cm-11 of ns at random, one write
// every churnEvery, for churnFor; each write labels the configmap team=a or team=b at random,
// so that it comes into and goes out of a label-selected watch.
func churnConfigMaps(t *testing.T, ns string, seed uint64) {
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	r := rand.New(rand.NewPCG(seed, seed))
	exists := map[string]bool{}
	for end := time.Now().Add(churnFor); time.Now().Before(end); time.Sleep(churnEvery) {
		name := fmt.Sprintf("cm-%02d", r.IntN(churnObjects))
		meta := metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": []string{"a", "b"}[r.IntN(2)]}}
		var err error
		switch {
		case !exists[name]:
			_, err = cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{})
			exists[name] = err == nil
		case r.IntN(10) < 7:
			_, err = cms.Update(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": strconv.Itoa(r.IntN(1 << 20))}}, metav1.UpdateOptions{})
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
// reads a list.
func pagedList(t *testing.T, name string, res dynamic.ResourceInterface, opts metav1.ListOptions) validate.List {
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
		opts.Continue = page.GetContinue()
	}
}

// recording is one watch, as it is received.
type recording struct {
	mu     sync.Mutex
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
	r := &recording{stream: validate.Stream{Name: name}, w: w, done: make(chan struct{})}
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

// waitFor waits until the stream has received the last change of history it sees.
func (r *recording) waitFor(t *testing.T, history validate.History) {
	t.Helper()
	s := r.snapshot()
	seen := history.View(s)
	if len(seen) == 0 {
		return
	}
	last := seen[len(seen)-1]
	deadline := time.Now().Add(time.Minute)
	for !slices.Contains(r.events(), last) {
		if time.Now().After(deadline) {
			t.Errorf("%s: %s did not arrive within a minute", s.Name, last)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the watch and waits until its last event is recorded.
func (r *recording) stop() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.w.Stop()
	<-r.done
}
