package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// summary is what a receiver got, one "TYPE name v=... [old=...]" per request, in order.
func summary(rc *receiver) []string {
	var out []string
	for _, r := range rc.got() {
		s := fmt.Sprintf("%s %s v=%s", r.payload.Type, r.name(), r.data("v", false))
		if r.payload.Type == "MODIFIED" {
			s += " old=" + r.data("v", true)
		}
		out = append(out, s)
	}
	return out
}

func waitSummary(t *testing.T, rc *receiver, want ...string) {
	t.Helper()
	testbed.Eventually(t, 90*time.Second, func() error {
		got := summary(rc)
		for _, w := range want {
			if !slices.Contains(got, w) {
				return fmt.Errorf("%d events so far, missing %q (last: %v)", len(got), w, got[max(0, len(got)-5):])
			}
		}
		return nil
	})
}

// configMaps talks to the test bed with room for thousands of requests.
func configMaps(ns string) (*kubernetes.Clientset, func(ctx context.Context, name, v string) error) {
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 2000, 2000
	cs := kubernetes.NewForConfigOrDie(cfg)
	create := func(ctx context.Context, name, v string) error {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": v}}, metav1.CreateOptions{})
		return err
	}
	return cs, create
}

// waitOutbox waits until the sink's outbox holds n events.
func waitOutbox(t *testing.T, metrics, sink string, n int) {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() error {
		if v := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="`+sink+`"}`); v != float64(n) {
			return fmt.Errorf("outbox of %s holds %v events, want %d", sink, v, n)
		}
		return nil
	})
}

// TestARestartDeliversExactlyWhatChangedWhileDown stops dynwatch, changes a few of thousands of
// objects, and starts it again on the same state: the receiver gets exactly those changes, with
// the old objects the sinks last saw, and nothing for the unchanged ones.
func TestARestartDeliversExactlyWhatChangedWhileDown(t *testing.T) {
	t.Parallel()
	const objects = 2000
	ns := namespace(t)
	cs, create := configMaps(ns)
	if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, objects, testbed.NumberedConfigMap(ns, "cm-%04d")); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil, false)
	p, configPath := startWithState(t, ns, rc)
	rc.waitFor(t, objects, 3*time.Minute) // the parallel tests' load: 1,866 in 90 s once, in CI
	_, metrics, _ := p.WaitListening(t.Context())
	if v := metricValue(t, metrics, "dynwatch_state_full_replays_total"); v != 1 {
		t.Errorf("full replays = %v after a first start, want 1", v)
	}
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	first := len(rc.got())

	cms := cs.CoreV1().ConfigMaps(ns)
	if _, err := cms.Patch(t.Context(), "cm-0001", "application/merge-patch+json", []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cm-0002", "cm-0003"} {
		if err := cms.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := create(t.Context(), "cm-0003", "recreated"); err != nil { // same name, new uid
		t.Fatal(err)
	}
	if err := create(t.Context(), "new", "1"); err != nil {
		t.Fatal(err)
	}

	p = startProcess(t, configPath)
	want := []string{"MODIFIED cm-0001 v=2 old=1", "DELETED cm-0002 v=1", "DELETED cm-0003 v=1", "ADDED cm-0003 v=recreated", "ADDED new v=1"}
	waitSummary(t, rc, want...)
	// Anything else the restart made would come from the initial events, recorded before the
	// watch's changes and delivered first by the one worker.
	if got := summary(rc)[first:]; len(got) != len(want) {
		t.Errorf("after the restart the receiver got %d events, want exactly %v:\n%s", len(got), want, strings.Join(got, "\n"))
	}
	_, metrics, _ = p.WaitListening(t.Context())
	// The stream resumes from what was recorded: the initial events are the 2000 recorded
	// objects, each unchanged, and the changes come from the watch.
	if v := metricValue(t, metrics, "dynwatch_state_suppressed_events_total"); v != objects {
		t.Errorf("suppressed = %v, want the %d recorded objects the stream resumed with", v, objects)
	}
	if v := metricValue(t, metrics, "dynwatch_state_full_replays_total"); v != 0 {
		t.Errorf("full replays = %v after a restart on the same state, want 0", v)
	}
}

// TestSIGKILLWithQueuedEventsLosesNothing kills dynwatch while its receiver fails every request,
// then starts it again with the receiver healthy: every queued event arrives, under the ce-id it
// was first tried with, and nothing else is delivered.
func TestSIGKILLWithQueuedEventsLosesNothing(t *testing.T) {
	t.Parallel()
	const objects = 20
	ns := namespace(t)
	cs, create := configMaps(ns)
	var failing atomic.Bool
	failing.Store(true)
	rc := newReceiver(t, func(int) int {
		if failing.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}, false)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	writeFile(t, configPath, plainConfig(ns, fmt.Sprintf("webhooks: [{name: r, url: %s, workers: 4, retry: {initialBackoff: 50ms, maxBackoff: 200ms, maxElapsed: 10m}}]\nstate: {path: %s}", rc.URL, filepath.Join(dir, "state.db"))))
	p := startProcess(t, configPath)
	for i := range objects {
		if err := create(t.Context(), fmt.Sprintf("cm-%02d", i), "1"); err != nil {
			t.Fatal(err)
		}
	}
	_, metrics, _ := p.WaitListening(t.Context())
	waitOutbox(t, metrics, "r", objects)
	ids := func(from int) map[string]int {
		out := map[string]int{}
		for _, r := range rc.got()[from:] {
			out[r.ceID]++
		}
		return out
	}
	// The four workers each retry one object; the others wait in the queue.
	testbed.Eventually(t, 30*time.Second, func() error {
		if n := len(ids(0)); n < 4 {
			return fmt.Errorf("%d events tried, want 4", n)
		}
		return nil
	})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	tried := ids(0)
	healthyFrom := len(rc.got()) // every request from here on is answered 200
	failing.Store(false)

	p = startProcess(t, configPath)
	testbed.Eventually(t, 60*time.Second, func() error {
		if n := len(ids(healthyFrom)); n < objects {
			return fmt.Errorf("%d events delivered after the restart, want %d", n, objects)
		}
		return nil
	})
	_, metrics, _ = p.WaitListening(t.Context())
	testbed.Eventually(t, 10*time.Second, func() error {
		if v := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="r"}`); v != 0 {
			return fmt.Errorf("outbox holds %v events after delivery", v)
		}
		return nil
	})
	delivered := ids(healthyFrom)
	list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range list.Items {
		if id := fmt.Sprintf("%s.%s.added", cm.UID, cm.ResourceVersion); delivered[id] != 1 {
			t.Errorf("%s: delivered %d times after the restart, want once", id, delivered[id])
		}
	}
	if len(delivered) != objects {
		t.Errorf("delivered %d distinct events after the restart, want %d: %v", len(delivered), objects, delivered)
	}
	for id := range tried {
		if delivered[id] != 1 {
			t.Errorf("%s was tried before the kill and not delivered under the same id after it", id)
		}
	}
}

// TestSIGKILLMidStormLosesNothingAndKeepsEachObjectsOrder kills dynwatch while objects are
// being updated at about 100 per second and starts it again at once, the storm going on: each
// object's last version arrives, every event arrives under its own id (uid, resourceVersion and
// type, whether first or repeated), and the first arrivals of each object's events are in the
// order of its versions. A delivery waits for its commit to be durable: what the kill cuts
// short is derived again at the restart, never reordered.
func TestSIGKILLMidStormLosesNothingAndKeepsEachObjectsOrder(t *testing.T) {
	t.Parallel()
	const objects, updates = 10, 600
	ns := namespace(t)
	cs, create := configMaps(ns)
	rc := newReceiver(t, nil, false)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	writeFile(t, configPath, plainConfig(ns, fmt.Sprintf("webhooks: [{name: r, url: %s, workers: 4}]\nstate: {path: %s}", rc.URL, filepath.Join(dir, "state.db"))))
	for i := range objects {
		if err := create(t.Context(), fmt.Sprintf("cm-%02d", i), "0"); err != nil {
			t.Fatal(err)
		}
	}
	p := startProcess(t, configPath)
	rc.waitFor(t, objects, 30*time.Second)
	last := make([]string, objects) // each object's last resourceVersion
	var patched atomic.Int64
	stormed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := range updates {
			<-tick.C
			i := n % objects
			cm, err := cs.CoreV1().ConfigMaps(ns).Patch(t.Context(), fmt.Sprintf("cm-%02d", i), "application/merge-patch+json", fmt.Appendf(nil, `{"data":{"v":"%d"}}`, n+1), metav1.PatchOptions{})
			if err != nil {
				stormed <- err
				return
			}
			last[i] = cm.ResourceVersion
			patched.Add(1)
		}
		stormed <- nil
	}()
	// A loaded machine patches more slowly than 100/s: the kill comes a third into the storm
	// as patched, whatever the pace.
	testbed.Eventually(t, 3*time.Minute, func() error {
		if n := patched.Load(); n < updates/3 {
			return fmt.Errorf("%d of %d updates patched; the kill comes a third into the storm", n, updates)
		}
		return nil
	})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	startProcess(t, configPath)
	if err := <-stormed; err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 3*time.Minute, func() error {
		seen := map[string]bool{}
		for _, r := range rc.got() {
			seen[r.name()+"@"+r.payload.Object["metadata"].(map[string]any)["resourceVersion"].(string)] = true
		}
		for i, rv := range last {
			if !seen[fmt.Sprintf("cm-%02d@%s", i, rv)] {
				return fmt.Errorf("cm-%02d's last version (%s) has not arrived", i, rv)
			}
		}
		return nil
	})
	first := map[string]bool{}
	order := map[string]uint64{} // an object's last version first arriving
	repeats := 0
	for _, r := range rc.got() {
		meta := r.payload.Object["metadata"].(map[string]any)
		rv := meta["resourceVersion"].(string)
		if want := fmt.Sprintf("%s.%s.%s", meta["uid"], rv, strings.ToLower(r.payload.Type)); r.ceID != want {
			t.Errorf("an event of %s@%s arrived as %s; want %s", r.name(), rv, r.ceID, want)
		}
		if first[r.ceID] {
			repeats++
			continue
		}
		first[r.ceID] = true
		v, _ := strconv.ParseUint(rv, 10, 64)
		if v <= order[r.name()] {
			t.Errorf("%s@%s first arrived after %s@%d", r.name(), rv, r.name(), order[r.name()])
		}
		order[r.name()] = v
	}
	t.Logf("%d events, %d first arrivals, %d repeats", len(rc.got()), len(first), repeats)
}

// TestConfigEditsApplyLive rewrites the configuration the way a ConfigMap volume does (a new
// directory behind the ..data symlink) under a running dynwatch: a new resource is watched and
// delivered, a removed sink stops receiving, the unchanged resource emits nothing again, and a
// broken edit is refused while the old configuration keeps running.
func TestConfigEditsApplyLive(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	cs, create := configMaps(ns)
	kept, removed := newReceiver(t, nil, false), newReceiver(t, nil, false)
	dir := t.TempDir()
	stateDB := filepath.Join(t.TempDir(), "state.db")
	generation := 0
	// publish makes the ConfigMap volume layout: config.yaml → ..data/config.yaml, and ..data →
	// a fresh timestamped directory, swapped atomically by rename.
	publish := func(resources, webhooks string) {
		generation++
		gen := fmt.Sprintf("..gen_%d", generation)
		if err := os.Mkdir(filepath.Join(dir, gen), 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, gen, "config.yaml"), fmt.Sprintf(`
resources: %s
webhooks: %s
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, resources, webhooks, stateDB))
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(gen, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if generation == 1 {
			if err := os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml")); err != nil {
				t.Fatal(err)
			}
		}
	}
	configMapsOnly := fmt.Sprintf("[{version: v1, resource: configmaps, namespaces: [%s]}]", ns)
	publish(configMapsOnly, fmt.Sprintf("[{name: kept, url: %s}, {name: removed, url: %s}]", kept.URL, removed.URL))
	p := startProcess(t, filepath.Join(dir, "config.yaml"))
	_, metrics, _ := p.WaitListening(t.Context())
	if err := create(t.Context(), "one", "1"); err != nil {
		t.Fatal(err)
	}
	waitSummary(t, kept, "ADDED one v=1")
	waitSummary(t, removed, "ADDED one v=1")

	reloaded := func(n int) {
		t.Helper()
		testbed.Eventually(t, 30*time.Second, func() error {
			if v := metricValue(t, metrics, `dynwatch_config_reloads_total{result="success"}`) + metricValue(t, metrics, `dynwatch_config_reloads_total{result="failure"}`); v < float64(n) {
				return fmt.Errorf("%v reloads, want %d", v, n)
			}
			return nil
		})
	}
	publish(fmt.Sprintf("[{version: v1, resource: configmaps, namespaces: [%[1]s]}, {version: v1, resource: secrets, namespaces: [%[1]s]}]", ns),
		fmt.Sprintf("[{name: kept, url: %s}]", kept.URL))
	reloaded(1)
	st, err := p.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Reload.Success || len(st.Resources) != 2 {
		t.Fatalf("after the edit /status says reload %+v with %d resources", st.Reload, len(st.Resources))
	}
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := create(t.Context(), "two", "1"); err != nil {
		t.Fatal(err)
	}
	waitSummary(t, kept, "ADDED s1 v=", "ADDED two v=1")
	if got := summary(removed); len(got) != 1 {
		t.Errorf("the removed sink got %v after its removal, want only the event before it", got)
	}
	if got := summary(kept); len(slices.DeleteFunc(slices.Clone(got), func(e string) bool { return e != "ADDED one v=1" })) != 1 {
		t.Errorf("the unchanged resource emitted its objects again: %v", got)
	}
	// Had its informer been restarted, its initial list would have been compared with the
	// stored state and "one" suppressed: the caches were kept, nothing was relisted.
	if v := metricValue(t, metrics, "dynwatch_state_suppressed_events_total"); v != 0 {
		t.Errorf("the unchanged resource was listed again: %v events suppressed", v)
	}

	publish(fmt.Sprintf("[{version: v1, resource: configmaps, namespaces: [%s], labelSelector: 'a in ('}]", ns), "[]")
	reloaded(2)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, metrics, `dynwatch_config_reloads_total{result="failure"}`); v != 2 {
			return fmt.Errorf("%v failed reloads, want 2 (the edit, then SIGHUP)", v)
		}
		return nil
	})
	st, err = p.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Reload.Success || !strings.Contains(st.Reload.Error, "resources[0].labelSelector") {
		t.Errorf("after a broken edit /status says %+v; want a failure naming resources[0].labelSelector", st.Reload)
	}
	if v := metricValue(t, metrics, "dynwatch_config_last_reload_successful"); v != 0 {
		t.Errorf("dynwatch_config_last_reload_successful = %v, want 0", v)
	}
	if err := create(t.Context(), "three", "1"); err != nil {
		t.Fatal(err)
	}
	waitSummary(t, kept, "ADDED three v=1")
}
