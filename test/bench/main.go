// Command bench measures dynwatch side by side with its fair baselines, in one run on the same
// data: B0, a bare client-go dynamic informer (./baseline), and the kube-apiserver's own LIST.
// It starts the test bed, creates realistic configmaps, runs both watchers as separate
// processes, storms them with updates, queries both dynwatch and the apiserver, and prints one
// table of figures and ratios (and writes it as JSON with -json). Run it with `make bench`.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

const namespace = "bench"

// queueMargin is the webhook queue's room beyond the initial list, for the storm.
const queueMargin = 10000

type options struct {
	objects, updates, rate, queries int
	jsonPath, profile               string
}

func main() {
	var o options
	flag.IntVar(&o.objects, "objects", 20000, "configmaps to create")
	flag.IntVar(&o.updates, "updates", 5000, "updates in the storm")
	flag.IntVar(&o.rate, "rate", 1000, "updates per second in the storm")
	flag.IntVar(&o.queries, "queries", 200, "requests per query measurement")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.profile, "profile", "", "write dynwatch's CPU profile during the storm to this file")
	flag.Parse()
	ctx := context.Background()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// result is one row of the table.
type result struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Dynwatch float64 `json:"dynwatch"`
	Baseline float64 `json:"baseline"`
	Against  string  `json:"against"`
	Ratio    float64 `json:"ratio"` // dynwatch / baseline
	Target   string  `json:"target"`
	Met      bool    `json:"met"`
}

func row(name, unit string, dw, base float64, against, target string, met func(r float64) bool) result {
	r := result{Name: name, Unit: unit, Dynwatch: dw, Baseline: base, Against: against, Target: target}
	if base > 0 {
		r.Ratio = dw / base
	}
	r.Met = met(r.Ratio)
	return r
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...) }

func run(ctx context.Context, o options) error {
	start := time.Now()
	cluster, err := testbed.Start(ctx, testbed.Options{Out: os.Stderr})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	fast := rest.CopyConfig(cluster.Config)
	fast.QPS, fast.Burst = -1, 0
	cs := kubernetes.NewForConfigOrDie(fast)
	objBytes, err := load(ctx, cs, o.objects)
	if err != nil {
		return err
	}
	logf("created %d configmaps of %d bytes each (with managedFields of 2 managers and last-applied) in %s", o.objects, objBytes, time.Since(start).Round(time.Second))

	baselineBin := filepath.Join(cluster.Dir, "baseline")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", baselineBin, "./test/bench/baseline").CombinedOutput(); err != nil {
		return fmt.Errorf("build baseline: %w\n%s", err, out)
	}
	dwBin, err := runner.Build(ctx, cluster.Dir, false)
	if err != nil {
		return err
	}

	// B0 first, alone: time to synced and heap.
	b0, err := startBaseline(ctx, baselineBin, cluster.Kubeconfig)
	if err != nil {
		return err
	}
	defer b0.stop()
	b0Synced := b0.synced
	b0Heap, err := liveHeap(ctx, b0.url)
	if err != nil {
		return err
	}
	logf("B0 synced in %s, live heap %d MB", b0Synced.Round(time.Millisecond), b0Heap>>20)

	// dynwatch, alone: time to synced, then the initial-list deliveries drain, then heap.
	recv := newReceiver()
	defer recv.close()
	dw, err := startDynwatch(ctx, dwBin, cluster, recv.url, o.objects)
	if err != nil {
		return err
	}
	defer dw.stop()
	if err := waitFor(ctx, 5*time.Minute, func() bool { return recv.count() >= o.objects }); err != nil {
		return fmt.Errorf("initial-list deliveries: %d of %d: %w", recv.count(), o.objects, err)
	}
	dwHeap, err := liveHeap(ctx, dw.metrics)
	if err != nil {
		return err
	}
	logf("dynwatch synced in %s, live heap %d MB, %d initial events delivered", dw.synced.Round(time.Millisecond), dwHeap>>20, recv.count())

	// The storm, both running: CPU per update and event latency.
	b0CPU0, dwCPU0 := cpuSeconds(b0.pid), cpuSeconds(dw.pid)
	profiled := make(chan error, 1)
	if o.profile != "" {
		seconds := max(1, o.updates/o.rate)
		go func() { profiled <- saveProfile(ctx, dw.metrics, seconds, o.profile) }()
	} else {
		profiled <- nil
	}
	written, err := storm(ctx, cs, o)
	if err != nil {
		return err
	}
	var b0Arrivals map[string]int64
	err = waitFor(ctx, 2*time.Minute, func() bool {
		b0Arrivals, err = baselineArrivals(ctx, b0.url)
		return err == nil && covers(b0Arrivals, written) && recv.covers(written)
	})
	if err != nil {
		return fmt.Errorf("storm events not all seen (B0 %d, dynwatch %d of %d): %w", len(b0Arrivals), recv.count()-o.objects, len(written), err)
	}
	b0CPU, dwCPU := cpuSeconds(b0.pid)-b0CPU0, cpuSeconds(dw.pid)-dwCPU0
	if err := <-profiled; err != nil {
		return err
	}
	b0Lat, dwLat := latencies(written, b0Arrivals), latencies(written, recv.arrivals())
	logf("storm: %d updates; CPU B0 %.2fs, dynwatch %.2fs", len(written), b0CPU, dwCPU)

	// Queries for the same label selector: dynwatch (indexed) against the apiserver's LIST.
	api, _, _ := dw.rp.WaitListening(ctx)
	path := "/api/v1/namespaces/" + namespace + "/configmaps?labelSelector=app%3Dapp-07"
	apiClient, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		return err
	}
	var rows []result
	perObj := func(b uint64) float64 { return float64(b) / float64(o.objects) / 1024 }
	n := float64(len(written))
	rows = append(rows,
		row("time to synced", "s", dw.synced.Seconds(), b0Synced.Seconds(), "B0", "≤ 1.1x", func(r float64) bool { return r <= 1.1 }),
		row("live heap per object after sync and GC", "KiB", perObj(dwHeap), perObj(b0Heap), "B0", "≤ 0.5x", func(r float64) bool { return r <= 0.5 }),
		row("CPU per update (dynwatch incl. webhook delivery)", "µs", dwCPU/n*1e6, b0CPU/n*1e6, "B0", "≤ 1.15x", func(r float64) bool { return r <= 1.15 }),
		row("update → receipt p50 (dynwatch: webhook; B0: handler)", "ms", pct(dwLat, 50), pct(b0Lat, 50), "B0", "", func(float64) bool { return true }),
		row("update → receipt p99 (dynwatch: webhook; B0: handler)", "ms", pct(dwLat, 99), pct(b0Lat, 99), "B0", "dynwatch ≤ 25 ms", func(float64) bool { return pct(dwLat, 99) <= 25 }),
	)
	for _, q := range []struct{ name, query string }{{"query, full result", path}, {"query, page of 100", path + "&limit=100"}} {
		dwQ, err := timeRequests(ctx, http.DefaultClient, api+q.query, "", o.queries)
		if err != nil {
			return err
		}
		apiQ, err := timeRequests(ctx, apiClient, cluster.URL()+q.query, cluster.Config.BearerToken, o.queries)
		if err != nil {
			return err
		}
		rows = append(rows,
			row(q.name+" p50", "ms", pct(dwQ, 50), pct(apiQ, 50), "apiserver LIST", "", func(float64) bool { return true }),
			row(q.name+" p99", "ms", pct(dwQ, 99), pct(apiQ, 99), "apiserver LIST", "≤ 0.1x (10x faster)", func(r float64) bool { return r <= 0.1 }),
		)
	}
	print(o, objBytes, rows, time.Since(start))
	if o.jsonPath != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"machine": machine(), "objects": o.objects, "objectBytes": objBytes, "updates": len(written), "rate": o.rate, "results": rows,
		}, "", "  ")
		if err := os.WriteFile(o.jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// load creates n configmaps of about 4 KB: applied by two field managers with server-side
// apply, carrying kubectl's last-applied annotation, labelled from small sets.
func load(ctx context.Context, cs kubernetes.Interface, n int) (int, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	payload := func(size int) string {
		b := make([]byte, size/2)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				name := fmt.Sprintf("cm-%05d", i)
				data := map[string]string{"config.json": payload(1100), "settings.ini": payload(400)}
				lastApplied, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": namespace}, "data": data})
				deployer := corev1apply.ConfigMap(name, namespace).
					WithLabels(map[string]string{"app": fmt.Sprintf("app-%02d", i%20), "tier": []string{"web", "db", "cache", "batch"}[i%4]}).
					WithAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(lastApplied), "example.com/team": fmt.Sprintf("team-%d", i%5)}).
					WithData(data)
				operator := corev1apply.ConfigMap(name, namespace).WithData(map[string]string{"operator-note": payload(200)})
				for _, a := range []struct {
					manager string
					cfg     *corev1apply.ConfigMapApplyConfiguration
				}{{"deployer", deployer}, {"operator", operator}} {
					if _, err := cs.CoreV1().ConfigMaps(namespace).Apply(ctx, a.cfg, metav1.ApplyOptions{FieldManager: a.manager}); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces", namespace, "configmaps", "cm-00000").DoRaw(ctx)
	return len(b), err
}

type proc struct {
	cmd    *exec.Cmd
	pid    int
	url    string
	synced time.Duration
	stop   func()
}

// startBaseline starts B0 and waits until it has synced, timing it from the start.
func startBaseline(ctx context.Context, bin, kubeconfig string) (*proc, error) {
	t0 := time.Now()
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--namespace", namespace)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, stop: func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("baseline: %w", err)
	}
	p.url = "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	if err := waitFor(ctx, 5*time.Minute, func() bool { return status(p.url+"/readyz") == http.StatusOK }); err != nil {
		p.stop()
		return nil, fmt.Errorf("baseline did not sync: %w", err)
	}
	p.synced = time.Since(t0)
	return p, nil
}

type dwProc struct {
	proc
	rp      *runner.Process
	metrics string
}

func startDynwatch(ctx context.Context, bin string, cluster *testbed.Cluster, receiver string, objects int) (*dwProc, error) {
	cfg := filepath.Join(cluster.Dir, "bench-dynwatch.yaml")
	yaml := fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%s]
    indexers:
      - {name: byApp, type: label, key: app}
      - {name: byTeam, type: annotation, key: example.com/team}
      - {name: byOwner, type: owner}
webhooks:
  - {name: bench, url: %s, workers: 4, queueSize: %d}  # room for the initial list
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0", pprof: true}
state: {path: %s}  # as the chart runs it: every event through the state store
`, namespace, receiver, objects+queueMargin, filepath.Join(cluster.Dir, "bench-state.db"))
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	t0 := time.Now()
	p, err := runner.Start(runner.Options{Binary: bin, Config: cfg, Kubeconfig: cluster.Kubeconfig, Log: io.Discard})
	if err != nil {
		return nil, err
	}
	stop := func() { _ = p.Stop(10 * time.Second) }
	// Poll /readyz exactly as for B0.
	listenCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, metrics, err := p.WaitListening(listenCtx)
	if err == nil {
		err = waitFor(ctx, 5*time.Minute, func() bool { return status(metrics+"/readyz") == http.StatusOK })
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("dynwatch did not sync: %w\n%s", err, p.Log())
	}
	return &dwProc{proc: proc{pid: p.PID(), synced: time.Since(t0), stop: stop}, rp: p, metrics: metrics}, nil
}

type write struct {
	rv      string
	started time.Time
}

// storm patches random objects at o.rate per second and returns, per update, the new
// resourceVersion and when its request started.
func storm(ctx context.Context, cs kubernetes.Interface, o options) ([]write, error) {
	jobs := make(chan int)
	var mu sync.Mutex
	var out []write
	var firstErr error
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range jobs {
				name := fmt.Sprintf("cm-%05d", (i*7919)%o.objects)
				patch := fmt.Appendf(nil, `{"data":{"touched":"%d"}}`, i)
				t0 := time.Now()
				cm, err := cs.CoreV1().ConfigMaps(namespace).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				} else if err == nil {
					out = append(out, write{rv: cm.ResourceVersion, started: t0})
				}
				mu.Unlock()
			}
		})
	}
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	for i := range o.updates {
		<-tick.C
		jobs <- i
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	return out, firstErr
}

// receiver is the webhook receiver: it reads and discards each request, noting when each
// resourceVersion (from ce-id, uid.rv.type) arrived.
type receiver struct {
	url  string
	srv  *http.Server
	mu   sync.Mutex
	seen map[string]int64
	n    int
}

func newReceiver() *receiver {
	r := &receiver{seen: map[string]int64{}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	r.url = "http://" + ln.Addr().String() + "/events"
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		now := time.Now().UnixNano()
		parts := strings.Split(req.Header.Get("ce-id"), ".")
		r.mu.Lock()
		r.n++
		if len(parts) == 3 {
			r.seen[parts[1]] = now
		}
		r.mu.Unlock()
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return r
}

func (r *receiver) close() { _ = r.srv.Close() }

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *receiver) arrivals() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int64, len(r.seen))
	for k, v := range r.seen {
		out[k] = v
	}
	return out
}

func (r *receiver) covers(ws []write) bool { return covers(r.arrivals(), ws) }

func covers(arrivals map[string]int64, ws []write) bool {
	for _, w := range ws {
		if _, ok := arrivals[w.rv]; !ok {
			return false
		}
	}
	return true
}

func baselineArrivals(ctx context.Context, url string) (map[string]int64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var m map[string]int64
	return m, json.NewDecoder(resp.Body).Decode(&m)
}

// latencies are the times from each update's request to its arrival, sorted.
func latencies(ws []write, arrivals map[string]int64) []time.Duration {
	out := make([]time.Duration, 0, len(ws))
	for _, w := range ws {
		out = append(out, time.Duration(arrivals[w.rv]-w.started.UnixNano()))
	}
	slices.Sort(out)
	return out
}

// pct is the p-th percentile of sorted durations, in milliseconds.
func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	return float64(d[min(len(d)-1, len(d)*p/100)].Microseconds()) / 1000
}

// liveHeap forces a GC in the process and returns its HeapAlloc, through /debug/pprof/heap.
func liveHeap(ctx context.Context, base string) (uint64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/heap?gc=1&debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no HeapAlloc in %s/debug/pprof/heap", base)
}

// saveProfile writes a CPU profile of the process over the next seconds to path.
func saveProfile(ctx context.Context, base string, seconds int, path string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, seconds), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// cpuSeconds is the user+system CPU time the process has used.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func timeRequests(ctx context.Context, c *http.Client, url, token string, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		out = append(out, time.Since(t0))
	}
	slices.Sort(out)
	return out, nil
}

func status(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name\t: "); ok {
				model = v
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s), %s %s/%s", runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func print(o options, objBytes int, rows []result, took time.Duration) {
	fmt.Printf("dynwatch benchmark: %d configmaps of %d bytes, %d updates at %d/s, %d requests per query; %s; took %s\n\n",
		o.objects, objBytes, o.updates, o.rate, o.queries, machine(), took.Round(time.Second))
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "measure\tunit\tdynwatch\tbaseline\tbaseline is\tratio\ttarget\tmet")
	for _, r := range rows {
		met := "yes"
		if !r.Met {
			met = "NO"
		}
		if r.Target == "" {
			met = ""
		}
		fmt.Fprintf(w, "%s\t%s\t%.3f\t%.3f\t%s\t%.2fx\t%s\t%s\n", r.Name, r.Unit, r.Dynwatch, r.Baseline, r.Against, r.Ratio, r.Target, met)
	}
	_ = w.Flush()
}
