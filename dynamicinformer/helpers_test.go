package dynamicinformer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

var cluster *testbed.Cluster

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, &cluster)) }

// recorder is a Subscriber that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []object.Event
}

func (r *recorder) OnEvent(e object.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// find returns the events for namespace/name, in order.
func (r *recorder) find(namespace, name string) []object.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []object.Event
	for _, e := range r.events {
		if e.Object.GetNamespace() == namespace && e.Object.GetName() == name {
			out = append(out, e)
		}
	}
	return out
}

type started struct {
	*Manager
	registry *prometheus.Registry
	logs     *testbed.LockedBuffer
}

// logsOf is what the Manager has logged so far.
func (s started) logsOf() string { return s.logs.String() }

// startManager runs a Manager for the YAML configuration against the test bed until the test
// ends. Its log is printed if the test fails.
func startManager(t testing.TB, restConfig *rest.Config, yaml string, subs ...Subscriber) started {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testbed.LockedBuffer{}
	reg := prometheus.NewRegistry()
	m, err := New(Options{
		Logger:           slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		JSON:             jsonClient(t, restConfig),
		Dynamic:          dynamic.NewForConfigOrDie(restConfig),
		Metadata:         metadata.NewForConfigOrDie(restConfig),
		Discovery:        discovery.NewDiscoveryClientForConfigOrDie(restConfig),
		Registerer:       reg,
		Resources:        cfg.Resources,
		Interval:         time.Second,
		Subscribers:      subs,
		ConsistencyCheck: cfg.ConsistencyCheck.Every(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
		if t.Failed() {
			t.Logf("manager log:\n%s", logs)
		}
	})
	return started{Manager: m, registry: reg, logs: logs}
}

func waitReady(t *testing.T, m started) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() error {
		if ok, lag := m.Ready(); !ok {
			return fmt.Errorf("not ready: %v", lag)
		}
		return nil
	})
}

// resource returns the configured resource named name (resource.version.group).
func resource(t testing.TB, m started, name string) *Resource {
	t.Helper()
	for _, r := range m.Resources() {
		if r.Name() == name {
			return r
		}
	}
	t.Fatalf("no resource %s", name)
	return nil
}

// namespaces creates n namespaces with unique names.
func namespaces(t testing.TB, n int) []string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	var out []string
	for range n {
		suffix := make([]byte, 3)
		_, _ = rand.Read(suffix)
		name := "t-" + hex.EncodeToString(suffix)
		if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		out = append(out, name)
	}
	return out
}

// decoded is o decoded, nil for nil.
func decoded(t testing.TB, o *object.Object) *unstructured.Unstructured {
	t.Helper()
	if o == nil {
		return nil
	}
	u, err := o.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// names returns the sorted namespace/name keys of objs.
func names(objs []*object.Object) string {
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		keys = append(keys, strings.TrimPrefix(o.GetNamespace()+"/"+o.GetName(), "/"))
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

// scanned is every object s's Scan of namespace ("" for all) yields, in its order.
func scanned(s Snapshot, namespace string) []*object.Object {
	var objs []*object.Object
	s.Scan(namespace, Key{}, func(o *object.Object) bool {
		objs = append(objs, o)
		return true
	})
	return objs
}

// cacheHas waits until the resource's cache holds exactly the objects with the namespace/name
// keys given.
func cacheHas(t *testing.T, r *Resource, keys ...string) {
	t.Helper()
	slices.Sort(keys)
	want := strings.Join(keys, " ")
	testbed.Eventually(t, 20*time.Second, func() error {
		if got := names(scanned(r.Snapshot(), "")); got != want {
			return fmt.Errorf("cache of %s holds %q, want %q", r.Name(), got, want)
		}
		return nil
	})
}

// metricValue returns the value of the metric name whose label values are labels, in order.
func metricValue(t *testing.T, m started, name string, labels ...string) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, metric := range f.GetMetric() {
			for i, lp := range metric.GetLabel() {
				if i >= len(labels) || lp.GetValue() != labels[i] {
					continue metrics
				}
			}
			if c := metric.GetCounter(); c != nil {
				return c.GetValue()
			}
			return metric.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func jsonClient(t testing.TB, c *rest.Config) rest.Interface {
	t.Helper()
	client, err := NewJSONClient(c)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// valuesOf is each of o's indexers' values, in the store's order.
func valuesOf(o *object.Object) [][]string {
	out := make([][]string, o.IndexCount())
	for i := range out {
		for j := range o.IndexValueCount(i) {
			out[i] = append(out[i], o.IndexValue(i, j))
		}
	}
	return out
}

// withValues is o with values as its indexers' values, for a store of as many indexers.
func withValues(o *object.Object, values ...[]string) *object.Object {
	u, err := o.Decode()
	if err != nil {
		panic(err)
	}
	ix := make([]object.Indexer, len(values))
	for i, v := range values {
		ix[i].Values = func(*unstructured.Unstructured) []string { return v }
	}
	return object.NewIndexed(u, ix, nil, nil)
}

// keptPer is the live heap fn leaves behind, divided by n: the heap after a collection, after
// fn, less the heap after one before it.
func keptPer(n int, fn func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(n)
}

// watchConfigMaps starts a manager of ns's configmaps that hands its events to rec, and waits
// until it is ready.
func watchConfigMaps(t *testing.T, ns string, rec *recorder) started {
	t.Helper()
	m := startManager(t, cluster.Config, fmt.Sprintf("resources:\n  - {version: v1, resource: configmaps, namespaces: [%s]}\n", ns), rec)
	waitReady(t, m)
	return m
}
