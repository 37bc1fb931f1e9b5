package httpapi

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

var benchObjects = flag.Int("bench-objects", 100_000, "configmaps in the benchmarks' cache")

const (
	benchNamespaces = 10
	benchApps       = 1000 // label values: 100 objects each at 100k
)

// benchFixture is a test bed loaded with configmaps and an in-process informer manager and
// API handler over them. It is built once, by the first benchmark that needs it.
type benchFixture struct {
	cluster *testbed.Cluster
	client  kubernetes.Interface
	res     *dynamicinformer.Resource
	handler http.Handler
	// authorized serves the same cache with api.auth.mode kubernetes: TokenReview and
	// SubjectAccessReview through the test bed, with decisions cached longer than a run.
	authorized http.Handler
	stop       func()
}

var (
	benchOnce sync.Once
	bench     *benchFixture
	benchErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bench != nil {
		bench.stop()
	}
	os.Exit(code)
}

func fixture(b *testing.B) *benchFixture {
	benchOnce.Do(func() { bench, benchErr = newBenchFixture(*benchObjects) })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return bench
}

func newBenchFixture(n int) (*benchFixture, error) {
	ctx := context.Background()
	cluster, err := testbed.Start(ctx, testbed.Options{})
	if err != nil {
		return nil, err
	}
	f := &benchFixture{cluster: cluster, stop: cluster.Stop}
	fast := rest.CopyConfig(cluster.Config)
	fast.QPS, fast.Burst = -1, 0 // no client-side rate limit for loading
	f.client = kubernetes.NewForConfigOrDie(fast)
	start := time.Now()
	if err := load(ctx, fast, n); err != nil {
		cluster.Stop()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "loaded %d configmaps in %s\n", n, time.Since(start).Round(time.Second))

	cfgPath := filepath.Join(cluster.Dir, "bench.yaml")
	if err := os.WriteFile(cfgPath, []byte("resources:\n  - {version: v1, resource: configmaps, indexers: [{name: byApp, type: label, key: app}]}\n"), 0o600); err != nil {
		return nil, err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.DiscardHandler)
	hub := NewHub(1000)
	objects, err := dynamicinformer.NewJSONClient(fast)
	if err != nil {
		return nil, err
	}
	mgr, err := dynamicinformer.New(dynamicinformer.Options{
		Logger: log, JSON: objects, Dynamic: dynamic.NewForConfigOrDie(fast), Metadata: metadata.NewForConfigOrDie(fast), Discovery: discovery.NewDiscoveryClientForConfigOrDie(fast),
		Registerer: prometheus.NewRegistry(), Resources: cfg.Resources, Interval: time.Second,
		Subscribers: []dynamicinformer.Subscriber{hub},
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = mgr.Run(runCtx); close(done) }()
	f.stop = func() { cancel(); <-done; cluster.Stop() }
	start = time.Now()
	for ok, _ := mgr.Ready(); !ok; ok, _ = mgr.Ready() {
		if time.Since(start) > 5*time.Minute {
			f.stop()
			return nil, fmt.Errorf("cache did not sync within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.res, _ = mgr.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	fmt.Fprintf(os.Stderr, "cache synced %d objects in %s\n", f.res.Snapshot().Len(), time.Since(start).Round(time.Millisecond))
	opts := APIOptions{Logger: log, Informers: mgr, Watches: hub, Registerer: prometheus.NewRegistry(),
		MaxPageSize: 500, RequestTimeout: time.Minute, MaxWatchTimeout: time.Minute, Limits: cfg.API.Limits}
	if f.handler, err = NewAPI(opts); err != nil {
		return nil, err
	}
	cached := config.Auth{TokenCacheTTL: time.Hour, AllowCacheTTL: time.Hour, DenyCacheTTL: time.Hour}
	reviews := kubernetes.NewForConfigOrDie(cluster.Config)
	auth, err := newDelegatedAuth(ReviewClients{Tokens: reviews, TokensLimit: cfg.Client.RateLimits.Reviews, Access: reviews, AccessLimit: cfg.Client.RateLimits.AccessReviews}, cached, cfg.API.Limits, nil)
	if err != nil {
		return nil, err
	}
	go func() { _ = auth.Run(runCtx) }()
	opts.Authenticator, opts.Authorizer = auth.authn, auth.authz
	opts.Registerer = prometheus.NewRegistry()
	f.authorized, err = NewAPI(opts)
	return f, err
}

// load creates n configmaps across namespaces, with app labels from a set of benchApps.
func load(ctx context.Context, cfg *rest.Config, n int) error {
	cs := kubernetes.NewForConfigOrDie(cfg)
	for i := range benchNamespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return testbed.CreateConfigMaps(ctx, cfg, n, func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: fmt.Sprintf("bench-%d", i%benchNamespaces),
				Name:      fmt.Sprintf("cm-%06d", i),
				Labels:    map[string]string{"app": fmt.Sprintf("app-%03d", i%benchApps), "tier": "bench"},
			},
			Data: map[string]string{"index": fmt.Sprint(i), "payload": "0123456789abcdef0123456789abcdef"},
		}
	})
}

// updating changes random objects through the apiserver until the returned stop is called.
func (f *benchFixture) updating(b *testing.B, n int) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var updates atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := rand.IntN(n)
				ns, name := fmt.Sprintf("bench-%d", i%benchNamespaces), fmt.Sprintf("cm-%06d", i)
				patch := fmt.Appendf(nil, `{"data":{"touched":"%d"}}`, time.Now().UnixNano())
				if _, err := f.client.CoreV1().ConfigMaps(ns).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err == nil {
					updates.Add(1)
				}
			}
		})
	}
	return func() int64 { cancel(); wg.Wait(); return updates.Load() }
}

// BenchmarkIndexLookup measures finding the objects of one label value through the index.
func BenchmarkIndexLookup(b *testing.B) {
	f := fixture(b)
	i := 0
	for b.Loop() {
		by, ok := f.res.Snapshot().ByIndex("byApp", fmt.Sprintf("app-%03d", i%benchApps))
		n := 0
		by.Scan("", dynamicinformer.Key{}, func(*object.Object) bool { n++; return true })
		if !ok || n == 0 {
			b.Fatalf("ByIndex: %d objects, index found %t", n, ok)
		}
		i++
	}
}

// BenchmarkListPage measures a 50-item page of a label-selected list served through the HTTP
// handler, by index, with the apiserver quiet, while objects are being updated, and (quiet)
// to an authenticated and authorized caller whose decisions are cached.
func BenchmarkListPage(b *testing.B) {
	f := fixture(b)
	for _, mode := range []string{"quiet", "authorized", "updating"} {
		b.Run(mode, func(b *testing.B) {
			var stop func() int64
			handler, token := f.handler, ""
			switch mode {
			case "updating":
				stop = f.updating(b, *benchObjects)
			case "authorized":
				handler, token = f.authorized, f.cluster.Token("bob")
				f.grantList(b, "bob")
			}
			var lat []time.Duration
			i := 0
			started := time.Now()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, fmt.Sprintf("/api/v1/configmaps?labelSelector=app%%3Dapp-%03d&limit=50", i%benchApps), nil)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				rec := httptest.NewRecorder()
				t0 := time.Now()
				handler.ServeHTTP(rec, req)
				lat = append(lat, time.Since(t0))
				if rec.Code != http.StatusOK || rec.Header().Get("X-Dynwatch-Lookup") != "index/byApp" {
					b.Fatalf("status %d via %q: %s", rec.Code, rec.Header().Get("X-Dynwatch-Lookup"), rec.Body.String())
				}
				i++
			}
			elapsed := time.Since(started)
			if stop != nil {
				b.ReportMetric(float64(stop())/elapsed.Seconds(), "updates/s")
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// grantList lets user list configmaps cluster-wide and waits until the apiserver's RBAC
// agrees, so that the first decision dynwatch caches is the allowing one.
func (f *benchFixture) grantList(b *testing.B, user string) {
	ctx := context.Background()
	name := "bench-list-configmaps-" + user
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}}
	_, err := f.client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	if err == nil {
		_, err = f.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
		}, metav1.CreateOptions{})
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps"},
	}}
	testbed.Eventually(b, 30*time.Second, func() error {
		got, err := f.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if !got.Status.Allowed {
			return fmt.Errorf("RBAC does not let %s list configmaps yet", user)
		}
		return nil
	})
}
