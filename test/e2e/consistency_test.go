package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The load of TestEveryInformerEndsWithTheAPIServersResourceVersions. What an informer's
// initial list (or initial events) can miss is a change dynwatch has received and not yet
// applied at that moment, and a missed change is healed by the object's next one: only the misses
// of the last seconds of writes are still there at the end (each object changes about every
// churnedObjects/churnRate seconds). So the informers start close together, and the writes stop
// once the last of them has read its initial state.
const (
	mirrors        = 100           // client-go informers reading through dynwatch
	churnedObjects = 500           // configmaps the writes go round
	churnPadding   = 1 << 10       // bytes of data in each beside the changing value: the bigger the events, the busier dynwatch
	churnRate      = 400           // writes per second, in all
	churnWriters   = 32            // goroutines writing, each over its own share of the names
	churnWarmUp    = 2 * churnRate // writes made before the first informer starts
	mirrorSpacing  = 60 * time.Millisecond
	hotSelector    = "tier=hot" // the label the relabels flip, selected by a quarter of the informers
)

// TestEveryInformerEndsWithTheAPIServersResourceVersions starts 100 client-go informers of one
// namespace's configmaps through dynwatch's query API, one after another, while up to 400
// writes a second change those configmaps on the apiserver: data updates, relabels (in and out
// of the label selector a quarter of the informers use), deletes and re-creates. Half of the
// informers stream their initial list (a watch with sendInitialEvents, client-go's default),
// half list and then watch. Once the writes have stopped, every informer's cache must hold what
// the apiserver holds for its selector, name by name and resourceVersion by resourceVersion.
//
// A list answered at a resourceVersion its objects do not yet reach, or initial events that
// leave out a change the resourceVersion after them covers, leave an informer with an older
// object for good: the watch that follows does not replay the change, and once the writes stop
// nothing heals it.
//
// It has an apiserver of its own, which the writes keep busy, and measures no time: it runs
// beside the other parallel tests.
func TestEveryInformerEndsWithTheAPIServersResourceVersions(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{})
	const ns = "consistency"
	cs := kubernetes.NewForConfigOrDie(c.Config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := make([]string, churnedObjects)
	for i := range names {
		names[i] = fmt.Sprintf("cm-%04d", i)
	}
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, len(names), func(i int) *corev1.ConfigMap {
		return churnedConfigMap(ns, names[i], i%2 == 0)
	}); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, c.Kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
api: {address: "127.0.0.1:0", tls: {selfSignedCAFile: %s}}
metrics: {address: "127.0.0.1:0"}
`, ns, caFile))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, metrics, _ := p.WaitListening(t.Context())
	asAdmin := dynwatchAPI{url: url, caFile: caFile}.restConfig(c.Config.BearerToken)

	// The informers run until the test has compared them, the writes until the last informer
	// has read its initial state.
	running, stopMirrors := context.WithCancel(t.Context())
	var mirroring sync.WaitGroup
	defer func() { stopMirrors(); mirroring.Wait() }()
	w, err := newChurn(c.Config, ns)
	if err != nil {
		t.Fatal(err)
	}
	writing, stopWrites := context.WithCancel(t.Context())
	began := time.Now()
	writes := w.start(writing, names)
	defer func() { stopWrites(); _ = writes.Wait() }()
	testbed.Eventually(t, time.Minute, func() error {
		if n := w.total(); n < churnWarmUp {
			return fmt.Errorf("%d writes so far; the informers start after %d", n, churnWarmUp)
		}
		return nil
	})
	ms := make([]*mirror, mirrors)
	pace := time.NewTicker(mirrorSpacing)
	for i := range ms {
		if i > 0 {
			<-pace.C
		}
		ms[i] = startMirror(running, &mirroring, asAdmin, ns, i)
	}
	pace.Stop()
	testbed.Eventually(t, 2*time.Minute, func() error {
		for _, m := range ms {
			if m.lw.lists.Load()+m.lw.streams.Load() == 0 {
				return fmt.Errorf("%s has neither listed nor opened its stream", m)
			}
		}
		return nil
	})
	stopWrites()
	if err := writes.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("writes: %s in %s (load, not a measurement)", w, time.Since(began).Round(100*time.Millisecond))
	testbed.Eventually(t, 2*time.Minute, func() error {
		for _, m := range ms {
			if !m.informer.HasSynced() {
				return fmt.Errorf("%s has not synced", m)
			}
		}
		return nil
	})

	// Each half read its initial state as it was told to, and dynwatch answered as many lists
	// as the list-then-watch half made: the streaming half tried none. A list cut short by its
	// informer's stop is answered by dynwatch and not received, so dynwatch's count lies
	// between the lists received and those tried.
	var listed, tried float64
	for _, m := range ms {
		lists, attempts, streams := m.lw.lists.Load(), m.lw.tried.Load(), m.lw.streams.Load()
		listed, tried = listed+float64(lists), tried+float64(attempts)
		switch {
		case m.lw.listThenWatch && (lists == 0 || streams != 0):
			t.Errorf("%s listed %d times and opened %d streams; want lists and no stream", m, lists, streams)
		case !m.lw.listThenWatch && (attempts != 0 || streams == 0):
			t.Errorf("%s tried %d lists and opened %d streams; want streams and no list", m, attempts, streams)
		}
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		if n := metricValue(t, metrics, `dynwatch_api_requests_total{code="200",route="list"}`); n < listed || n > tried {
			return fmt.Errorf("dynwatch answered %v lists; the list-then-watch informers received %v of the %v they sent", n, listed, tried)
		}
		return nil
	})
	if n := metricValue(t, metrics, "dynwatch_api_watch_initial_objects_total"); n == 0 {
		t.Error("dynwatch sent no initial events; the streaming informers must have had them")
	}

	all, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hot, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{LabelSelector: hotSelector})
	if err != nil {
		t.Fatal(err)
	}
	truth := map[string]map[string]string{"": resourceVersions(all.Items), hotSelector: resourceVersions(hot.Items)}
	testbed.Eventually(t, 2*time.Minute, func() error {
		var wrong []string
		for _, m := range ms {
			if diffs := m.differences(truth[m.selector]); len(diffs) > 0 {
				wrong = append(wrong, fmt.Sprintf("%s, at resourceVersion %s: %d differences: %s",
					m, m.informer.LastSyncResourceVersion(), len(diffs), strings.Join(diffs[:min(len(diffs), 3)], "; ")))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d of %d informers differ from the apiserver (%d configmaps, %d of them %s):\n%s",
				len(wrong), len(ms), len(all.Items), len(hot.Items), hotSelector, strings.Join(wrong, "\n"))
		}
		return nil
	})
}

// churnedConfigMap is name as the test and its writes create it: padded data, and a tier label
// hot or cold.
func churnedConfigMap(ns, name string, hot bool) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"tier": tier(hot)}},
		Data:       map[string]string{"v": "0", "padding": strings.Repeat("p", churnPadding)},
	}
}

func tier(hot bool) string {
	if hot {
		return "hot"
	}
	return "cold"
}

// churn writes to a namespace's configmaps through the apiserver, at most churnRate a second in
// all: about 40% data updates, 25% relabels, and deletes and re-creates about 17% each.
type churn struct {
	cs      kubernetes.Interface
	ns      string
	limiter *rate.Limiter

	updates, relabels, deletes, creates atomic.Int64
}

func newChurn(cfg *rest.Config, ns string) (*churn, error) {
	cs, err := pacedWriter(cfg)
	if err != nil {
		return nil, err
	}
	return &churn{cs: cs, ns: ns, limiter: rate.NewLimiter(churnRate, 1)}, nil
}

// pacedWriter is a client for writes that a limiter of the test's paces: none of client-go's
// own, and protobuf, which costs the apiserver and a client under the race detector less.
func pacedWriter(cfg *rest.Config) (kubernetes.Interface, error) {
	unlimited := rest.CopyConfig(cfg)
	unlimited.QPS, unlimited.Burst = -1, 0
	unlimited.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfig(unlimited)
}

// start runs churnWriters writers until ctx ends, each over its own share of names, which must
// exist, the even-numbered ones hot. Wait returns the first write that failed.
func (c *churn) start(ctx context.Context, names []string) *errgroup.Group {
	var g errgroup.Group
	for i := range churnWriters {
		share := map[string]*churnState{}
		for j := i; j < len(names); j += churnWriters {
			share[names[j]] = &churnState{hot: j%2 == 0}
		}
		g.Go(func() error { return c.write(ctx, share) })
	}
	return &g
}

// churnState is what a writer knows of one of its configmaps.
type churnState struct{ gone, hot bool }

// write changes the configmaps of states until ctx ends. It alone writes them, so it knows
// which exist and which are hot.
func (c *churn) write(ctx context.Context, states map[string]*churnState) error {
	names := slices.Sorted(maps.Keys(states))
	cms := c.cs.CoreV1().ConfigMaps(c.ns)
	for v := 1; ; v++ {
		if c.limiter.Wait(ctx) != nil {
			return nil // the writes are over
		}
		name := names[rand.IntN(len(names))]
		s := states[name]
		var err error
		switch r := rand.IntN(10); {
		case s.gone:
			s.hot = rand.IntN(2) == 0
			_, err = cms.Create(ctx, churnedConfigMap(c.ns, name, s.hot), metav1.CreateOptions{})
			s.gone = err != nil
			c.creates.Add(1)
		case r < 5:
			_, err = cms.Patch(ctx, name, types.MergePatchType, fmt.Appendf(nil, `{"data":{"v":"%d"}}`, v), metav1.PatchOptions{})
			c.updates.Add(1)
		case r < 8:
			s.hot = !s.hot
			_, err = cms.Patch(ctx, name, types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"tier":%q}}}`, tier(s.hot)), metav1.PatchOptions{})
			c.relabels.Add(1)
		default:
			err = cms.Delete(ctx, name, metav1.DeleteOptions{})
			s.gone = err == nil
			c.deletes.Add(1)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // cut short by the end of the writes; the apiserver is read afterwards
			}
			return fmt.Errorf("write configmap %s: %w", name, err)
		}
	}
}

func (c *churn) total() int64 {
	return c.updates.Load() + c.relabels.Load() + c.deletes.Load() + c.creates.Load()
}

func (c *churn) String() string {
	return fmt.Sprintf("%d (%d updates, %d relabels, %d deletes, %d creates)",
		c.total(), c.updates.Load(), c.relabels.Load(), c.deletes.Load(), c.creates.Load())
}

// countingListWatch is a ListWatch that counts the lists its reflector was answered and the
// streams (watches with initial events) it opened. With listThenWatch it says it does not
// support watch-list semantics, so that its reflector lists, then watches from the list's
// resourceVersion; without, the reflector streams its initial list, as client-go does by
// default.
type countingListWatch struct {
	cache.ListWatch
	listThenWatch bool
	lists         atomic.Int32 // that succeeded
	tried         atomic.Int32 // lists sent, answered or not (the informer stopped meanwhile)
	streams       atomic.Int32
}

func (lw *countingListWatch) IsWatchListSemanticsUnSupported() bool { return lw.listThenWatch }

// mirror is one informer under test.
type mirror struct {
	i        int
	selector string // "" for all the namespace's configmaps
	lw       *countingListWatch
	informer cache.SharedIndexInformer
}

// startMirror starts the i-th informer through cfg, which runs until ctx ends: the odd ones list
// then watch, the even ones stream; one in four, of each mode in turn, selects hotSelector.
func startMirror(ctx context.Context, running *sync.WaitGroup, cfg *rest.Config, ns string, i int) *mirror {
	m := &mirror{i: i, lw: &countingListWatch{listThenWatch: i%2 == 1}}
	if i%4 == (i/4)%2 {
		m.selector = hotSelector
	}
	// A connection of its own, as an informer of another process has: client-go would
	// otherwise share one HTTP/2 connection between all the informers, whose reads would then
	// queue for it, and the slowest reader would set the pace of all.
	cfg = rest.CopyConfig(cfg)
	cfg.Dial = (&net.Dialer{}).DialContext
	cms := dynamic.NewForConfigOrDie(cfg).Resource(cmGVR).Namespace(ns)
	m.lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		o.LabelSelector = m.selector
		m.lw.tried.Add(1)
		list, err := cms.List(ctx, o)
		if err == nil {
			m.lw.lists.Add(1)
		}
		return list, err
	}
	m.lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = m.selector
		w, err := cms.Watch(ctx, o)
		if err == nil && o.SendInitialEvents != nil && *o.SendInitialEvents {
			m.lw.streams.Add(1)
		}
		return w, err
	}
	m.informer = cache.NewSharedIndexInformer(m.lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	running.Go(func() { m.informer.RunWithContext(ctx) })
	return m
}

func (m *mirror) String() string {
	mode := "streaming list"
	if m.lw.listThenWatch {
		mode = "list then watch"
	}
	if m.selector != "" {
		mode += ", " + m.selector
	}
	return fmt.Sprintf("informer %d (%s)", m.i, mode)
}

// differences lists, sorted by name, how the informer's cache differs from want (name →
// resourceVersion).
func (m *mirror) differences(want map[string]string) []string {
	got := map[string]string{}
	for _, o := range m.informer.GetStore().List() {
		u := o.(*unstructured.Unstructured)
		got[u.GetName()] = u.GetResourceVersion()
	}
	var diffs []string
	for name, rv := range want {
		switch have, ok := got[name]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: missing (apiserver %s)", name, rv))
		case have != rv:
			diffs = append(diffs, fmt.Sprintf("%s: apiserver %s, informer %s", name, rv, have))
		}
	}
	for name, rv := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: extra (informer %s)", name, rv))
		}
	}
	slices.Sort(diffs)
	return diffs
}

// resourceVersions maps the configmaps' names to their resourceVersions.
func resourceVersions(items []corev1.ConfigMap) map[string]string {
	rvs := make(map[string]string, len(items))
	for _, cm := range items {
		rvs[cm.Name] = cm.ResourceVersion
	}
	return rvs
}
