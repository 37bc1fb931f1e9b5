package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// hostileFixture is a secured dynwatch with a 1s request timeout and small per-user limits,
// over many configmaps, so that a scan with a costly selector takes longer than the timeout.
// The configmaps are in a cluster of the fixture's own: left in the shared one, they made every
// later test that watches configmaps in all namespaces stream them all, which on a loaded
// machine took a namespaceSelector's initial list past its test's patience (a CI run).
type hostileFixture struct {
	dynwatchAPI
	c     *testbed.Cluster
	p     *runner.Process
	ns    string
	admin *rest.Config
}

// hostileObjects is enough that the costliest scan takes about twice requestTimeout on an idle
// 2-core machine (15,000 took 0.97 s there: the 504 was not certain).
const hostileObjects = 30000

func startHostile(t *testing.T) hostileFixture {
	t.Helper()
	c := ownCluster(t, testbed.Options{})
	ns := namespaceIn(t, c.Config)
	// The process starts before the objects are made: it syncs while they are, not after.
	p, d := launchHostile(t, c, ns, "1s")
	if err := testbed.CreateConfigMaps(t.Context(), c.Config, hostileObjects, func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm-%05d", i), Annotations: map[string]string{"a": "b"}}}
	}); err != nil {
		t.Fatal(err)
	}
	f := hostileFixture{c: c, ns: ns, admin: d.restConfig(c.Config.BearerToken)}
	f.dynwatchAPI, f.p = f.ready(t, p, d), p
	return f
}

// launchHostile starts a secured dynwatch over the configmaps of ns in c, with requestTimeout
// and small per-user limits, and returns it with where its API will listen.
func launchHostile(t *testing.T, c *testbed.Cluster, ns, requestTimeout string) (*runner.Process, dynwatchAPI) {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	config := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, config, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
api:
  address: "127.0.0.1:0"
  requestTimeout: %s
  fieldSelectors: any # the costliest selectors are on annotations
  tls: {selfSignedCAFile: %s}
  limits: {maxInFlightPerUser: 2, maxWatchesPerUser: 20}
metrics: {address: "127.0.0.1:0"}
`, ns, requestTimeout, caFile))
	// No consistency check: one of 30,000 objects costs about as much CPU as the scans whose
	// end the subtests measure by dynwatch's CPU time (a CI run's check fell in the window
	// after a client left, and the scan seemed to go on).
	p, err := launch(t, runner.Options{Config: config, Kubeconfig: c.Kubeconfig, Env: []string{"DYNWATCH_CONSISTENCYCHECK_ENABLED=false"}})
	if err != nil {
		t.Fatal(err)
	}
	return p, dynwatchAPI{caFile: caFile}
}

// ready waits until p, launched by launchHostile, is ready and its cache holds every one of
// the fixture's objects, and returns its API.
func (f hostileFixture) ready(t *testing.T, p *runner.Process, d dynwatchAPI) dynwatchAPI {
	t.Helper()
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.url, _, _ = p.WaitListening(t.Context())
	client := httpClient(t, d.restConfig(f.c.Config.BearerToken))
	testbed.Eventually(t, time.Minute, func() error {
		resp, err := client.Get(d.url + "/api/v1/namespaces/" + f.ns + "/configmaps?limit=1")
		if err != nil {
			return err
		}
		var list struct {
			Metadata struct{ RemainingItemCount int } `json:"metadata"`
		}
		if err := decodeJSON(resp, &list); err != nil {
			return err
		}
		if n := list.Metadata.RemainingItemCount + 1; n != hostileObjects {
			return fmt.Errorf("dynwatch's cache holds %d configmaps, want %d", n, hostileObjects)
		}
		return nil
	})
	return d
}

// costlySelector is a field selector just under the URL limit whose every requirement must
// be evaluated against every object, and that no object matches, so that a page cannot stop
// early: an unindexed scan as slow as a caller can make it.
func costlySelector() string { return selectorOf(7000) }

// selectorOf is a field selector of about length bytes, costly as costlySelector is: the
// longer, the more each object costs.
func selectorOf(length int) string {
	reqs := []string{"metadata.annotations.absent=x"}
	for i := 0; len(strings.Join(reqs, ",")) < length; i++ {
		reqs = append(reqs, fmt.Sprintf("metadata.annotations.k%d!=v", i))
	}
	return strings.Join(reqs, ",")
}

func TestHostileRequestsCostLittle(t *testing.T) {
	f := startHostile(t)
	client := httpClient(t, f.admin)
	list := f.url + "/api/v1/namespaces/" + f.ns + "/configmaps?fieldSelector="

	t.Run("a 1 MB selector is refused before any work", func(t *testing.T) {
		huge := list + strings.Repeat("metadata.name!%3Dx,", 1_000_000/19)
		before, start := cpuTime(t, f.p.PID()), time.Now()
		got := ask(t, client, huge)
		elapsed, cpu := time.Since(start), cpuTime(t, f.p.PID())-before
		if got.code != http.StatusRequestURITooLong || !strings.Contains(got.message, "at most 8192") {
			t.Fatalf("a %d-byte URL: %v, want 414 naming the limit", len(huge), got)
		}
		t.Logf("a %d-byte selector: answered 414 in %s, dynwatch CPU %s", len(huge), elapsed.Round(time.Millisecond), cpu)
	})
	t.Run("a scan past api.requestTimeout answers 504", func(t *testing.T) {
		start := time.Now()
		got := ask(t, client, list+costlySelector())
		elapsed := time.Since(start)
		if got.code != http.StatusGatewayTimeout || got.reason != metav1.StatusReasonTimeout {
			t.Fatalf("a costly scan answered %v after %s, want 504 Timeout", got, elapsed)
		}
		if elapsed > 1500*time.Millisecond {
			t.Fatalf("the 504 came after %s; requestTimeout is 1s", elapsed)
		}
		t.Logf("a costly scan of %d objects was cut at %s", hostileObjects, elapsed.Round(time.Millisecond))
	})
	t.Run("a scan stops when its client goes away", func(t *testing.T) {
		// A dynwatch of its own, whose scans no timeout cuts short: what a scan would cost to
		// its end is then the same on a loaded machine as on a quiet one, and a scan that went
		// on after its client left would cost it, however late the client's leaving was seen.
		// A tenth of costlySelector: the costliest cost 54 s of CPU to its end (a build with
		// the race detector), and half a second between two of the scan's looks at its client.
		p, d := launchHostile(t, f.c, f.ns, "10m")
		d = f.ready(t, p, d)
		client := httpClient(t, d.restConfig(f.c.Config.BearerToken))
		scan := d.url + "/api/v1/namespaces/" + f.ns + "/configmaps?fieldSelector=" + selectorOf(700)
		before := cpuTime(t, p.PID())
		if got := ask(t, client, scan); got.code != http.StatusOK {
			t.Fatalf("a costly scan without a timeout: %v, want 200", got)
		}
		whole := cpuTime(t, p.PID()) - before
		// The scan is under way once dynwatch, otherwise idle, has spent a fifth of it.
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		began := cpuTime(t, p.PID())
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, scan, nil)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		testbed.Eventually(t, time.Minute, func() error {
			if used := cpuTime(t, p.PID()) - began; used < whole/5 {
				return fmt.Errorf("dynwatch has used %s of CPU since the request, of the %s a whole scan costs: the scan has not started", used, whole)
			}
			return nil
		})
		select {
		case <-done:
			t.Fatal("the scan was answered before its client went away: nothing left to stop")
		default:
		}
		left := cpuTime(t, p.PID())
		cancel()
		<-done
		// dynwatch is quiet again once a fifth of a second passes in which it spends under a
		// tenth of one (the kernel counts CPU time in hundredths of a second).
		var after time.Duration
		testbed.Eventually(t, time.Minute, func() error {
			from := cpuTime(t, p.PID())
			time.Sleep(200 * time.Millisecond)
			if used := cpuTime(t, p.PID()) - from; used >= 20*time.Millisecond {
				return fmt.Errorf("dynwatch used %s of CPU in 200 ms", used)
			}
			after = from - left
			return nil
		})
		if rest := whole - (left - began); after > rest/2 {
			t.Fatalf("dynwatch used %s of CPU after the client left, more than half of the %s the rest of the scan would cost: the scan went on", after, rest)
		}
		t.Logf("a whole scan costs %s of CPU; the client left after %s, and %s more was used", whole, left-began, after)
	})
	t.Run("a user's requests beyond the limit get 429 with Retry-After", func(t *testing.T) {
		var wg sync.WaitGroup
		codes := make(chan int, 3)
		for range 3 {
			wg.Go(func() {
				resp, err := client.Get(list + costlySelector())
				if err != nil {
					t.Error(shortErr(err))
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
					t.Error("a 429 without Retry-After")
				}
				codes <- resp.StatusCode
			})
		}
		wg.Wait()
		close(codes)
		count := map[int]int{}
		for c := range codes {
			count[c]++
		}
		if count[http.StatusTooManyRequests] != 1 || count[http.StatusGatewayTimeout] != 2 {
			t.Fatalf("3 costly scans at once with maxInFlightPerUser 2: %v, want two 504 and one 429", count)
		}
		// Another user is not held back by this one.
		bob := httpClient(t, caller{token: f.c.Token("bob")}.config(f.url, f.caFile, nil))
		if got := ask(t, bob, f.url+"/version"); got.code != http.StatusOK {
			t.Fatalf("bob: %v", got)
		}
	})
	t.Run("a user's watches beyond the limit get 429", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		count := map[int]int{}
		for range 25 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/api/v1/namespaces/"+f.ns+"/configmaps?watch=true&resourceVersion=0&timeoutSeconds=60&labelSelector=none%3Dnone", nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(shortErr(err))
			}
			count[resp.StatusCode]++
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
			} else {
				defer resp.Body.Close()
			}
		}
		if count[http.StatusOK] != 20 || count[http.StatusTooManyRequests] != 5 {
			t.Fatalf("25 watches with maxWatchesPerUser 20: %v", count)
		}
	})
}

func TestTenThousandWatchesAreBoundedAndAnIdleWatchCostsLittle(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	path := filepath.Join(t.TempDir(), "config.yaml")
	// A namespace of its own: an idle watch is measured, not the initial snapshot of whatever
	// objects earlier tests left in the cluster (listing and sorting those per watch is slow and
	// grows each watch's stack).
	ns := namespace(t)
	writeFile(t, path, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
api:
  address: "127.0.0.1:0"
  tls: {selfSignedCAFile: %s}
  limits: {maxWatches: 2000, maxWatchesPerUser: 2000}
  # Every watch after the first finds its decisions cached, however slowly a loaded machine
  # opens them: a review made on a watch's own goroutine would grow its stack.
  auth: {tokenCacheTTL: 10m, allowCacheTTL: 10m}
metrics: {address: "127.0.0.1:0", pprof: true}
`, ns, caFile))
	p := startReady(t, runner.Options{Binary: plainBinary(t), Config: path})
	url, metrics, _ := p.WaitListening(t.Context())
	client := httpClient(t, dynwatchAPI{url: url, caFile: caFile}.restConfig(cluster.Config.BearerToken))
	// One watch first, so that the connections' and the handler's one-off costs are paid.
	memory := func() (heap, stack, rss float64) {
		// Each profile collects garbage first; twice, so that sync.Pool's victim caches of
		// the rejected requests' buffers are gone too.
		for range 2 {
			resp, err := http.Get(metrics + "/debug/pprof/heap?gc=1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		return metricValue(t, metrics, "go_memstats_heap_inuse_bytes"), metricValue(t, metrics, "go_memstats_stack_inuse_bytes"),
			metricValue(t, metrics, "process_resident_memory_bytes")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	watch := func() int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&resourceVersion=0&labelSelector=none%3Dnone", nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
		}
		return resp.StatusCode
	}
	if code := watch(); code != http.StatusOK {
		t.Fatalf("the first watch: %d", code)
	}
	heap0, stack0, rss0 := memory()
	// attempt opens n watches from workers goroutines and counts the answers.
	attempt := func(n, workers int) map[int]int {
		codes := make(chan int, n)
		jobs := make(chan struct{})
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range jobs {
					codes <- watch()
				}
			})
		}
		for range n {
			jobs <- struct{}{}
		}
		close(jobs)
		wg.Wait()
		close(codes)
		count := map[int]int{}
		for c := range codes {
			count[c]++
		}
		return count
	}
	// Up to the limit first, from a steady number of connections, to measure what each costs.
	if count := attempt(1999, 64); count[http.StatusOK] != 1999 {
		t.Fatalf("1999 watches with maxWatches 2000 (one already open): %v", count)
	}
	heap1, stack1, rss1 := memory()
	n := 1999.0
	// Then a flood from one user: all refused, at once, and dynwatch stays up.
	const attempts = 10_000
	start := time.Now()
	count := attempt(attempts, 1000)
	elapsed := time.Since(start)
	if count[http.StatusTooManyRequests] != attempts {
		t.Fatalf("%d more watch attempts beyond maxWatches: %v, want all 429", attempts, count)
	}
	if code := ask(t, client, url+"/api/v1/namespaces/"+ns+"/configmaps?limit=1"); code.code != http.StatusOK {
		t.Fatalf("a list after the flood: %v", code)
	}
	// The heap is the measure (what a watch allocates and keeps); each watch also holds the
	// goroutine net/http serves its HTTP/2 stream on, whose stack is reported beside it.
	heapPerWatch := (heap1 - heap0) / n
	t.Logf("%d watch attempts beyond the limit refused in %s; per idle watch: heap %.1f KiB, goroutine stack %.1f KiB, resident %.1f KiB",
		attempts, elapsed.Round(time.Millisecond), heapPerWatch/1024, (stack1-stack0)/n/1024, (rss1-rss0)/n/1024)
	if heapPerWatch > 16*1024 {
		t.Fatalf("an idle watch keeps %.1f KiB of heap, want at most 16 KiB", heapPerWatch/1024)
	}
}
