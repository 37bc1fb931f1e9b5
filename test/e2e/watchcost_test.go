package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// Watches opened at once by one user, of a namespace of watchedObjects, while otherObjects are
// cached in another namespace.
const (
	watchesOpened  = 200
	watchedObjects = 3
	otherObjects   = 20_000
)

// TestAWatchCostsWhatItsCallerMaySee: bob, who may read one namespace of 3 configmaps, opens 200
// watches of it at once while 20,000 configmaps are cached cluster-wide and another tenant's
// configmap changes every 100 ms. Each watch reads its namespace's 3 objects, not the cache
// (dynwatch_api_watch_initial_objects_total counts them, exactly, whatever the cache holds),
// and the other tenant's webhook keeps a p99 under 250 ms from update to receipt. (It cached
// 100,000 until creating them was found to take two of the suite's minutes: the count of
// objects read is what proves the cost, and 200 watches reading a cache of 20,000 would read
// 4 million.)
//
// It has an apiserver of its own, so that its 20,000 objects burden no other test's, and runs
// alone (no t.Parallel): what it measures is one caller's cost to the others.
func TestAWatchCostsWhatItsCallerMaySee(t *testing.T) {
	testbed.Need(t)
	c := ownCluster(t, testbed.Options{})
	cs := kubernetes.NewForConfigOrDie(c.Config)
	big, small, tenant := "big", "small", "tenant"
	for _, ns := range []string{big, small, tenant} {
		if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, otherObjects, testbed.NumberedConfigMap(big, "cm-%06d")); err != nil {
		t.Fatal(err)
	}
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, watchedObjects, testbed.NumberedConfigMap(small, "cm-%d")); err != nil {
		t.Fatal(err)
	}
	grantConfigMapReads(t, cs, small, "bob")
	if _, err := cs.CoreV1().ConfigMaps(tenant).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := newJudge(t, func(received, int, http.Header) int { return http.StatusOK })
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, c.Kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps}]
webhooks: [{name: tenant, url: %s, namespaces: [%s], eventTypes: [MODIFIED]}]
api:
  address: "127.0.0.1:0"
  tls: {selfSignedCAFile: %s}
metrics: {address: "127.0.0.1:0"}
`, rc.URL, tenant, caFile))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, metrics, _ := p.WaitListening(t.Context())
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	watchURL := url + "/api/v1/namespaces/" + small + "/configmaps?watch=1"

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	var updates int
	wg.Go(func() { updates = stamp(t, cs, tenant, "tenant", 100*time.Millisecond, 8*time.Second) })
	time.Sleep(time.Second) // the updates flow before the watches open
	opened := make(chan error, watchesOpened)
	clients := make([]*http.Client, 4)
	for i := range clients {
		clients[i] = floodClient(roots)
		clients[i].Timeout = 0
	}
	for i := range watchesOpened {
		go func() {
			opened <- openWatch(ctx, clients[i%len(clients)], watchURL, c.Token("bob"), watchedObjects)
		}()
	}
	for range watchesOpened {
		if err := <-opened; err != nil {
			t.Error(err)
		}
	}
	wg.Wait()

	checkStampLatency(t, rc, updates, fmt.Sprintf("while %d watches opened", watchesOpened))
	if read := metricValue(t, metrics, "dynwatch_api_watch_initial_objects_total"); read != watchesOpened*watchedObjects {
		t.Errorf("opening %d watches of a %d-object namespace read %v cached objects; want %d (with %d in the cache)", watchesOpened, watchedObjects, read, watchesOpened*watchedObjects, otherObjects)
	}
}

// openWatch opens a watch of url with token and reads its first n events, which must be
// ADDED; the watch stays open until ctx ends.
func openWatch(ctx context.Context, c *http.Client, url, token string, n int) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("watch: %s", resp.Status)
	}
	dec := json.NewDecoder(resp.Body)
	for i := range n {
		var ev struct{ Type string }
		err := dec.Decode(&ev)
		if err == nil && ev.Type != "ADDED" {
			err = fmt.Errorf("a %s event; want ADDED", ev.Type)
		}
		if err != nil {
			resp.Body.Close()
			return fmt.Errorf("watch event %d: %w", i, err)
		}
	}
	go func() {
		<-ctx.Done()
		resp.Body.Close()
	}()
	return nil
}
