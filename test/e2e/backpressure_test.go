package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The load and the faults of the stalled-journal test.
const (
	stalledObjects = 500      // configmaps the updates go round
	stalledSize    = 10 << 10 // bytes of data in each
	stalledRate    = 1000     // updates a second, in all
	stalledWriters = 32       // goroutines writing
	stalledGone    = 50       // configmaps deleted while the disk is full, and as many created while syncs stall
	stalledBound   = 64 << 20 // what resident memory may grow by over its steady state, at the default settings
	steadyFor      = 10 * time.Second
	fullFor        = 5 * time.Second // after backpressure came on
	stallFor       = 60 * time.Second
)

// TestAStalledJournalKeepsMemoryBoundedAndLosesNothing runs dynwatch (without the race
// detector, whose shadow memory would be what is measured) with its state store on a
// filesystem the test serves through FUSE, under up to 1,000 updates a second of 10 KB
// configmaps (the test bed on 2 CPUs, with its writers under the race detector, reaches 150 to
// 560: the CPU each process spends per update, logged over the steady state, shows the
// apiserver alone at about 3 ms): first with the store healthy (the steady state), then with
// the disk full until backpressure comes on and 5 s more, then with every fdatasync stalled for
// 60 s. Meanwhile 50 configmaps are deleted and 50 created.
// Resident memory must stay within 64 MiB of its steady-state peak, backpressure must be seen
// in the metric and /status, and once the store recovers the receiver must end with every
// configmap's last version, a DELETED for each deleted one and the created ones present.
//
// It has an apiserver of its own, which the updates keep busy, and measures no time. It runs
// alone (no t.Parallel): twice, its apiserver, started beside seven busy tests (some with a
// filesystem of theirs stalled), logged its bootstrap only as the readiness wait ran out, three
// and then ten minutes after it began.
func TestAStalledJournalKeepsMemoryBoundedAndLosesNothing(t *testing.T) {
	c := ownCluster(t, testbed.Options{})
	faults := mountFaultFS(t) // after the apiserver has started: nothing it starts sees the mount
	const ns = "stalled"
	cs := kubernetes.NewForConfigOrDie(c.Config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	padding := strings.Repeat("p", stalledSize)
	stalledConfigMap := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"v": "0", "padding": padding}}
	}
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, stalledObjects, func(i int) *corev1.ConfigMap {
		return stalledConfigMap(fmt.Sprintf("cm-%04d", i))
	}); err != nil {
		t.Fatal(err)
	}
	rc := newLastVersions(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s}]
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL, filepath.Join(faults.Dir, "state")))
	p := startReady(t, runner.Options{Binary: plainBinary(t), Config: path, Kubeconfig: c.Kubeconfig})
	api, metrics, _ := p.WaitListening(t.Context())
	testbed.Eventually(t, time.Minute, func() error {
		if n := rc.len(); n < stalledObjects {
			return fmt.Errorf("the receiver knows %d configmaps, want %d", n, stalledObjects)
		}
		return nil
	})

	w, err := newUpdates(c.Config, ns)
	if err != nil {
		t.Fatal(err)
	}
	writing, stopWrites := context.WithCancel(t.Context())
	defer stopWrites()
	var writes errgroup.Group
	for i := range stalledWriters {
		writes.Go(func() error { return w.run(writing, i) })
	}
	s := sample(t, p.PID(), metrics)
	apiserver, etcd := c.PIDs()
	cpu := cpuShares{"kube-apiserver": apiserver, "etcd": etcd, "dynwatch": p.PID(), "the test's process (writers, receiver)": os.Getpid()}
	cpuBefore, doneBefore := cpu.read(t), w.done.Load()
	began := time.Now()

	time.Sleep(steadyFor) // the steady state: measured, not waited for
	steady := s.mark()
	cpu.report(t, cpuBefore, w.done.Load()-doneBefore, time.Since(began))
	faults.Fill(true)
	gone := cs.CoreV1().ConfigMaps(ns)
	for i := range stalledGone {
		if err := gone.Delete(t.Context(), fmt.Sprintf("cm-%04d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The disk stays full until backpressure is on, and fullFor more: how soon the events fill
	// state.maxPendingBytes depends on the rate the loaded test bed reaches (154 a second in
	// one run beside the suite's heaviest tests, where 15 s of a full disk did not fill it).
	testbed.Eventually(t, 2*time.Minute, func() error {
		if metricValue(t, metrics, "dynwatch_state_backpressure") != 1 {
			return errors.New("no backpressure yet with the disk full")
		}
		return nil
	})
	time.Sleep(fullFor) // held back with the disk full: measured, not waited for
	full := s.mark()
	faults.Fill(false)
	faults.HoldSyncs()
	for i := range stalledGone {
		if _, err := gone.Create(t.Context(), stalledConfigMap(fmt.Sprintf("new-%04d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(stallFor) // the fault's length
	stalled := s.mark()
	_, status, _ := get(t.Context(), api+"/status")
	faults.ReleaseSyncs()
	stopWrites()
	if err := writes.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d updates, %.0f a second", w.done.Load(), float64(w.done.Load())/time.Since(began).Seconds())

	// Every configmap's last version reaches the receiver, and the deleted ones' deletion. The
	// state store catches up first through the test's own FUSE server (under the race detector,
	// beside the writers: a few MB/s): the log the stall let grow, some hundreds of MB, compacted.
	testbed.Eventually(t, 10*time.Minute, func() error {
		list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		want := map[string]string{}
		for _, cm := range list.Items {
			want[cm.Name] = cm.ResourceVersion
		}
		for i := range stalledGone {
			want[fmt.Sprintf("cm-%04d", i)] = "DELETED"
		}
		var wrong []string
		got := rc.snapshot()
		for name, rv := range want {
			if got[name] != rv {
				wrong = append(wrong, fmt.Sprintf("%s: got %q, want %q", name, got[name], rv))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d of %d configmaps not delivered as the apiserver holds them, e.g. %s", len(wrong), len(want), wrong[0])
		}
		return nil
	})
	s.stop()

	t.Logf("steady: %s", steady)
	t.Logf("disk full: %s", full)
	t.Logf("fdatasync stalled: %s", stalled)
	for _, phase := range []struct {
		name string
		m    measured
	}{{"the disk full", full}, {"fdatasync stalled", stalled}} {
		if grew := phase.m.rss - steady.rss; grew > stalledBound {
			t.Errorf("with %s, resident memory peaked at %d MiB, %d MiB over the steady state's %d MiB; the bound is %d MiB",
				phase.name, phase.m.rss>>20, grew>>20, steady.rss>>20, stalledBound>>20)
		}
		if phase.m.backpressure == 0 {
			t.Errorf("with %s, dynwatch_state_backpressure was never 1", phase.name)
		}
	}
	var st struct {
		Journal struct {
			Backpressure bool  `json:"backpressure"`
			PendingBytes int64 `json:"pendingBytes"`
			LimitBytes   int64 `json:"limitBytes"`
		} `json:"journal"`
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil || !st.Journal.Backpressure || st.Journal.LimitBytes == 0 {
		t.Errorf("/status while fdatasync stalled = %s (%v); want journal.backpressure true, with its bytes held and limit", status, err)
	}
}

// cpuShares names the processes whose CPU a load test accounts for, by pid.
type cpuShares map[string]int

// read is each process's CPU time so far.
func (c cpuShares) read(t *testing.T) map[string]time.Duration {
	used := map[string]time.Duration{}
	for name, pid := range c {
		used[name] = cpuTime(t, pid)
	}
	return used
}

// report logs the CPU each process used since before, per update of the n made in elapsed, and
// how many of the machine's cores they kept busy between them: where an update's cost lies when
// the rate asked for is not reached.
func (c cpuShares) report(t *testing.T, before map[string]time.Duration, n int64, elapsed time.Duration) {
	now := c.read(t)
	var total time.Duration
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(c)) {
		used := now[name] - before[name]
		total += used
		parts = append(parts, fmt.Sprintf("%s %.2f ms", name, float64(used.Microseconds())/1e3/float64(max(n, 1))))
	}
	t.Logf("%d updates in %s (%.0f a second); CPU per update: %s; %.2f of %d cores busy", n, elapsed.Round(time.Second),
		float64(n)/elapsed.Seconds(), strings.Join(parts, ", "), total.Seconds()/elapsed.Seconds(), runtime.NumCPU())
}

// mountFaultFS mounts a FaultFS for the test, and fails it, loudly, where that cannot be done.
func mountFaultFS(t *testing.T) *testbed.FaultFS {
	t.Helper()
	if err := testbed.FUSEAvailable(); err != nil {
		cannotRun(t, err)
	}
	f, err := testbed.MountFaultFS(t.TempDir(), t.TempDir())
	if err != nil {
		cannotRun(t, err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount %s: %v", f.Dir, err)
		}
	})
	return f
}

// lastVersions is a webhook receiver that keeps, per configmap name, the resourceVersion of
// the last event it was sent for it, or DELETED.
type lastVersions struct {
	*httptest.Server
	mu   sync.Mutex
	last map[string]string
}

func newLastVersions(t *testing.T) *lastVersions {
	rc := &lastVersions{last: map[string]string{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Name            string `json:"name"`
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		v := ev.Object.Metadata.ResourceVersion
		if ev.Type == "DELETED" {
			v = "DELETED"
		}
		rc.mu.Lock()
		rc.last[ev.Object.Metadata.Name] = v
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *lastVersions) len() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.last)
}

func (rc *lastVersions) snapshot() map[string]string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string]string, len(rc.last))
	for k, v := range rc.last {
		out[k] = v
	}
	return out
}

// updates change the data of the configmaps cm-0050 and on, stalledRate a second in all.
type updates struct {
	cs      kubernetes.Interface
	ns      string
	limiter *rate.Limiter
	done    atomic.Int64
}

func newUpdates(cfg *rest.Config, ns string) (*updates, error) {
	cs, err := pacedWriter(cfg)
	if err != nil {
		return nil, err
	}
	return &updates{cs: cs, ns: ns, limiter: rate.NewLimiter(stalledRate, 1)}, nil
}

// run updates writer i's share of the configmaps until ctx ends.
func (u *updates) run(ctx context.Context, i int) error {
	cms := u.cs.CoreV1().ConfigMaps(u.ns)
	for v := 1; ; v++ {
		for j := stalledGone + i; j < stalledObjects; j += stalledWriters {
			if u.limiter.Wait(ctx) != nil {
				return nil
			}
			patch := fmt.Appendf(nil, `{"data":{"v":"%d"}}`, v)
			if _, err := cms.Patch(ctx, fmt.Sprintf("cm-%04d", j), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("update cm-%04d: %w", j, err)
			}
			u.done.Add(1)
		}
	}
}

// measured is the peak of a phase of the test.
type measured struct {
	rss, anon, file int64 // resident memory, bytes
	heap            int64 // the Go heap in use (go_memstats_heap_inuse_bytes)
	backpressure    float64
}

func (m measured) String() string {
	return fmt.Sprintf("peak resident %d MiB (anonymous %d, file-backed %d), peak heap in use %d MiB", m.rss>>20, m.anon>>20, m.file>>20, m.heap>>20)
}

// sampler reads a process's memory from /proc, and its heap and backpressure from its
// metrics, every 200ms, keeping the peaks since the last mark.
type sampler struct {
	pid     int
	metrics string
	mu      sync.Mutex
	peak    measured
	done    chan struct{}
	stopped chan struct{}
}

func sample(t *testing.T, pid int, metrics string) *sampler {
	s := &sampler{pid: pid, metrics: metrics, done: make(chan struct{}), stopped: make(chan struct{})}
	go s.run()
	t.Cleanup(s.stop)
	return s
}

func (s *sampler) run() {
	defer close(s.stopped)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		m := readMemory(s.pid)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		m.heap, m.backpressure = int64(scrape(ctx, s.metrics, "go_memstats_heap_inuse_bytes")), scrape(ctx, s.metrics, "dynwatch_state_backpressure")
		cancel()
		s.mu.Lock()
		s.peak = measured{max(s.peak.rss, m.rss), max(s.peak.anon, m.anon), max(s.peak.file, m.file), max(s.peak.heap, m.heap), max(s.peak.backpressure, m.backpressure)}
		s.mu.Unlock()
	}
}

// mark returns the peaks since the last mark, and starts again.
func (s *sampler) mark() measured {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.peak
	s.peak = measured{}
	return m
}

func (s *sampler) stop() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	<-s.stopped
}

// readMemory reads the process's resident memory; zero where it cannot.
func readMemory(pid int) measured {
	r := runner.ResidentMemory(pid)
	return measured{rss: int64(r.Now), anon: int64(r.Anon), file: int64(r.File)}
}

// scrape reads one unlabelled series from a metrics endpoint; 0 when it cannot.
func scrape(ctx context.Context, metrics, series string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metrics+"/metrics", nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
