package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestTheConsistencyCheckFindsALostChangeRepairsTheCacheAndDeliversIt runs the binary with a
// failpoint that drops the first change its watches bring (as a bug losing an event would): the
// cache keeps the object's old version and the webhook is not told. The first consistency check
// once the watch has passed the change (the next change) finds it, counts a failure, logs the
// object and both resourceVersions, and the relist it makes delivers the change; /status says
// so until the next check passes.
func TestTheConsistencyCheckFindsALostChangeRepairsTheCacheAndDeliversIt(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil, false)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, cfg, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
webhooks:
  - {name: repaired, url: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL))
	p := startReady(t, runner.Options{Binary: failpointBinary(t), Config: cfg, BreaksCaches: true,
		Env: []string{"DYNWATCH_CONSISTENCYCHECK_PERIOD=3s", "GOFAIL_FAILPOINTS=dropChange=1*return(true)"}})
	_, metrics, _ := p.WaitListening(t.Context())
	checks := func(status string) float64 {
		return metricValue(t, metrics, fmt.Sprintf(`dynwatch_informer_consistency_checks_total{resource="configmaps.v1",status=%q}`, status))
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if n := checks("success"); n < 1 {
			return fmt.Errorf("%v checks passed, want one before the change", n)
		}
		return nil
	})

	passed := checks("success")
	cm, err := cs.CoreV1().ConfigMaps(ns).Patch(t.Context(), "target", "application/merge-patch+json", []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A check compares the cache at the resourceVersion its watch has reached, which a lost
	// change does not move: the next change does.
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if n := checks("failure"); n != 1 {
			return fmt.Errorf("%v failed checks, want 1", n)
		}
		return nil
	})
	// Found by the first check after the change, or by the one after a check under way then.
	if n := checks("success"); n > passed+1 {
		t.Errorf("%v checks passed after the change before one found it lost", n-passed)
	}
	want := fmt.Sprintf("%s/target: cache ", ns)
	if log := p.Log(); !strings.Contains(log, want) || !strings.Contains(log, "apiserver "+cm.ResourceVersion) {
		t.Errorf("the log does not name %s with the apiserver's resourceVersion %s", want, cm.ResourceVersion)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		for _, r := range rc.got() {
			if r.payload.Type == "MODIFIED" && r.name() == "target" && r.data("v", false) == "2" && r.data("v", true) == "1" {
				return nil
			}
		}
		return fmt.Errorf("the webhook has not received target's change from v=1 to v=2")
	})
	testbed.Eventually(t, 30*time.Second, func() error {
		st, err := p.Status(t.Context())
		if err != nil {
			return err
		}
		for _, r := range st.Resources {
			if c := r.Consistency; r.Resource == "configmaps.v1" && c != nil && c.Result == "success" && c.LastFailureTime != nil && c.LastCheckTime.After(*c.LastFailureTime) {
				return nil
			}
		}
		return fmt.Errorf("/status has no passing check after the failure: %+v", st.Resources)
	})
	if n := checks("failure"); n != 1 {
		t.Errorf("%v failed checks, want the one", n)
	}
}
