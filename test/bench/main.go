// Command bench measures dynwatch side by side with its fair baselines, in one run on the same
// data: B0, a bare client-go dynamic informer (./baseline); B1, the same informer stripping
// what dynwatch strips by default with a transform (./baseline -strip), measured until synced
// only; and the kube-apiserver's own LIST. It starts the test bed, creates realistic configmaps
// (or pods, with -resource pods), runs the watchers as separate processes, storms B0 and
// dynwatch with updates, queries both dynwatch and the apiserver as a user RBAC lets read the
// objects (dynwatch's API authorizing as an install's does), and prints one table of
// figures and ratios (and writes it as JSON with -json).
// Run it with `make bench`. With -initial-state it measures instead what a webhook added by a
// reload with initialState costs another sink's latency while its replay runs (initialstate.go).
// With -metadata-only it measures what resources[].cache: metadata saves against cache: full
// (metadataonly.go). With -sinks it measures how fast each kind of sink is handed a backlog of
// every object, and dynwatch's CPU per event (sinks.go). With -subscriptions, what teams'
// Subscriptions cost the configured webhooks (subscriptions.go).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

const namespace = "bench"

type options struct {
	objects, updates, rate, queries          int
	resource, jsonPath, profile, heapProfile string
	queryTrace                               string // -query-trace: dynwatch's execution trace through a query row
	queryProfile                             string // -query-profile: with -history, dynwatch's CPU profile while it answers lists at a past resourceVersion
	allocProfile                             string // -alloc-profile: what dynwatch allocated during the storm
	stormTrace                               string // -storm-trace: dynwatch's execution trace of the storm
	json, chart, race                        bool
	filtered                                 bool // -filtered: a second webhook with a CEL filter
	small                                    bool // configmaps of about 1 KB, created without server-side apply
	alone, baselines                         bool // -alone: each watcher alone, no storm; -baselines=false: no B0 or B1
	env                                      []string
	initialState                             bool
	metadataOnly                             bool
	sinks                                    bool
	history                                  bool
	subscriptions                            bool
	sinkWorkers                              int           // -sinks: every sink's workers
	profileSeconds                           int           // -initial-state, -sinks: the profile's length
	beforeReload                             time.Duration // -initial-state: the steady sink measured alone
}

func main() {
	var o options
	flag.IntVar(&o.objects, "objects", 20000, "objects to create")
	flag.StringVar(&o.resource, "resource", "configmaps", "the objects: configmaps (about 4 KB each) or pods (a Deployment's, running, about 10 KB)")
	flag.IntVar(&o.updates, "updates", 5000, "updates in the storm")
	flag.IntVar(&o.rate, "rate", 1000, "updates per second in the storm")
	flag.IntVar(&o.queries, "queries", 200, "requests per query measurement")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.profile, "profile", "", "write dynwatch's CPU profile during the storm to this file (-initial-state and -sinks: see there)")
	flag.StringVar(&o.heapProfile, "heap-profile", "", "write dynwatch's heap profile, taken after the storm, to this file")
	flag.StringVar(&o.allocProfile, "alloc-profile", "", "write what dynwatch allocated during the storm, as a heap profile, to this file (go tool pprof -sample_index=alloc_space)")
	flag.StringVar(&o.stormTrace, "storm-trace", "", "write dynwatch's execution trace of the storm to this file (go tool trace; it slows the storm's rows)")
	flag.StringVar(&o.queryProfile, "query-profile", "", "with -history: write dynwatch's CPU profile while it answers lists at a resourceVersion before the storm, after they are measured, to this file")
	flag.StringVar(&o.queryTrace, "query-trace", "", "write dynwatch's execution trace while it answers the two-label page's requests to this file (go tool trace)")
	flag.Func("env", "KEY=VALUE added to dynwatch's environment (GOGC=50, for one); may be repeated", func(v string) error {
		o.env = append(o.env, v)
		return nil
	})
	flag.BoolVar(&o.json, "json-only", false, "run the apiserver without CBOR (its CBORServingAndStorage feature gate off), so that dynwatch reads JSON as B0 does")
	flag.BoolVar(&o.filtered, "filtered", false, "give dynwatch a second webhook, to a receiver of its own, whose CEL filter reads one label and the data: "+filteredSink)
	flag.BoolVar(&o.chart, "chart", false, "run dynwatch with the chart's default configuration: the resource cluster-wide, one indexer, no webhook; the storm's updates are received from a watch of its API")
	flag.BoolVar(&o.small, "small", false, "with -resource configmaps: configmaps of about 1 KB, created without server-side apply (the million-object run)")
	flag.BoolVar(&o.alone, "alone", false, "measure memory with each watcher alone, B0, B1 and dynwatch one after the other, each stopped once measured, then dynwatch's queries; no storm (for runs in which B0 and B1 held beside dynwatch would not fit in memory)")
	flag.BoolVar(&o.baselines, "baselines", true, "with -alone: run B0 and B1 (false: dynwatch alone, when no baseline fits in memory)")
	flag.BoolVar(&o.race, "race", false, "build dynwatch with the race detector, as the e2e tests run it")
	flag.BoolVar(&o.initialState, "initial-state", false, "measure instead a steady sink's latency before and while a sink added by a reload with initialState is replayed the objects (10,000 unless -objects is given); -profile then profiles the replay")
	flag.IntVar(&o.profileSeconds, "profile-seconds", 5, "with -initial-state or -sinks: the length of the CPU profile, from the reload or the Lease's release (on 2 cores, -initial-state's 10,000 configmaps take about 6 s)")
	flag.DurationVar(&o.beforeReload, "before", 20*time.Second, "with -initial-state: how long the steady sink's latency is measured before the reload")
	flag.BoolVar(&o.metadataOnly, "metadata-only", false, "measure instead dynwatch's memory with the chart's default config and cache: metadata against cache: full, one process after the other (5,000 objects unless -objects is given; -json-only unless -json-only=false); -heap-profile heap.pprof then writes heap-full.pprof and heap-metadata.pprof")
	flag.BoolVar(&o.sinks, "sinks", false, "measure instead each kind of sink's throughput (webhook, JetStream, Kafka): a backlog of every object, held in the outbox while another holds the Lease, delivered once it is let go, one dynwatch per kind; -profile sinks.pprof then writes sinks-webhook.pprof, sinks-jetstream.pprof and sinks-kafka.pprof")
	flag.IntVar(&o.sinkWorkers, "sink-workers", 64, "with -sinks: the workers of every sink")
	flag.BoolVar(&o.history, "history", false, "measure instead what resources[].history costs and its reads: dynwatch with history on and off side by side through one storm (history.go); -profile profiles the one with history on through the storm")
	flag.BoolVar(&o.subscriptions, "subscriptions", false, fmt.Sprintf("measure instead what %d teams' Subscriptions (%d each) cost three configured webhooks: dynwatch serving them and dynwatch without them side by side through one storm (subscriptions.go; %d objects, %d updates at %d/s unless given)", subscriptionTeams, subscriptionsPerTeam, subscriptionsObjects, subscriptionsUpdates, subscriptionsRate))
	flag.Parse()
	if o.subscriptions {
		for name, v := range map[string]*int{"objects": &o.objects, "updates": &o.updates, "rate": &o.rate} {
			if !flagSet(name) {
				*v = map[string]int{"objects": subscriptionsObjects, "updates": subscriptionsUpdates, "rate": subscriptionsRate}[name]
			}
		}
	}
	if o.sinks && !flagSet("objects") {
		o.objects = sinksObjects
	}
	if o.initialState && !flagSet("objects") {
		o.objects = initialStateObjects
	}
	if o.metadataOnly && !flagSet("objects") {
		o.objects = metadataOnlyObjects
	}
	if o.metadataOnly && !flagSet("json-only") {
		o.json = true
	}
	modes := 0
	for _, on := range []bool{o.initialState, o.metadataOnly, o.sinks, o.history, o.subscriptions} {
		if on {
			modes++
		}
	}
	if modes > 1 {
		fmt.Fprintln(os.Stderr, "bench: -initial-state, -metadata-only, -sinks, -history and -subscriptions are different runs: give one")
		os.Exit(2)
	}
	if o.chart && (o.initialState || o.sinks || o.subscriptions) {
		fmt.Fprintln(os.Stderr, "bench: -chart configures no sink, which -initial-state, -sinks and -subscriptions measure")
		os.Exit(2)
	}
	if o.filtered && (o.chart || modes > 0 || o.alone) {
		fmt.Fprintln(os.Stderr, "bench: -filtered adds a webhook to the storm's: give it without -chart, -alone, -initial-state, -metadata-only, -sinks and -history")
		os.Exit(2)
	}
	if o.alone && (modes > 0 || o.chart) {
		fmt.Fprintln(os.Stderr, "bench: -alone measures the default configuration's memory: give it without -initial-state, -metadata-only, -sinks and -chart")
		os.Exit(2)
	}
	if !o.baselines && !o.alone {
		fmt.Fprintln(os.Stderr, "bench: -baselines=false goes with -alone (the storm compares dynwatch with B0)")
		os.Exit(2)
	}
	if o.small && o.resource != "configmaps" {
		fmt.Fprintln(os.Stderr, "bench: -small goes with -resource configmaps")
		os.Exit(2)
	}
	if o.resource != "configmaps" && o.resource != "pods" {
		fmt.Fprintf(os.Stderr, "bench: -resource %q: configmaps or pods\n", o.resource)
		os.Exit(2)
	}
	ctx := context.Background()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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

// bed is what every run starts from: the test bed, loaded with the objects, and dynwatch built.
type bed struct {
	cluster  *testbed.Cluster
	cs       kubernetes.Interface // unthrottled
	objBytes int                  // one object's size, as the apiserver serves it in JSON
	dwBin    string
}

// setUp starts the test bed, creates o.objects objects of o.resource in it, lets reader read
// them and builds dynwatch. The caller stops the cluster.
func setUp(ctx context.Context, o options) (*bed, error) {
	start := time.Now()
	cluster, err := testbed.Start(ctx, testbed.Options{Out: os.Stderr, CBOR: !o.json})
	if err != nil {
		return nil, err
	}
	b := &bed{cluster: cluster}
	fast := rest.CopyConfig(cluster.Config)
	fast.QPS, fast.Burst = -1, 0
	b.cs = kubernetes.NewForConfigOrDie(fast)
	if b.objBytes, err = load(ctx, b.cs, o); err == nil {
		logf("created %d %s of %d bytes each (with managedFields) in %s", o.objects, o.resource, b.objBytes, time.Since(start).Round(time.Second))
		err = grantReads(ctx, b.cs, o.resource)
	}
	if err == nil {
		b.dwBin, err = runner.Build(ctx, cluster.Dir, o.race)
	}
	if err != nil {
		cluster.Stop()
		return nil, err
	}
	return b, nil
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	b, err := setUp(ctx, o)
	if err != nil {
		return err
	}
	defer b.cluster.Stop()
	if o.initialState {
		return runInitialState(ctx, o, b, start)
	}
	if o.metadataOnly {
		return runMetadataOnly(ctx, o, b, start)
	}
	if o.sinks {
		return runSinks(ctx, o, b, start)
	}
	if o.history {
		return runHistory(ctx, o, b, start)
	}
	if o.subscriptions {
		return runSubscriptions(ctx, o, b, start)
	}
	if o.alone {
		return runAlone(ctx, o, b, start)
	}
	cluster, cs, objBytes := b.cluster, b.cs, b.objBytes

	baselineBin, err := buildBaseline(ctx, cluster)
	if err != nil {
		return err
	}
	// B0 first, alone: time to synced and heap. It stays for the storm.
	b0, err := startBaseline(ctx, baselineBin, cluster.Kubeconfig, o.resource)
	if err != nil {
		return err
	}
	defer b0.stop()
	b0M, err := measureSynced(ctx, "B0", b0, b0.url)
	if err != nil {
		return err
	}
	// B1 next, alone in the same way: the bare informer with the transform a careful client-go
	// user would set. What it answers, the memory stripping alone saves, is known once it has
	// synced, so it is stopped before dynwatch starts and the two never compete.
	b1M, err := measureBaseline(ctx, "B1", baselineBin, cluster.Kubeconfig, o.resource, "-strip")
	if err != nil {
		return err
	}
	// dynwatch, alone: time to synced, then the initial-list deliveries drain (without a
	// webhook: the state store stops committing), then heap.
	recv := newReceiver()
	defer recv.close()
	dw, dwM, err := startMeasuredDynwatch(ctx, o, b, recv)
	if err != nil {
		return err
	}
	defer dw.stop()

	// The storm, both running: CPU per update and event latency.
	api, _, _ := dw.rp.WaitListening(ctx)
	token := cluster.Token(reader)
	collection := "/api/v1/namespaces/" + namespace + "/" + o.resource
	watchErr := make(chan error, 1)
	if o.chart {
		watchCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { watchErr <- recv.watch(watchCtx, api+collection, token) }()
	}
	b0CPU0, dwCPU0 := cpuSeconds(b0.pid), cpuSeconds(dw.pid)
	commits0 := counter(ctx, dw.metrics, "dynwatch_state_commits_total")
	written0 := counter(ctx, dw.metrics, "dynwatch_state_written_bytes_total")
	syncs0 := counter(ctx, dw.metrics, "dynwatch_state_syncs_total")
	compactions0 := counter(ctx, dw.metrics, "dynwatch_state_compactions_total")
	stormSeconds := max(1, o.updates/o.rate)
	profiled := startProfile(ctx, dw.metrics, stormSeconds, o.profile)
	allocs := startAllocProfile(ctx, dw.metrics, stormSeconds, o.allocProfile)
	traced := startTrace(ctx, dw.metrics, stormSeconds, o.stormTrace)
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
		select {
		case werr := <-watchErr:
			err = errors.Join(err, werr)
		default:
		}
		return fmt.Errorf("storm events not all seen (B0 %d, dynwatch %d of %d): %w", len(b0Arrivals), len(recv.arrivals()), len(written), err)
	}
	b0CPU, dwCPU := cpuSeconds(b0.pid)-b0CPU0, cpuSeconds(dw.pid)-dwCPU0
	commits := counter(ctx, dw.metrics, "dynwatch_state_commits_total") - commits0
	bytesWritten := counter(ctx, dw.metrics, "dynwatch_state_written_bytes_total") - written0
	fsyncs := counter(ctx, dw.metrics, "dynwatch_state_syncs_total") - syncs0
	compactions := counter(ctx, dw.metrics, "dynwatch_state_compactions_total") - compactions0
	syncs, err := fdatasyncLatencies(filepath.Join(cluster.Dir, "state"), 200)
	if err != nil {
		return err
	}
	if err := errors.Join(<-profiled, <-allocs, <-traced); err != nil {
		return err
	}
	if o.heapProfile != "" {
		if err := saveURL(ctx, dw.metrics+"/debug/pprof/heap?gc=1", o.heapProfile); err != nil {
			return err
		}
	}
	b0Lat, dwLat := latencies(written, b0Arrivals), latencies(written, recv.arrivals())
	logf("storm: %d updates; CPU B0 %.2fs, dynwatch %.2fs; %.0f state store commits", len(written), b0CPU, dwCPU, commits)
	logf("storm: dynwatch's receipts later than B0's p99 (%.1f ms), per second of the storm: %v", pct(b0Lat, 99), lateBySecond(written, recv.arrivals(), percentile(b0Lat, 99)))

	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	n := float64(len(written))
	always := func(float64) bool { return true }
	delivery, receipt := "incl. webhook delivery", "webhook"
	if o.chart {
		delivery, receipt = "incl. serving one API watch", "API watch"
	}
	rows := append(memoryRows(o, dwM, &b0M, &b1M),
		row("CPU per update (dynwatch "+delivery+")", "µs", dwCPU/n*1e6, b0CPU/n*1e6, "B0", "≤ 0.9x", func(r float64) bool { return r <= 0.9 }),
		row("state store commits per update", "", commits/n, 0, "", "", always),
		row("state store fdatasyncs per update", "", fsyncs/n, 0, "", "", always),
		row("state store bytes written per update", "KiB", bytesWritten/n/1024, 0, "", "", always),
		// A snapshot of the whole state written beside the storm's commits shares the 2 CPUs.
		row("state store snapshots finished during the storm", "", compactions, 0, "", "", always),
		row("fdatasync p99 of the store's volume (4 KiB appends)", "ms", pct(syncs, 99), 0, "", "", always),
		row("update → receipt p50 (dynwatch: "+receipt+"; B0: handler)", "ms", pct(dwLat, 50), pct(b0Lat, 50), "B0", "", always),
		// Delivery does not wait for the commit's fdatasync (journal.syncEvery).
		row("update → receipt p99 (dynwatch: "+receipt+"; B0: handler)", "ms", pct(dwLat, 99), pct(b0Lat, 99), "B0", "≤ B0 + 1 ms", func(float64) bool { return pct(dwLat, 99) <= pct(b0Lat, 99)+1 }),
	)
	queries, err := queryRows(ctx, o, cluster, api, dw.metrics, token)
	if err != nil {
		return err
	}
	rows = append(rows, queries...)
	// Steady: after the storm and the queries, both processes idle.
	b0End, dwEnd := residentMemory(b0.pid), residentMemory(dw.pid)
	rows = append(rows,
		row("resident memory at the end (steady, idle)", "MB", mb(dwEnd.now), mb(b0End.now), "B0", "", always),
		row("resident memory at the end: anonymous (RssAnon)", "MB", mb(dwEnd.anon), mb(b0End.anon), "B0", "", always),
		row("resident memory at the end: file-backed (RssFile)", "MB", mb(dwEnd.file), mb(b0End.file), "B0", "", always),
		row("peak resident memory (VmHWM), whole run", "MB", mb(dwEnd.peak), mb(b0End.peak), "B0", "", always),
		// The store's files against the state they hold (objects' JSON and outbox entries): a
		// snapshot is written once the log after it has outgrown it.
		row("state store size at the end", "MB", mb(uint64(counter(ctx, dw.metrics, "dynwatch_state_size_bytes"))), mb(uint64(counter(ctx, dw.metrics, "dynwatch_state_held_bytes"))), "state held", "≤ 2x", func(r float64) bool { return r <= 2 }),
	)
	logf("at the end: dynwatch resident %d MB of which %d MB file-backed; B0 %d MB", dwEnd.now>>20, dwEnd.file>>20, b0End.now>>20)
	if pages, err := binaryPages(dw.pid); err == nil {
		// Pages the heap profile taken after sync touched are among them (see measureSynced).
		logf("at the end: dynwatch's executable's resident pages %.1f MB; the largest parts: %s", float64(pages.total)/(1<<20), strings.Join(pages.largest(20), ", "))
	}
	printTable(title(o, objBytes, time.Since(start)), [2]string{"dynwatch", "baseline"}, rows)
	return saveResults(o, objBytes, rows, map[string]any{"updates": len(written), "rate": o.rate})
}

type proc struct {
	cmd    *exec.Cmd
	pid    int
	url    string
	synced time.Duration
	peak   uint64 // VmHWM when synced: the peak resident memory from the start
	stop   func()
}

// startBaseline starts the baseline with flags (none: B0; -strip: B1) and waits until it has
// synced, timing it from the start.
func startBaseline(ctx context.Context, bin, kubeconfig, resource string, flags ...string) (*proc, error) {
	t0 := time.Now()
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig, "--namespace", namespace, "--resource", resource}, flags...)...)
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
	if err := waitFor(ctx, syncWait, func() bool { return status(p.url+"/readyz") == http.StatusOK }); err != nil {
		p.stop()
		return nil, fmt.Errorf("baseline did not sync: %w", err)
	}
	p.synced = time.Since(t0)
	p.peak = residentMemory(p.pid).peak
	return p, nil
}

// syncWait bounds every wait for a watcher to sync or for dynwatch's initial deliveries to
// drain: 100,000 pods take B1 over 6 minutes to list, a million configmaps dynwatch longer.
const syncWait = 30 * time.Minute

// buildBaseline builds B0 and B1's binary into the cluster's directory.
func buildBaseline(ctx context.Context, cluster *testbed.Cluster) (string, error) {
	bin := filepath.Join(cluster.Dir, "baseline")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./test/bench/baseline").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build baseline: %w\n%s", err, out)
	}
	return bin, nil
}

// measured is what a watcher's memory rows are read from, once it has synced (dynwatch: once
// its initial-list deliveries have drained, or with -chart its state store has caught up).
type measured struct {
	synced time.Duration
	peak   uint64   // VmHWM at synced: the peak from the start to synced
	first  resident // then, at once
	rss    resident // once settled (see settled; its peak: from the start to then)
	heap   goMemory // the Go runtime's memory then, after a forced GC
	binary pagesOf  // the executable's own resident pages then
}

// measureSynced reads a synced process's resident memory and its executable's resident pages,
// then its live heap from heapURL's /debug/pprof/heap, and logs them under name.
func measureSynced(ctx context.Context, name string, p *proc, heapURL string) (measured, error) {
	// Resident memory first: the heap profile read next symbolizes every allocation site it
	// holds, which maps pages of the executable's line tables (.gopclntab) that nothing else
	// touches, and they stay mapped for the rest of the run.
	first := residentMemory(p.pid)
	m := measured{synced: p.synced, peak: p.peak, first: first, rss: settled(ctx, p.pid, first)}
	var err error
	if m.binary, err = binaryPages(p.pid); err != nil {
		return measured{}, fmt.Errorf("%s: its executable's resident pages: %w", name, err)
	}
	if m.heap, err = readGoMemory(ctx, heapURL); err != nil {
		return measured{}, fmt.Errorf("%s: %w", name, err)
	}
	logf("%s: its executable's resident pages %.1f MB; the largest parts: %s", name, float64(m.binary.total)/(1<<20), strings.Join(m.binary.largest(20), ", "))
	logf("%s synced in %s, live heap %d MB, resident %d MB of which %d MB file-backed once settled, %d MB at once (peak %d MB to synced, %d MB to now)",
		name, m.synced.Round(time.Millisecond), m.heap.live>>20, m.rss.now>>20, m.rss.file>>20, m.first.now>>20, m.peak>>20, m.rss.peak>>20)
	return m, nil
}

// settleFor and settleAtMost bound settled's wait: resident memory is settled once it has not
// fallen by more than settleBy over settleFor.
const (
	settleFor    = 2 * time.Second
	settleAtMost = 10 * time.Second
	settleBy     = 1 << 20
)

// settled is pid's resident memory once it has stopped falling, from first, its reading when
// it synced: what the process holds once synced and its initial work done, not what the
// runtime has yet to give back (dynwatch returns the heap its initial deliveries left free
// once they are acknowledged, within about a second). A process whose memory does not fall
// (B0, B1) is read again settleFor after first.
func settled(ctx context.Context, pid int, first resident) resident {
	const every = 250 * time.Millisecond
	readings := []resident{first}
	deadline := time.Now().Add(settleAtMost)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return readings[len(readings)-1]
		case <-time.After(every):
		}
		r := residentMemory(pid)
		readings = append(readings, r)
		if back := len(readings) - 1 - int(settleFor/every); back >= 0 && readings[back].now < r.now+settleBy {
			return r
		}
	}
	return readings[len(readings)-1]
}

// measureBaseline starts the baseline with flags (none: B0; -strip: B1), measures it once it
// has synced, and stops it.
func measureBaseline(ctx context.Context, name, bin, kubeconfig, resource string, flags ...string) (measured, error) {
	p, err := startBaseline(ctx, bin, kubeconfig, resource, flags...)
	if err != nil {
		return measured{}, fmt.Errorf("%s: %w", name, err)
	}
	defer p.stop()
	return measureSynced(ctx, name, p, p.url)
}

// filteredSink is the filter of -filtered's second webhook: one label and whether the object
// has data (every configmap of the bench has both; no pod has data).
const filteredSink = `has(object.metadata.labels.tier) && has(object.data)`

// startMeasuredDynwatch starts dynwatch with one webhook to recv (with -chart: none, as the
// chart configures; with -filtered, a second one, filtered, to a receiver of its own), waits until its initial-list deliveries have reached recv (with -chart:
// until its state store has stopped committing the initial list), and measures it.
func startMeasuredDynwatch(ctx context.Context, o options, b *bed, recv *receiver) (*dwProc, measured, error) {
	var webhooks []string
	if !o.chart {
		// The default queue: what it cannot hold waits in the outbox.
		webhooks = append(webhooks, fmt.Sprintf("{name: bench, url: %s, workers: 4}", recv.serve()))
	}
	if o.filtered {
		other := newReceiver()
		context.AfterFunc(ctx, other.close)
		webhooks = append(webhooks, fmt.Sprintf("{name: filtered, url: %s, workers: 4, filter: '%s'}", other.serve(), filteredSink))
	}
	dw, err := startDynwatch(ctx, b.dwBin, b.cluster, o, sinkSet{webhooks: webhooks})
	if err != nil {
		return nil, measured{}, err
	}
	if o.chart {
		err = waitSteady(ctx, syncWait, func() float64 { return counter(ctx, dw.metrics, "dynwatch_state_commits_total") })
		if err != nil {
			err = fmt.Errorf("state store commits: %w", err)
		}
	} else if err = waitFor(ctx, syncWait, func() bool { return recv.count() >= o.objects }); err != nil {
		err = fmt.Errorf("initial-list deliveries: %d of %d: %w\n%s", recv.count(), o.objects, err, dw.rp.Log())
	}
	var m measured
	if err == nil {
		m, err = measureSynced(ctx, "dynwatch", &dw.proc, dw.metrics)
	}
	if err != nil {
		dw.stop()
		return nil, measured{}, err
	}
	return dw, m, nil
}

type dwProc struct {
	proc
	rp      *runner.Process
	metrics string
}

// startDynwatch starts dynwatch with the sinks (with -chart: none; see dynwatchConfig), and
// waits until it has synced, timing it from the start.
func startDynwatch(ctx context.Context, bin string, cluster *testbed.Cluster, o options, sinks sinkSet) (*dwProc, error) {
	cfg, err := writeConfig(cluster, o, sinks)
	if err != nil {
		return nil, err
	}
	return launch(ctx, runner.Options{Binary: bin, Config: cfg, Kubeconfig: cluster.Kubeconfig, Log: io.Discard, Env: o.env})
}

// launch starts dynwatch as ro says and waits until it has synced, timing it from the start;
// /readyz is polled exactly as for B0. Its proc's url is its API.
func launch(ctx context.Context, ro runner.Options) (*dwProc, error) {
	t0 := time.Now()
	p, err := runner.Start(ro)
	if err != nil {
		return nil, err
	}
	stop := func() { _ = p.Stop(10 * time.Second) }
	listenCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	api, metrics, err := p.WaitListening(listenCtx)
	if err == nil {
		err = waitFor(ctx, syncWait, func() bool { return status(metrics+"/readyz") == http.StatusOK })
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("dynwatch did not sync: %w\n%s", err, p.Log())
	}
	synced := time.Since(t0)
	return &dwProc{proc: proc{pid: p.PID(), url: api, synced: synced, peak: residentMemory(p.PID()).peak, stop: stop}, rp: p, metrics: metrics}, nil
}

// writeConfig writes dynwatch's configuration file for the run with the sinks, replacing the
// file in one rename (dynwatch reloads it when it changes), and returns its path.
func writeConfig(cluster *testbed.Cluster, o options, sinks sinkSet) (string, error) {
	path := filepath.Join(cluster.Dir, "bench-dynwatch.yaml")
	text := dynwatchConfig(o, sinks, statePath(cluster))
	if err := os.WriteFile(path+".new", []byte(text), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(path+".new", path)
}

// statePath is the state store of the dynwatch writeConfig configures.
func statePath(cluster *testbed.Cluster) string {
	return filepath.Join(cluster.Dir, "state", "bench-state.db")
}

// sinkSet is the sinks of dynwatch's configuration, by kind, each one a YAML flow mapping, and
// the leader election they deliver under, a flow mapping too ("" for none).
type sinkSet struct {
	webhooks, jetstream, kafka []string
	election                   string
}

// dynwatchConfig is dynwatch's configuration file for the run, with the sinks (with -chart:
// none). Both keep the state store in a directory of its own, as the chart does, and serve the
// API and metrics on loopback.
//
// The API authenticates and authorizes every request with the apiserver (api.auth.mode
// kubernetes: TokenReview and SubjectAccessReview, their answers cached for the default 10 s),
// as an install's does and as the query targets say; every request to it is made as
// reader. All the rows are measured so, not one on a listener of its own: dynwatch serves one
// API, a second process would add to what the memory rows measure, and the cached decisions
// cost a query some microseconds (httpapi's BenchmarkListPage/authorized). It serves no TLS,
// which dynwatch allows on loopback: the rows compare answering queries, not transports,
// though the apiserver, which serves only TLS, pays for encrypting its answers.
func dynwatchConfig(o options, sinks sinkSet, state string) string {
	if o.chart {
		return fmt.Sprintf(`# The chart's default config (charts/dynwatch/values.yaml), but with the API and metrics on
# loopback, the API without TLS, and pprof on.
resources:
  - group: ""
    version: v1
    resource: %s
    indexers:
      - {name: byApp, type: label, key: app.kubernetes.io/name}
api: {address: "127.0.0.1:0", auth: {mode: kubernetes}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0", pprof: true}
state: {path: %s}
`, o.resource, state)
	}
	return fmt.Sprintf(`
resources:
  - version: v1
    resource: %s
    namespaces: [%s]
    indexers:
      - {name: byApp, type: label, key: app}
      - {name: byTeam, type: annotation, key: example.com/team}
      - {name: byOwner, type: owner}
webhooks: [%s]
jetstream: [%s]
kafka: [%s]
api: {address: "127.0.0.1:0", auth: {mode: kubernetes}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0", pprof: true}
state: {path: %s}  # as the chart runs it: every event through the state store
%s`, o.resource, namespace, strings.Join(sinks.webhooks, ", "), strings.Join(sinks.jetstream, ", "), strings.Join(sinks.kafka, ", "), state, election(sinks.election))
}

// election is the leaderElection line of a configuration, or nothing.
func election(mapping string) string {
	if mapping == "" {
		return ""
	}
	return "leaderElection: " + mapping + "\n"
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
				t0 := time.Now()
				rv, err := update(ctx, cs, o.resource, objectName(o.resource, (i*7919)%o.objects), i)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				} else if err == nil {
					out = append(out, write{rv: rv, started: t0})
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

// receiver notes when each resourceVersion reached dynwatch's consumer: the webhook receiver
// it serves, or a watch of dynwatch's API.
type receiver struct {
	srv   *http.Server
	mu    sync.Mutex
	seen  map[string]int64
	n     int
	added int // requests whose ce-id names an ADDED
}

func newReceiver() *receiver { return &receiver{seen: map[string]int64{}} }

func (r *receiver) note(rv string, added bool) {
	now := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if added {
		r.added++
	}
	if rv != "" {
		r.seen[rv] = now
	}
}

// serve starts the webhook receiver and returns its URL. It reads and discards each request,
// noting the resourceVersion in its ce-id (uid.rv.type).
func (r *receiver) serve() string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		var rv string
		added := false
		if parts := strings.Split(req.Header.Get("ce-id"), "."); len(parts) == 3 {
			rv, added = parts[1], parts[2] == "added"
		}
		r.note(rv, added)
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/events"
}

// close stops the receiver, if it was served.
func (r *receiver) close() {
	if r.srv != nil {
		_ = r.srv.Close()
	}
}

// watch watches the collection at url from its current resourceVersion until ctx ends, noting
// each event's resourceVersion; its requests carry the bearer token.
func (r *receiver) watch(ctx context.Context, url, token string) error {
	var list struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	if err := getJSON(ctx, url+"?limit=1", token, &list); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"?watch=1&resourceVersion="+list.Metadata.ResourceVersion, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var e struct {
			Object struct {
				Metadata struct{ ResourceVersion string } `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch %s: %w", url, err)
		}
		r.note(e.Object.Metadata.ResourceVersion, false)
	}
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// addedCount counts the requests received that carried an ADDED.
func (r *receiver) addedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.added
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
	var m map[string]int64
	return m, getJSON(ctx, url+"/events", "", &m)
}

// getJSON decodes what url answers into v, asking with the bearer token unless it is "".
func getJSON(ctx context.Context, url, token string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
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

// lateBySecond counts the writes whose arrival came later than late after they started, by the
// second of the storm they started in: where a tail came from.
func lateBySecond(ws []write, arrivals map[string]int64, late time.Duration) map[int]int {
	out := map[int]int{}
	var first time.Time
	for _, w := range ws {
		if first.IsZero() || w.started.Before(first) {
			first = w.started
		}
	}
	for _, w := range ws {
		if time.Duration(arrivals[w.rv]-w.started.UnixNano()) > late {
			out[int(w.started.Sub(first).Seconds())]++
		}
	}
	return out
}

// pct is the p-th percentile of sorted durations, in milliseconds.
func pct(d []time.Duration, p int) float64 {
	return float64(percentile(d, p).Microseconds()) / 1000
}

// percentile is the p-th percentile of sorted durations; 0 of none.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, len(d)*p/100)]
}

// startProfile starts writing a CPU profile of the process over the next seconds to path, and
// returns a channel that receives the result once it is written; with path "", nil at once.
func startProfile(ctx context.Context, base string, seconds int, path string) <-chan error {
	return startSaving(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, seconds), path)
}

// startAllocProfile is startProfile for what the process allocates over the next seconds.
func startAllocProfile(ctx context.Context, base string, seconds int, path string) <-chan error {
	return startSaving(ctx, fmt.Sprintf("%s/debug/pprof/allocs?seconds=%d", base, seconds), path)
}

// startTrace is startProfile for an execution trace of the process over the next seconds.
func startTrace(ctx context.Context, base string, seconds int, path string) <-chan error {
	return startSaving(ctx, fmt.Sprintf("%s/debug/pprof/trace?seconds=%d", base, seconds), path)
}

// startSaving starts writing what url answers to path, and returns a channel that receives
// the result once it is written; with path "", nil at once.
func startSaving(ctx context.Context, url, path string) <-chan error {
	done := make(chan error, 1)
	if path == "" {
		done <- nil
		return done
	}
	go func() { done <- saveURL(ctx, url, path) }()
	return done
}

// saveURL writes what url answers to path.
func saveURL(ctx context.Context, url, path string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}

// resident is a process's resident memory as its memory limit sees it, file-backed mappings
// included: now (VmRSS, anonymous and file-backed) and the peak since it started (VmHWM), in
// bytes.
type resident struct{ now, anon, file, peak uint64 }

func residentMemory(pid int) resident {
	r := runner.ResidentMemory(pid)
	return resident{now: r.Now, anon: r.Anon, file: r.File, peak: r.Peak}
}

// firstEvents are, sorted, the times from a watch request to its first event and to its
// last initial event.
type firstEvents struct{ first, all []time.Duration }

// timeFirstEvents opens n watches from resourceVersion 0 one after the other, each read until
// it has sent objects initial events.
func timeFirstEvents(ctx context.Context, c *http.Client, url, token string, objects, n int) (firstEvents, error) {
	var out firstEvents
	for range n {
		ctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			return out, err
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		seen := 0
		for seen < objects && sc.Scan() {
			if seen++; seen == 1 {
				out.first = append(out.first, time.Since(t0))
			}
		}
		out.all = append(out.all, time.Since(t0))
		cancel()
		resp.Body.Close()
		if seen < objects {
			return out, fmt.Errorf("watch %s: %d of %d initial events: %w", url, seen, objects, sc.Err())
		}
	}
	slices.Sort(out.first)
	slices.Sort(out.all)
	return out, nil
}

// counter reads an unlabelled counter from a process's /metrics, 0 if it cannot.
func counter(ctx context.Context, base, name string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// cpuSeconds is the user+system CPU time the process has used; 0 when it cannot be read.
func cpuSeconds(pid int) float64 {
	d, err := testbed.CPUTime(pid)
	if err != nil {
		return 0
	}
	return d.Seconds()
}

// target is a server to time requests to.
type target struct {
	c          *http.Client
	url, token string
}

// timeRequests makes n requests to a, then n to b, and returns each one's latencies, sorted.
// Not alternated: the apiserver's work after a LIST (its garbage collection above all) would
// fall on dynwatch's next request.
func timeRequests(ctx context.Context, n int, a, b target) ([]time.Duration, []time.Duration, error) {
	var out [2][]time.Duration
	for i, t := range []target{a, b} {
		out[i] = make([]time.Duration, 0, n)
		// The bench's own collector is not the measured server's cost: collected now, this
		// process (which holds the run's records) is unlikely to collect amid the requests.
		runtime.GC()
		for range n {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
			req.Header.Set("Accept", "application/json")
			if t.token != "" {
				req.Header.Set("Authorization", "Bearer "+t.token)
			}
			t0 := time.Now()
			resp, err := t.c.Do(req)
			if err != nil {
				return nil, nil, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return nil, nil, fmt.Errorf("GET %s: %s", t.url, resp.Status)
			}
			out[i] = append(out[i], time.Since(t0))
		}
		slices.Sort(out[i])
	}
	return out[0], out[1], nil
}

func status(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitFor polls cond every 10 ms until it holds or timeout has passed.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	return waitEvery(ctx, timeout, 10*time.Millisecond, cond)
}

// waitEvery polls cond every interval until it holds or timeout has passed.
func waitEvery(ctx context.Context, timeout, interval time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// waitSteady waits until value, polled every second, is above zero and has not changed for 3 s.
func waitSteady(ctx context.Context, timeout time.Duration, value func() float64) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last, since := value(), time.Now()
	for last == 0 || time.Since(since) < 3*time.Second {
		select {
		case <-ctx.Done():
			return fmt.Errorf("still changing after %s: %w", timeout, ctx.Err())
		case <-time.After(time.Second):
		}
		if v := value(); v != last {
			last, since = v, time.Now()
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

// title is the default run's first line.
func title(o options, objBytes int, took time.Duration) string {
	config := "3 indexers, one webhook"
	if o.filtered {
		config = "3 indexers, one webhook and a second with the filter " + filteredSink
	}
	if o.chart {
		config = "the chart's default config: cluster-wide, 1 indexer, no webhook"
	}
	return fmt.Sprintf("dynwatch benchmark: %d %s of %d bytes, %d updates at %d/s, %d requests per query; dynwatch with %s, its API authorizing every request (TokenReview, SubjectAccessReview) without TLS; queries and watches made as %s, a reader of the namespace, to both; apiserver serving %s; %s; took %s",
		o.objects, o.resource, objBytes, o.updates, o.rate, o.queries, config, reader, served(o), machine(), took.Round(time.Second))
}

// printTable prints the title and the rows, the measured value and its baseline in the columns
// named by cols. A row with no baseline (no against) shows neither it nor a ratio.
func printTable(title string, cols [2]string, rows []result) {
	fmt.Printf("%s\n\n", title)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tunit\t%s\t%s\tbaseline is\tratio\ttarget\tmet\n", cols[0], cols[1])
	for _, r := range rows {
		met := "yes"
		if !r.Met {
			met = "NO"
		}
		if r.Target == "" {
			met = ""
		}
		base, ratio := fmt.Sprintf("%.3f", r.Baseline), fmt.Sprintf("%.2fx", r.Ratio)
		if r.Against == "" {
			base, ratio = "", ""
		}
		fmt.Fprintf(w, "%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Unit, r.Dynwatch, base, r.Against, ratio, r.Target, met)
	}
	_ = w.Flush()
}

// fdatasyncLatencies appends 4 KiB n times to a file in dir, each followed by fdatasync, as
// the state store commits, and returns the fdatasyncs' durations, sorted: the floor of a
// delivery that waits for its commit to be durable, on this volume.
func fdatasyncLatencies(dir string, n int) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fdatasync-*")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(f.Name()) }() // a scratch file
	buf := make([]byte, 4096)
	out := make([]time.Duration, 0, n)
	for range n {
		if _, err := f.Write(buf); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	slices.Sort(out)
	return out, nil
}
