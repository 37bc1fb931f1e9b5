package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of delivery under faults: a real apiserver, the real binary, real receivers.

// plainConfig is a configuration watching configmaps in ns, with the given webhooks (and other
// top-level settings), serving on loopback only.
func plainConfig(ns, rest string) string {
	return fmt.Sprintf("resources: [{version: v1, resource: configmaps, namespaces: [%s]}]\n%s\napi: {address: \"127.0.0.1:0\", auth: {mode: none}, tls: {enabled: false}}\nmetrics: {address: \"127.0.0.1:0\"}\n", ns, rest)
}

// subjectName is the object name in a request's ce-subject (namespace/name).
func subjectName(r received) string { return r.subject[strings.IndexByte(r.subject, '/')+1:] }

// TestFailingObjectsHoldUpOnlyThemselves: 2 x workers objects are answered 503 (for at most
// 60 s) while 200 others are created; the others arrive with a p99 under a second while every
// failing object still fails, and once the receiver recovers, each failing object's later
// change has waited behind its first. The failing objects recover as soon as the others have
// arrived: their retries reach maxBackoff within two seconds, and the 60 s that followed
// measured nothing more.
func TestFailingObjectsHoldUpOnlyThemselves(t *testing.T) {
	const workers, others = 4, 200
	ns := namespace(t)
	var failUntil atomic.Int64
	failUntil.Store(time.Now().Add(time.Hour).UnixNano())
	rc := newJudge(t, func(r received, _ int, _ http.Header) int {
		if strings.HasPrefix(subjectName(r), "bad-") && time.Now().UnixNano() < failUntil.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	startWithWebhooks(t, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s, workers: %d, retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
`, ns, rc.URL, workers))
	cs, create := configMaps(ns)
	failUntil.Store(time.Now().Add(60 * time.Second).UnixNano())
	for i := range 2 * workers {
		if err := create(t.Context(), fmt.Sprintf("bad-%d", i), "1"); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		tried := map[string]bool{}
		for _, r := range rc.got() {
			tried[subjectName(r)] = true
		}
		if len(tried) < 2*workers {
			return fmt.Errorf("%d failing objects tried so far", len(tried))
		}
		return nil
	})
	for i := range 2 * workers {
		if _, err := cs.CoreV1().ConfigMaps(ns).Patch(t.Context(), fmt.Sprintf("bad-%d", i), "application/merge-patch+json", []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	created := map[string]time.Time{}
	for i := range others {
		name := fmt.Sprintf("ok-%03d", i)
		if err := create(t.Context(), name, "1"); err != nil {
			t.Fatal(err)
		}
		created[name] = time.Now()
	}
	arrived := func() map[string]time.Time {
		out := map[string]time.Time{}
		for _, r := range rc.got() {
			if n := subjectName(r); strings.HasPrefix(n, "ok-") && r.code == http.StatusOK {
				out[n] = r.at
			}
		}
		return out
	}
	testbed.Eventually(t, 45*time.Second, func() error {
		if n := len(arrived()); n < others {
			return fmt.Errorf("%d of %d other objects delivered while %d fail", n, others, 2*workers)
		}
		return nil
	})
	var latencies []time.Duration
	for name, at := range arrived() {
		latencies = append(latencies, max(0, at.Sub(created[name])))
	}
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100-1]
	t.Logf("other objects' delivery latency: p50 %s, p99 %s, max %s", latencies[len(latencies)/2], p99, latencies[len(latencies)-1])
	if p99 > time.Second {
		t.Errorf("p99 latency of the other objects = %s while %d objects fail, want under 1s", p99, 2*workers)
	}
	for _, r := range rc.got() {
		if n := subjectName(r); strings.HasPrefix(n, "bad-") && r.code == http.StatusOK {
			t.Fatalf("%s was delivered before the others had all arrived: the test measured them while fewer than %d objects failed", n, 2*workers)
		}
	}
	// Once the receiver recovers, each failing object gets its ADDED, then its MODIFIED.
	failUntil.Store(time.Now().UnixNano())
	testbed.Eventually(t, 90*time.Second, func() error {
		ok := 0
		for _, r := range rc.got() {
			if strings.HasPrefix(subjectName(r), "bad-") && r.code == http.StatusOK {
				ok++
			}
		}
		if ok < 4*workers {
			return fmt.Errorf("%d deliveries of the failing objects after recovery, want %d", ok, 4*workers)
		}
		return nil
	})
	seen := map[string][]string{}
	for _, r := range rc.got() {
		if n := subjectName(r); strings.HasPrefix(n, "bad-") {
			seen[n] = append(seen[n], fmt.Sprintf("%s %d", r.payload.Type, r.code))
		}
	}
	for name, reqs := range seen {
		added := slices.Index(reqs, "ADDED 200")
		for i, s := range reqs {
			if strings.HasPrefix(s, "MODIFIED") && i < added {
				t.Errorf("%s: requests %v; its MODIFIED must wait until its ADDED is delivered", name, reqs)
				break
			}
		}
	}
}

// TestDeleteAndRecreateKeepsOrderByName deletes and re-creates an object under one name 50
// times: the receiver gets every DELETED of the old object before the ADDED of the new one.
func TestDeleteAndRecreateKeepsOrderByName(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rc := newJudge(t, func(r received, _ int, _ http.Header) int {
		if r.payload.Type == "ADDED" {
			time.Sleep(30 * time.Millisecond) // gives a later event of the name time to overtake
		}
		return http.StatusOK
	})
	startWithWebhooks(t, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s, workers: 8}]
`, ns, rc.URL))
	cs, create := configMaps(ns)
	const rounds = 50
	for i := range rounds {
		if err := create(t.Context(), "same", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().ConfigMaps(ns).Delete(t.Context(), "same", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got := rc.waitFor(t, 2*rounds, 60*time.Second)
	slices.SortFunc(got, func(a, b received) int { return a.at.Compare(b.at) })
	uid := func(r received) any { return r.payload.Object["metadata"].(map[string]any)["uid"] }
	for i, r := range got {
		want := "ADDED"
		if i%2 == 1 {
			want = "DELETED"
		}
		if r.payload.Type != want || i%2 == 1 && uid(r) != uid(got[i-1]) {
			t.Fatalf("request %d is %s of uid %v (v=%s); want %s, the DELETED of an object before the ADDED of its successor", i, r.payload.Type, uid(r), r.data("v", false), want)
		}
	}
}

// TestReloadUnderLoadNeverPanics reloads hundreds of sink and resource changes while events
// flow and a sink's queue is full, under the race detector. Each configuration gives the fast
// sink a header naming its round: the sink must send rounds between the first and the last
// while events flow, and the last round's once they stop.
func TestReloadUnderLoadNeverPanics(t *testing.T) {
	t.Parallel()
	const rounds = 300
	ns := namespace(t)
	hanging, fast := newReceiver(t, nil, true), newReceiver(t, nil, false)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	configAt := func(i int) string {
		extra := ""
		if i%3 != 0 {
			extra = fmt.Sprintf("\n  - {name: extra-%d, url: %s, queueSize: 3, workers: 1}", i%2, fast.URL)
		}
		secrets := ""
		if i%4 == 1 {
			secrets = fmt.Sprintf("\n  - {version: v1, resource: secrets, namespaces: [%s]}", ns)
		}
		return fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%[1]s]}%[2]s
webhooks:
  - {name: hanging, url: %[3]s, queueSize: 2, workers: %[4]d, timeout: %[5]ds}
  - {name: fast, url: %[6]s, headers: [{name: X-Round, value: "%[7]d"}]}%[8]s
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
shutdownTimeout: 4s
`, ns, secrets, hanging.URL, 1+i%2, 30+i%5, fast.URL, i, extra)
	}
	writeFile(t, configPath, configAt(0))
	p := startProcess(t, configPath)
	_, create := configMaps(ns)
	stop := make(chan struct{})
	var g errgroup.Group
	g.Go(func() error {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return nil
			default:
			}
			if err := create(t.Context(), fmt.Sprintf("cm-%05d", i), "1"); err != nil {
				return err
			}
		}
	})
	for i := 1; i <= rounds; i++ {
		writeFile(t, configPath, configAt(i))
		if err := p.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // paces the reloads; no condition to wait for
		select {
		case <-p.Done():
			t.Fatalf("dynwatch exited during reload %d: %v", i, p.ExitErr())
		default:
		}
	}
	// Events still flow, so the last configuration shows once it is in effect.
	testbed.Eventually(t, 30*time.Second, func() error {
		for _, r := range fast.got() {
			if r.header.Get("X-Round") == fmt.Sprint(rounds) {
				return nil
			}
		}
		return fmt.Errorf("the fast sink has not sent X-Round: %d since the last reload", rounds)
	})
	close(stop)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	var between []int // the rounds after the first and before the last that the fast sink sent
	for _, r := range fast.got() {
		if n, err := strconv.Atoi(r.header.Get("X-Round")); err == nil && 0 < n && n < rounds {
			between = append(between, n)
		}
	}
	if len(between) == 0 {
		t.Errorf("the fast sink sent no round between 0 and %d: no reload took effect while events flowed", rounds)
	}
	// Only configmaps are watched in the last configuration; its reload must have succeeded. A
	// reload updates the webhooks before the informers, so the fast sink can send the last
	// round's header while the resources are still being updated: wait for them.
	testbed.Eventually(t, 30*time.Second, func() error {
		st, err := p.Status(t.Context())
		if err != nil {
			return err
		}
		if !st.Reload.Success || len(st.Resources) != 1 {
			return fmt.Errorf("/status after the reloads: %+v; want the last reload successful and only configmaps watched", st)
		}
		return nil
	})
	if err := create(t.Context(), "sentinel", "1"); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		for _, r := range fast.got() {
			if r.name() == "sentinel" {
				if round := r.header.Get("X-Round"); round != fmt.Sprint(rounds) {
					t.Fatalf("the sentinel was sent with X-Round: %s, want %d, the last configuration's", round, rounds)
				}
				return nil
			}
		}
		return fmt.Errorf("the fast sink has not received the sentinel after the reloads")
	})
	if err := p.Stop(20 * time.Second); err != nil {
		t.Errorf("stop after the reloads: %v", err)
	}
	for _, bad := range []string{"panic: ", "DATA RACE", "fatal error: "} {
		if strings.Contains(p.Log(), bad) {
			t.Errorf("the log has %q", bad)
		}
	}
}

// TestAFirstStartOverManyObjectsWithASmallQueueDeliversAll: with a state store the queue is a
// window over the outbox, so 20,000 objects fit through a queue of 200: a hundred times its
// size, as when it was 100,000 through 1,000 (docs/benchmarks-history.md has those timings),
// whose creation alone took the suite minutes. The objects are in a cluster of the test's own:
// in the shared one, every test watching all namespaces would list them.
func TestAFirstStartOverManyObjectsWithASmallQueueDeliversAll(t *testing.T) {
	t.Parallel()
	const objects, queue = 20_000, 200
	c := ownCluster(t, testbed.Options{})
	ns := "many"
	if _, err := kubernetes.NewForConfigOrDie(c.Config).CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, objects, testbed.NumberedConfigMap(ns, "cm-%06d")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ids := map[string]bool{}
	rc := newJudge(t, func(r received, _ int, _ http.Header) int {
		mu.Lock()
		ids[r.ceID] = true
		mu.Unlock()
		return http.StatusOK
	})
	dir := t.TempDir()
	deadLetters := filepath.Join(dir, "dead-letters.jsonl")
	configPath := filepath.Join(dir, "config.yaml")
	writeFile(t, configPath, plainConfig(ns, fmt.Sprintf(`
webhooks: [{name: r, url: %s, workers: 16, queueSize: %d, deadLetter: {file: %s}}]
state: {path: %s}`, rc.URL, queue, deadLetters, filepath.Join(dir, "state.db"))))
	started := time.Now()
	p := startFile(t, c.Kubeconfig, configPath)
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := p.WaitListening(t.Context())
	testbed.Eventually(t, 8*time.Minute, func() error {
		mu.Lock()
		n := len(ids)
		mu.Unlock()
		if n < objects {
			if dead := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="queue_full",sink="r"}`); dead > 0 {
				t.Fatalf("%v events dead-lettered as queue_full with a state store", dead)
			}
			return fmt.Errorf("%d of %d objects delivered", n, objects)
		}
		return nil
	})
	t.Logf("%d objects delivered through a queue of %d in %s", objects, queue, time.Since(started).Round(time.Second))
	if b, err := os.ReadFile(deadLetters); err == nil && len(b) > 0 {
		t.Errorf("dead letters written: %.300s", b)
	}
	rc.mu.Lock()
	requests := len(rc.requests)
	rc.requests = nil // 20,000 bodies need not stay
	rc.mu.Unlock()
	if requests != objects {
		t.Errorf("%d requests for %d objects", requests, objects)
	}
}
