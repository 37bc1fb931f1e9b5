package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/app"
	"github.com/dynwatch/dynwatch/test/testbed"
)

var cluster *testbed.Cluster

func TestMain(m *testing.M) { os.Exit(testbed.MainAll(m, &cluster)) }

// receiver records the CloudEvents type and object name of every delivery.
type receiver struct {
	mu  sync.Mutex
	got []string
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Object struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"object"`
	}
	b, _ := io.ReadAll(req.Body)
	_ = json.Unmarshal(b, &body)
	r.mu.Lock()
	r.got = append(r.got, req.Header.Get("ce-type")+" "+body.Object.Metadata.Name)
	r.mu.Unlock()
}

func (r *receiver) has(want string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.got {
		if g == want {
			return nil
		}
	}
	return fmt.Errorf("received %q; want %q among them", r.got, want)
}

// TestRunDrivesTheWholePipelineInProcess runs dynwatch in the test's own process, with leader
// election and a state store, twice over the same store: the first run delivers a created
// object and stops cleanly when its context ends; the second opens the store the first closed
// and delivers only what changed meanwhile.
func TestRunDrivesTheWholePipelineInProcess(t *testing.T) {
	ns := "app-in-process"
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	yaml := fmt.Sprintf(`resources:
  - {version: v1, resource: configmaps, namespaces: [%[1]s]}
webhooks:
  - {name: audit, url: %[2]s, namespaces: [%[1]s], resources: [configmaps]}
state: {path: %[3]s}
leaderElection: {enabled: true, namespace: %[1]s, leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 500ms}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, srv.URL, filepath.Join(dir, "state", "state.db"))
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, change func(), want string) {
		ctx, cancel := context.WithCancel(t.Context())
		log := &testbed.LockedBuffer{}
		done := make(chan error, 1)
		go func() {
			done <- app.Run(ctx, app.Options{ConfigPath: cfgPath, Kubeconfig: cluster.Kubeconfig, Log: log})
		}()
		// Run routes klog into its logger first: a client call made meanwhile would race with it.
		testbed.Eventually(t, time.Minute, func() error {
			if !strings.Contains(log.String(), `"msg":"starting"`) {
				return fmt.Errorf("no starting line in the log yet:\n%s", log)
			}
			return nil
		})
		change()
		testbed.Eventually(t, time.Minute, func() error { return rc.has(want) })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run returned %v; want nil after its context ended\n%s", err, log)
			}
		case <-time.After(time.Minute):
			t.Fatalf("Run did not return within a minute of its context ending\n%s", log)
		}
	}
	cms := cs.CoreV1().ConfigMaps(ns)
	run(t, func() {
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "first"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}, "io.dynwatch.resource.added first")
	run(t, func() {
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "second"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}, "io.dynwatch.resource.added second")
	if err := rc.has("io.dynwatch.resource.added first"); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 2 {
		t.Errorf("received %q; want each object once: the second run found the first's state in the store", rc.got)
	}
}
