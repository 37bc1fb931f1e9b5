package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// gapFixture is dynwatch delivering one namespace's configmaps to a receiver, against a
// cluster of the test's own (so it may restart the apiserver and compact etcd).
type gapFixture struct {
	cluster *testbed.Cluster
	rc      *receiver
	p       *runner.Process
	client  *kubernetes.Clientset
	ns      string
	config  string // dynwatch's configuration file
}

func startGapFixture(t *testing.T) gapFixture {
	t.Helper()
	c := ownCluster(t, testbed.Options{NoWatchCache: true})
	f := gapFixture{cluster: c, rc: newReceiver(t, nil, false), client: kubernetes.NewForConfigOrDie(c.Config), ns: "gaps"}
	if _, err := f.client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	yaml := fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
webhooks:
  - {name: gaps, url: %s, workers: 1}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
state: {path: %s}
`, f.ns, f.rc.URL, filepath.Join(t.TempDir(), "state.db"))
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	f.config = cfg
	f.start(t)
	return f
}

// start starts dynwatch on the fixture's configuration and state, and waits until it is ready.
func (f *gapFixture) start(t *testing.T) {
	t.Helper()
	p := startReady(t, runner.Options{Config: f.config, Kubeconfig: f.cluster.Kubeconfig})
	f.p = p
}

func (f gapFixture) create(t *testing.T, name, v string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": v}}
	if _, err := f.client.CoreV1().ConfigMaps(f.ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (f gapFixture) patch(t *testing.T, name, v string) {
	t.Helper()
	if _, err := f.client.CoreV1().ConfigMaps(f.ns).Patch(t.Context(), name, "application/merge-patch+json", fmt.Appendf(nil, `{"data":{"v":%q}}`, v), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (f gapFixture) delete(t *testing.T, name string) {
	t.Helper()
	if err := f.client.CoreV1().ConfigMaps(f.ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// events summarises what the receiver got: "TYPE name v=... old=..." in arrival order.
func (f gapFixture) events() []string {
	var out []string
	for _, r := range f.rc.got() {
		s := fmt.Sprintf("%s %s v=%s", r.payload.Type, r.name(), r.data("v", false))
		if r.payload.Type == "MODIFIED" {
			s += " old=" + r.data("v", true)
		}
		out = append(out, s)
	}
	return out
}

func (f gapFixture) waitEvents(t *testing.T, want []string) {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() error {
		got := f.events()
		for _, w := range want {
			if !slices.Contains(got, w) {
				return fmt.Errorf("events so far:\n%s\nmissing %q", strings.Join(got, "\n"), w)
			}
		}
		return nil
	})
}

// TestAWatchGapLosesNoChange makes a real watch gap: it freezes dynwatch, restarts the
// apiserver (the watch breaks with nothing in flight), then changes, deletes and creates
// objects and compacts etcd (the watch cannot resume), and lets dynwatch run. Its informer
// must relist, and every change of the gap must reach the webhook; the deletion, seen only by
// the relist, comes from a DeletedFinalStateUnknown tombstone.
func TestAWatchGapLosesNoChange(t *testing.T) {
	t.Parallel()
	f := startGapFixture(t)
	for _, name := range []string{"kept", "changed", "deleted"} {
		f.create(t, name, "1")
	}
	f.waitEvents(t, []string{"ADDED kept v=1", "ADDED changed v=1", "ADDED deleted v=1"})
	// Frozen between the receiver's answer and reading it, dynwatch would time the request out
	// once it runs again and deliver it a second time, as at-least-once allows.
	_, metrics, _ := f.p.WaitListening(t.Context())
	testbed.Eventually(t, 30*time.Second, func() error {
		if n := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="gaps"}`); n != 0 {
			return fmt.Errorf("the outbox holds %v events", n)
		}
		return nil
	})

	if err := f.p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := f.cluster.RestartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.patch(t, "changed", "2")
	f.delete(t, "deleted")
	f.create(t, "created", "1")
	if err := f.cluster.CompactEtcd(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.waitEvents(t, []string{"MODIFIED changed v=2 old=1", "DELETED deleted v=1", "ADDED created v=1"})
	if got := f.events(); len(got) != 6 {
		t.Errorf("events:\n%s\nwant exactly the 3 before the gap and the 3 changes in it (nothing for kept)", strings.Join(got, "\n"))
	}
	// The relist's proof: the deletion carries the last state dynwatch knew, so its id has the
	// resourceVersion of the object's ADDED, not of the deletion.
	ids := map[string]string{}
	for _, r := range f.rc.got() {
		if r.name() == "deleted" {
			ids[r.payload.Type] = r.ceID
		}
	}
	if added, deleted := strings.TrimSuffix(ids["ADDED"], ".added"), strings.TrimSuffix(ids["DELETED"], ".deleted"); added != deleted {
		t.Errorf("the deletion came as %s after %s: from a watch event, so the gap was not a gap", ids["DELETED"], ids["ADDED"])
	}
	for _, typ := range []string{"ADDED", "MODIFIED", "DELETED"} {
		if v := metricValue(t, metrics, fmt.Sprintf(`dynwatch_informer_relist_events_total{resource="configmaps.v1",type=%q}`, typ)); v != 1 {
			t.Errorf("relist events of type %s = %v, want 1", typ, v)
		}
	}
}

// TestAnAPIServerRestartDuplicatesNothing restarts the apiserver under a running dynwatch:
// the informer re-watches from where it was, and no event is delivered twice.
func TestAnAPIServerRestartDuplicatesNothing(t *testing.T) {
	t.Parallel()
	f := startGapFixture(t)
	f.create(t, "before", "1")
	f.waitEvents(t, []string{"ADDED before v=1"})
	if err := f.cluster.RestartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.create(t, "after", "1")
	f.patch(t, "before", "2")
	f.waitEvents(t, []string{"ADDED after v=1", "MODIFIED before v=2 old=1"})
	want := []string{"ADDED before v=1", "ADDED after v=1", "MODIFIED before v=2 old=1"}
	if got := f.events(); len(got) != len(want) {
		t.Errorf("events:\n%s\nwant exactly %v", strings.Join(got, "\n"), want)
	}
}
