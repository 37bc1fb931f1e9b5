package testbed

import (
	"bytes"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

var cluster *Cluster

// Every test here needs a running test bed: under -short none runs.
func TestMain(m *testing.M) { os.Exit(MainAll(m, &cluster)) }

func TestClusterServesKubectlAndClientGo(t *testing.T) {
	out, err := cluster.Kubectl(t.Context(), "create", "configmap", "hello", "--from-literal=a=b")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "configmap/hello created") {
		t.Fatalf("kubectl create said %q", out)
	}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	cm, err := cs.CoreV1().ConfigMaps("default").Get(t.Context(), "hello", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["a"] != "b" {
		t.Fatalf("data = %v, want a=b", cm.Data)
	}
}

func TestRestartAPIServerKeepsData(t *testing.T) {
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survivor"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.RestartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(t.Context(), "survivor", metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestCompactEtcdExpiresOldResourceVersions(t *testing.T) {
	c, err := Start(t.Context(), Options{Dir: t.TempDir(), NoWatchCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cs := kubernetes.NewForConfigOrDie(c.Config)
	configMaps := cs.CoreV1().ConfigMaps("default")
	cm, err := configMaps.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "compacted"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := cm.ResourceVersion
	for _, v := range []string{"a", "b", "c"} {
		cm.Data = map[string]string{"v": v}
		if cm, err = configMaps.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	watchFrom := func() (watch.Event, error) {
		w, err := configMaps.Watch(t.Context(), metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", "compacted").String(),
			ResourceVersion: first,
		})
		if err != nil {
			return watch.Event{}, err
		}
		defer w.Stop()
		return <-w.ResultChan(), nil
	}
	ev, err := watchFrom()
	if err != nil || ev.Type != watch.Modified {
		t.Fatalf("before compaction, a watch from %s got %v, %v; want a MODIFIED event", first, ev.Type, err)
	}
	if err := c.CompactEtcd(t.Context()); err != nil {
		t.Fatal(err)
	}
	ev, err = watchFrom()
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	if st, ok := ev.Object.(*metav1.Status); err == nil && ok && st.Code == http.StatusGone {
		return
	}
	t.Fatalf("after compaction, a watch from %s got %v %v, %v; want 410 Gone", first, ev.Type, ev.Object, err)
}

// TestAProxyCutEndsItsConnectionsAndRefusesNewOnesUntilRestored: a watch through the proxy
// ends when the network is cut, a request fails while it is, and works once it is restored.
func TestAProxyCutEndsItsConnectionsAndRefusesNewOnesUntilRestored(t *testing.T) {
	p, err := NewProxy(strings.TrimPrefix(cluster.URL(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Host = "https://" + p.Addr()
	cfg.Timeout = 5 * time.Second
	cs := kubernetes.NewForConfigOrDie(cfg)
	w, err := cs.CoreV1().Namespaces().Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	p.Cut()
	for range w.ResultChan() { // the namespaces that exist, then the end
	}
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err == nil {
		t.Error("a request through the cut proxy succeeded")
	}
	p.Restore()
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Errorf("a request through the restored proxy: %v", err)
	}
}

// Tests issue one user's certificate in parallel (every fixture of the secured dynwatch has
// erin): a pair issued later must not be written over one a client already loads.
func TestAClientCertificateIssuedAgainLeavesTheFirstPairWhole(t *testing.T) {
	first, firstKey, err := cluster.ClientCert("erin", "readers")
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	second, secondKey, err := cluster.ClientCert("erin", "readers")
	if err != nil {
		t.Fatal(err)
	}
	if after, err := os.ReadFile(first); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the first certificate changed when the user's was issued again (err %v)", err)
	}
	for _, pair := range [][2]string{{first, firstKey}, {second, secondKey}} {
		cfg := rest.CopyConfig(cluster.Config)
		cfg.BearerToken, cfg.BearerTokenFile = "", ""
		cfg.CertFile, cfg.KeyFile = pair[0], pair[1]
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Authenticated as erin, who has no rights here: forbidden, not unauthorized.
		_, err = cs.CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("%s: listing as erin: %v, want forbidden", pair[0], err)
		}
	}
}
