package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The label the watch cases select on, as upstream's cases name it.
const watchLabel = "watch-this-configmap"

// upstream is the ground of the upstream cases: a cluster of their own (one case compacts
// etcd), one dynwatch watching every configmap in it, and the two sides every case reads from.
type upstream struct {
	c     *testbed.Cluster
	cs    kubernetes.Interface
	sides [2]side // the apiserver, then dynwatch
}

// side is what a case reads from: the apiserver, or dynwatch's query API.
type side struct {
	name string
	dyn  dynamic.Interface
}

func (s side) configMaps(ns string) dynamic.ResourceInterface {
	return s.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(ns)
}

// TestTheUpstreamWatchAndPagingCasesHoldThroughTheQueryAPI runs Kubernetes' conformance cases
// for watch (test/e2e/apimachinery/watch.go: label-selected watchers, a watch from a
// resourceVersion, a watch restarted from the last one it saw, an object leaving and
// re-entering a selector, 100 watches from successive resourceVersions under churn) and for
// paging (chunking.go: pages and their remainingItemCount, an expired continue token) against
// dynwatch's query API with client-go, each step for step beside the same reads from the
// apiserver: every event dynwatch sends must equal the apiserver's, type, name,
// resourceVersion, labels and data, and every page must hold the same objects. Where the two
// may differ by design, the case says so: a list's own resourceVersion (the apiserver's is its
// storage's latest revision, dynwatch's its cache's), and how a continue token expires (the
// apiserver's with etcd's compaction, dynwatch's when newer paged lists push its snapshot out).
// The cluster is the test's own, its apiserver without the watch cache: the case that compacts
// etcd would break others' watches in the shared one, and the apiserver's watch cache serves
// pages from snapshots that an outside compaction does not expire (its own runs every 5
// minutes, which upstream's case waits for).
func TestTheUpstreamWatchAndPagingCasesHoldThroughTheQueryAPI(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{NoWatchCache: true})
	p := start(t, c.Kubeconfig, `
resources: [{version: v1, resource: configmaps}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 5000}
metrics: {address: "127.0.0.1:0"}
`)
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, _, _ := p.WaitListening(t.Context())
	u := &upstream{c: c, cs: kubernetes.NewForConfigOrDie(c.Config), sides: [2]side{
		{"the apiserver", dynamic.NewForConfigOrDie(c.Config)},
		{"dynwatch", dynamic.NewForConfigOrDie(&rest.Config{Host: api, QPS: -1})},
	}}
	t.Run("label-selected watchers see their objects' adds, updates and deletes", u.labelSelectedWatchers)
	t.Run("a watch from a resourceVersion starts after it", u.watchFromAResourceVersion)
	t.Run("a watch restarted from the last resourceVersion it saw misses nothing", u.restartedWatch)
	t.Run("an object updated out of a selector is DELETED as it was, and ADDED when it matches again", u.selectorTransitions)
	t.Run("100 watches from successive resourceVersions under churn see the same order", u.concurrentWatches)
	t.Run("pages share the first page's resourceVersion and count what remains", u.pages)
	t.Run("an expired continue token is 410 with a token that lists on from the last key", u.expiredContinue)
}

// namespace creates a namespace of the case's own.
func (u *upstream) namespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("upstream-%d", rand.Uint32())
	if _, err := u.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// cmWriter writes configmaps of ns, as upstream's cases do, through the apiserver.
type cmWriter struct {
	t   *testing.T
	cms typedcorev1.ConfigMapInterface
}

func (u *upstream) writer(t *testing.T, ns string) cmWriter {
	return cmWriter{t: t, cms: u.cs.CoreV1().ConfigMaps(ns)}
}

// create creates configmap name with the watch label set to label ("" for none).
func (w cmWriter) create(name, label string) *corev1.ConfigMap {
	w.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if label != "" {
		cm.Labels = map[string]string{watchLabel: label}
	}
	got, err := w.cms.Create(w.t.Context(), cm, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return got
}

// update changes configmap name with change and returns it as written.
func (w cmWriter) update(name string, change func(*corev1.ConfigMap)) *corev1.ConfigMap {
	w.t.Helper()
	cm, err := w.cms.Get(w.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	change(cm)
	got, err := w.cms.Update(w.t.Context(), cm, metav1.UpdateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return got
}

// mutate sets data "mutation" to n, as upstream's cases count their updates.
func (w cmWriter) mutate(name string, n int) *corev1.ConfigMap {
	return w.update(name, func(cm *corev1.ConfigMap) {
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["mutation"] = strconv.Itoa(n)
	})
}

// label sets the watch label of configmap name to label.
func (w cmWriter) label(name, label string) *corev1.ConfigMap {
	return w.update(name, func(cm *corev1.ConfigMap) {
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		cm.Labels[watchLabel] = label
	})
}

func (w cmWriter) delete(name string) {
	w.t.Helper()
	if err := w.cms.Delete(w.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// observed is a watch event as the upstream cases compare it.
type observed struct {
	typ, name, rv string
	labels, data  map[string]string
}

func (e observed) String() string {
	return fmt.Sprintf("%s %s rv=%s labels=%v data=%v", e.typ, e.name, e.rv, e.labels, e.data)
}

func (e observed) equal(o observed) bool {
	return e.typ == o.typ && e.name == o.name && e.rv == o.rv && maps.Equal(e.labels, o.labels) && maps.Equal(e.data, o.data)
}

// observedOf reads a watch event of a configmap.
func observedOf(e watch.Event) (observed, error) {
	if e.Type == watch.Error {
		return observed{}, fmt.Errorf("ERROR event: %w", apierrors.FromObject(e.Object))
	}
	u, ok := e.Object.(*unstructured.Unstructured)
	if !ok {
		return observed{}, fmt.Errorf("a %s event of a %T", e.Type, e.Object)
	}
	data, _, _ := unstructured.NestedStringMap(u.Object, "data")
	return observed{typ: string(e.Type), name: u.GetName(), rv: u.GetResourceVersion(), labels: u.GetLabels(), data: data}, nil
}

// watchBoth opens the same watch of ns's configmaps on both sides.
func (u *upstream) watchBoth(t *testing.T, ns string, opts metav1.ListOptions) [2]watch.Interface {
	t.Helper()
	var ws [2]watch.Interface
	for i, s := range u.sides {
		w, err := s.configMaps(ns).Watch(t.Context(), opts)
		if err != nil {
			t.Fatalf("%s: watch %+v: %v", s.name, opts, err)
		}
		t.Cleanup(w.Stop)
		ws[i] = w
	}
	return ws
}

// read reads w until done says it has read enough, for at most a minute.
func read(t *testing.T, who string, w watch.Interface, done func([]observed) bool) []observed {
	t.Helper()
	var got []observed
	timeout := time.After(time.Minute)
	for !done(got) {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: the watch ended after %v", who, got)
			}
			s, err := observedOf(e)
			if err != nil {
				t.Fatalf("%s: after %v: %v", who, got, err)
			}
			got = append(got, s)
		case <-timeout:
			t.Fatalf("%s: a minute passed with %v", who, got)
		}
	}
	return got
}

// until is done once an event of the configmap named last has been read.
func until(last string) func([]observed) bool {
	return func(got []observed) bool { return len(got) > 0 && got[len(got)-1].name == last }
}

// count is done once n events have been read.
func count(n int) func([]observed) bool {
	return func(got []observed) bool { return len(got) >= n }
}

// readBoth reads both sides' watches until done.
func (u *upstream) readBoth(t *testing.T, ws [2]watch.Interface, done func([]observed) bool) [2][]observed {
	t.Helper()
	var got [2][]observed
	for i, w := range ws {
		got[i] = read(t, u.sides[i].name, w, done)
	}
	return got
}

// same fails t unless the apiserver's events have the types upstream's case expects, and
// dynwatch's equal the apiserver's, event for event.
func same(t *testing.T, what string, got [2][]observed, want ...watch.EventType) {
	t.Helper()
	var types []watch.EventType
	for _, e := range got[0] {
		types = append(types, watch.EventType(e.typ))
	}
	if !slices.Equal(types, want) {
		t.Errorf("%s: the apiserver sent %v; upstream's case expects %v", what, got[0], want)
	}
	if !slices.EqualFunc(got[0], got[1], observed.equal) {
		t.Errorf("%s: dynwatch sent\n\t%v\nthe apiserver\n\t%v", what, got[1], got[0])
	}
}

// labelSelectedWatchers: watch.go's "should observe add, update, and delete watch
// notifications on configmaps", with three watchers (label A, label B, A or B).
func (u *upstream) labelSelectedWatchers(t *testing.T) {
	ns := u.namespace(t)
	const a, b = "multiple-watchers-A", "multiple-watchers-B"
	watchA := u.watchBoth(t, ns, metav1.ListOptions{LabelSelector: watchLabel + "=" + a})
	watchB := u.watchBoth(t, ns, metav1.ListOptions{LabelSelector: watchLabel + "=" + b})
	watchAB := u.watchBoth(t, ns, metav1.ListOptions{LabelSelector: watchLabel + " in (" + a + "," + b + ")"})
	w := u.writer(t, ns)
	w.create("e2e-watch-test-configmap-a", a)
	w.mutate("e2e-watch-test-configmap-a", 1)
	w.mutate("e2e-watch-test-configmap-a", 2)
	w.delete("e2e-watch-test-configmap-a")
	w.create("e2e-watch-test-configmap-b", b)
	w.mutate("e2e-watch-test-configmap-b", 1)
	w.delete("e2e-watch-test-configmap-b")
	// Upstream waits a moment for events that must not come; a last object each watch selects
	// marks where its events end instead.
	w.create("end-a", a)
	w.create("end-b", b)
	same(t, "label A", u.readBoth(t, watchA, until("end-a")),
		watch.Added, watch.Modified, watch.Modified, watch.Deleted, watch.Added)
	same(t, "label B", u.readBoth(t, watchB, until("end-b")),
		watch.Added, watch.Modified, watch.Deleted, watch.Added)
	same(t, "label A or B", u.readBoth(t, watchAB, until("end-b")),
		watch.Added, watch.Modified, watch.Modified, watch.Deleted, watch.Added, watch.Modified, watch.Deleted, watch.Added, watch.Added)
}

// watchFromAResourceVersion: "should be able to start watching from a specific resource
// version": a watch from the first update's resourceVersion, opened after the configmap was
// updated again and deleted, gets the second update and the deletion.
func (u *upstream) watchFromAResourceVersion(t *testing.T) {
	ns := u.namespace(t)
	w := u.writer(t, ns)
	w.create("e2e-watch-test-resource-version", "")
	first := w.mutate("e2e-watch-test-resource-version", 1)
	w.mutate("e2e-watch-test-resource-version", 2)
	w.delete("e2e-watch-test-resource-version")
	w.create("end", "")
	ws := u.watchBoth(t, ns, metav1.ListOptions{ResourceVersion: first.ResourceVersion})
	same(t, "from the first update", u.readBoth(t, ws, until("end")), watch.Modified, watch.Deleted, watch.Added)
}

// restartedWatch: "should be able to restart watching from the last resource version observed
// by the previous watch": each side's watch stops after two events and restarts from the
// resourceVersion of the last it saw.
func (u *upstream) restartedWatch(t *testing.T) {
	ns := u.namespace(t)
	const label, name = "watch-closed-and-restarted", "e2e-watch-test-watch-closed"
	selector := metav1.ListOptions{LabelSelector: watchLabel + "=" + label}
	ws := u.watchBoth(t, ns, selector)
	w := u.writer(t, ns)
	w.create(name, label)
	w.mutate(name, 1)
	before := u.readBoth(t, ws, count(2))
	same(t, "before the restart", before, watch.Added, watch.Modified)
	for _, w := range ws {
		w.Stop()
	}
	w.mutate(name, 2)
	w.delete(name)
	w.create("end", label)
	var after [2][]observed
	for i, s := range u.sides {
		opts := selector
		opts.ResourceVersion = before[i][len(before[i])-1].rv
		rw, err := s.configMaps(ns).Watch(t.Context(), opts)
		if err != nil {
			t.Fatalf("%s: restart the watch: %v", s.name, err)
		}
		t.Cleanup(rw.Stop)
		after[i] = read(t, s.name, rw, until("end"))
	}
	same(t, "after the restart", after, watch.Modified, watch.Deleted, watch.Added)
}

// selectorTransitions: "should observe an object deletion if it stops meeting the requirements
// of the selector": relabelled out of the selector, the configmap is DELETED, carrying its last
// state the watch selected at the update's resourceVersion, as the apiserver sends it; an update
// while out is not observed; relabelled back, it is ADDED.
func (u *upstream) selectorTransitions(t *testing.T) {
	ns := u.namespace(t)
	const label, name = "label-changed-and-restored", "e2e-watch-test-label-changed"
	ws := u.watchBoth(t, ns, metav1.ListOptions{LabelSelector: watchLabel + "=" + label})
	w := u.writer(t, ns)
	w.create(name, label)
	w.mutate(name, 1)
	w.label(name, "wrong-value")
	w.mutate(name, 2)
	w.label(name, label)
	w.mutate(name, 3)
	w.delete(name)
	w.create("end", label)
	same(t, "label changed and restored", u.readBoth(t, ws, until("end")),
		watch.Added, watch.Modified, watch.Deleted, watch.Added, watch.Modified, watch.Deleted, watch.Added)
}

// concurrentWatches: "should receive events on concurrent watches in same order": under
// configmaps created, updated and deleted every 5 ms, a watch is opened from the
// resourceVersion of each of the first watch's events in turn, 100 in all, each a client-go
// RetryWatcher, and every one must see each next event with the first watch's resourceVersion.
// Both sides run it at once over the same churn.
func (u *upstream) concurrentWatches(t *testing.T) {
	const watches = 100
	ns := u.namespace(t)
	churning, stop := context.WithCancel(t.Context())
	churned := make(chan error, 1)
	go func() { churned <- produceConfigMapEvents(churning, u.cs.CoreV1().ConfigMaps(ns)) }()
	var wg sync.WaitGroup
	errs := make([]error, len(u.sides))
	for i, s := range u.sides {
		wg.Go(func() { errs[i] = sameOrder(t.Context(), s.configMaps(ns), watches) })
	}
	wg.Wait()
	stop()
	if err := <-churned; err != nil {
		t.Fatalf("churn: %v", err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", u.sides[i].name, err)
		}
	}
}

// produceConfigMapEvents creates, updates and deletes configmaps of cms every 5 ms until ctx
// ends, as upstream's helper of that name does.
func produceConfigMapEvents(ctx context.Context, cms typedcorev1.ConfigMapInterface) error {
	var existing []int
	next := 0
	for tick := time.NewTicker(5 * time.Millisecond); ; {
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil
		case <-tick.C:
		}
		name := func(i int) string { return fmt.Sprintf("cm-%d", i) }
		var err error
		switch op := rand.IntN(3); {
		case op == 0 || len(existing) == 0:
			_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name(next)}}, metav1.CreateOptions{})
			existing = append(existing, next)
			next++
		case op == 1:
			i := existing[rand.IntN(len(existing))]
			_, err = cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name(i)}, Data: map[string]string{"mutation": strconv.Itoa(rand.Int())}}, metav1.UpdateOptions{})
		default:
			k := rand.IntN(len(existing))
			err = cms.Delete(ctx, name(existing[k]), metav1.DeleteOptions{})
			existing = slices.Delete(existing, k, k+1)
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// sameOrder opens n RetryWatchers of res, each from the resourceVersion of the first one's
// latest event, and reads every one's next event in step: each must have the first's
// resourceVersion.
func sameOrder(ctx context.Context, res dynamic.ResourceInterface, n int) error {
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return res.Watch(ctx, opts)
	}}
	rv := list.GetResourceVersion()
	var ws []*watchtools.RetryWatcher
	defer func() {
		for _, w := range ws {
			w.Stop()
		}
	}()
	next := func(w *watchtools.RetryWatcher) (string, error) {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				return "", errors.New("the watch ended")
			}
			s, err := observedOf(e)
			return s.rv, err
		case <-time.After(time.Minute):
			return "", errors.New("no event within a minute")
		}
	}
	for i := range n {
		w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
		if err != nil {
			return fmt.Errorf("watch %d from %s: %w", i, rv, err)
		}
		ws = append(ws, w)
		if rv, err = next(ws[0]); err != nil {
			return fmt.Errorf("the first watch, event %d: %w", i, err)
		}
		for j, w := range ws[1:] {
			got, err := next(w)
			if err != nil {
				return fmt.Errorf("watch %d, event %d: %w", j+1, i-j-1, err)
			}
			if got != rv {
				return fmt.Errorf("watch %d's next event has resourceVersion %s; the first watch's %s", j+1, got, rv)
			}
		}
	}
	return nil
}

// The configmaps the paging cases list, and their page.
const (
	pagedObjects = 400
	pageSize     = pagedObjects / 10
)

// pagedNamespace creates a namespace of pagedObjects configmaps and waits until dynwatch holds
// them all.
func (u *upstream) pagedNamespace(t *testing.T) string {
	ns := u.namespace(t)
	if err := testbed.CreateConfigMaps(t.Context(), u.c.Config, pagedObjects, testbed.NumberedConfigMap(ns, "template-%04d")); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, time.Minute, func() error {
		l, err := u.sides[1].configMaps(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) != pagedObjects {
			return fmt.Errorf("dynwatch lists %d configmaps of %d", len(l.Items), pagedObjects)
		}
		return nil
	})
	return ns
}

// itemsOf is a list's objects as the paging cases compare them: name@resourceVersion.
func itemsOf(l *unstructured.UnstructuredList) []string {
	var out []string
	for _, o := range l.Items {
		out = append(out, o.GetName()+"@"+o.GetResourceVersion())
	}
	return out
}

// listPages lists res from opts.Continue on, pageSize at a time, checking upstream's promises of
// each page: the first page's resourceVersion, a full page until the last, and a
// remainingItemCount of what is left (none on the last page). found is how many objects came
// before opts.Continue. It returns every object read and the pages' resourceVersion.
func listPages(ctx context.Context, res dynamic.ResourceInterface, opts metav1.ListOptions, found int) ([]string, string, error) {
	opts.Limit = pageSize
	var items []string
	listRV := ""
	for {
		l, err := res.List(ctx, opts)
		if err != nil {
			return nil, "", fmt.Errorf("the page after %d objects: %w", found, err)
		}
		if listRV == "" {
			listRV = l.GetResourceVersion()
		} else if l.GetResourceVersion() != listRV {
			return nil, "", fmt.Errorf("the page after %d objects has resourceVersion %s; the first page's was %s", found, l.GetResourceVersion(), listRV)
		}
		if len(l.Items) > pageSize || l.GetContinue() != "" && len(l.Items) != pageSize {
			return nil, "", fmt.Errorf("the page after %d objects has %d of a page of %d, and continue %q", found, len(l.Items), pageSize, l.GetContinue())
		}
		items = append(items, itemsOf(l)...)
		found += len(l.Items)
		remaining := l.GetRemainingItemCount()
		switch {
		case l.GetContinue() == "" && remaining != nil:
			return nil, "", fmt.Errorf("the last page has remainingItemCount %d", *remaining)
		case l.GetContinue() != "" && (remaining == nil || *remaining != int64(pagedObjects-found)):
			return nil, "", fmt.Errorf("the page ending at %d objects has remainingItemCount %v; want %d", found, remaining, pagedObjects-found)
		}
		if l.GetContinue() == "" {
			return items, listRV, nil
		}
		opts.Continue = l.GetContinue()
	}
}

// pages: chunking.go's "should return chunks of results for list calls": 400 configmaps in
// pages of 40, and all at once; the two sides must list the same objects in the same order.
func (u *upstream) pages(t *testing.T) {
	ns := u.pagedNamespace(t)
	var paged, whole [2][]string
	for i, s := range u.sides {
		items, _, err := listPages(t.Context(), s.configMaps(ns), metav1.ListOptions{}, 0)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		l, err := s.configMaps(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: list at once: %v", s.name, err)
		}
		paged[i], whole[i] = items, itemsOf(l)
	}
	if len(paged[0]) != pagedObjects || !slices.Equal(paged[0], whole[0]) {
		t.Fatalf("the apiserver listed %d configmaps in pages, and %d at once, not the same", len(paged[0]), len(whole[0]))
	}
	for what, got := range map[string][2][]string{"in pages": paged, "at once": whole} {
		if !slices.Equal(got[1], got[0]) {
			t.Errorf("%s, dynwatch listed %d configmaps (first %v), the apiserver %d (first %v)", what, len(got[1]), got[1][:min(3, len(got[1]))], len(got[0]), got[0][:min(3, len(got[0]))])
		}
	}
}

// expiredContinue: chunking.go's "should support continue listing from the last key if the
// original version has been compacted away, though the list is inconsistent". A continue token
// expires on the apiserver once etcd compacts its revision (the case compacts it); on dynwatch
// once newer paged lists push its snapshot out (the case pages through more lists than
// dynwatch keeps), which is the one way the two differ. Either way the next page is 410 Gone
// with a continue token in the status, and that token lists on after the last key from a
// resourceVersion of its own.
func (u *upstream) expiredContinue(t *testing.T) {
	ns := u.pagedNamespace(t)
	for i, s := range u.sides {
		t.Run(s.name, func(t *testing.T) {
			res := s.configMaps(ns)
			first, err := res.List(t.Context(), metav1.ListOptions{Limit: pageSize})
			if err != nil || first.GetContinue() == "" {
				t.Fatalf("the first page: continue %q, %v", first.GetContinue(), err)
			}
			// A change, so that a list from now has a resourceVersion of its own.
			u.writer(t, ns).mutate("template-0000", i+1)
			if i == 0 {
				if err := u.c.CompactEtcd(t.Context()); err != nil {
					t.Fatal(err)
				}
			} else {
				pushOutPagedLists(t, res)
			}
			var inconsistent string
			testbed.Eventually(t, 2*time.Minute, func() error {
				_, err := res.List(t.Context(), metav1.ListOptions{Limit: pageSize, Continue: first.GetContinue()})
				var status apierrors.APIStatus
				switch {
				case err == nil:
					return errors.New("the first page's continue token has not expired")
				case !apierrors.IsResourceExpired(err) || !errors.As(err, &status):
					t.Fatalf("the expired token: %v; want 410 Gone", err)
				}
				if inconsistent = status.Status().Continue; inconsistent == "" {
					t.Fatalf("410 Gone without a continue token: %v", err)
				}
				return nil
			})
			items, rv, err := listPages(t.Context(), res, metav1.ListOptions{Continue: inconsistent}, pageSize)
			if err != nil {
				t.Fatalf("with the token of the 410: %v", err)
			}
			if rv == first.GetResourceVersion() {
				t.Errorf("the pages after the 410 have the first page's resourceVersion %s; want a newer one", rv)
			}
			if want := pagedObjects - pageSize; len(items) != want || !strings.HasPrefix(items[0], fmt.Sprintf("template-%04d@", pageSize)) {
				t.Errorf("the token of the 410 listed %d configmaps from %v; want the %d after the first page", len(items), items[:min(1, len(items))], want)
			}
		})
	}
}

// pushOutPagedLists starts more paged lists of res than dynwatch keeps snapshots for, so the
// oldest list's snapshot goes.
func pushOutPagedLists(t *testing.T, res dynamic.ResourceInterface) {
	const kept = 1024 // httpapi's maxPins
	var g errgroup.Group
	g.SetLimit(8)
	for range kept + 1 {
		g.Go(func() error {
			_, err := res.List(t.Context(), metav1.ListOptions{Limit: 1})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
