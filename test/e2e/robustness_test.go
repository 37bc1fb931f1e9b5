package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math/rand/v2"
	"net"
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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
	"github.com/dynwatch/dynwatch/test/validate"
)

// The robustness harness. Each run takes a seed, which chooses one fault of the catalogue, when
// it strikes, and the writes around it (creates, updates, deletes and relabels of configmaps,
// and of widgets, a custom resource); the webhook also answers the first attempt at four changes
// in ten with a fault of its own, as the seed says. The run records the apiserver's own watch of
// each resource (the reference histories), watches through dynwatch's query API (of every
// configmap, of those a label selector selects, which the writes move objects into and out of,
// and of every widget) as a client that never gives up would hold them (resumed from the last
// resourceVersion it saw when dynwatch goes away, listed again when that is refused as expired;
// each watch a stream of its own), and what the webhook, a JetStream stream and a Kafka topic
// received. Every stream must keep every promise package validate checks, and every sink every
// change, in order per object, each under one id. A failed run writes its record of each
// resource and its seed to files it names.
//
// The runs: DYNWATCH_ROBUSTNESS_SEEDS (a comma-separated list) replays those seeds;
// DYNWATCH_ROBUSTNESS_RUNS=N runs N seeds from a random start (make robustness); neither runs
// the fixed set fixedRuns (make test).
func TestRobustness(t *testing.T) {
	for _, run := range robustnessRuns(t) {
		t.Run(fmt.Sprintf("seed %d: %s", run.seed, run.fault.name), func(t *testing.T) {
			t.Parallel()
			runScenario(t, run.seed, run.fault)
		})
	}
}

// robustnessRun is one run: its seed and its fault.
type robustnessRun struct {
	seed  uint64
	fault fault
}

// fixedRuns are the runs make test makes: the runs that failed once, each a regression test
// now, and one for each of four faults that reach other parts: a kill, a kill mid-fdatasync,
// a watch gap with a compaction, and a network cut.
var fixedRuns = []struct {
	seed  uint64
	fault string
}{
	{1, "kill dynwatch"},
	{2, "kill dynwatch mid-fdatasync"},
	{3, "a watch gap: dynwatch paused while the apiserver restarts and etcd compacts"},
	{4, "cut the network to the apiserver for 5s"},
	{26, "kill the leader of two replicas: the other takes over"},
}

// robustnessRuns are the runs to make: a seed's fault is catalogue[seed%len(catalogue)], save
// in fixedRuns, which name theirs.
func robustnessRuns(t *testing.T) []robustnessRun {
	var seeds []uint64
	switch seedList, runs := os.Getenv("DYNWATCH_ROBUSTNESS_SEEDS"), os.Getenv("DYNWATCH_ROBUSTNESS_RUNS"); {
	case seedList != "":
		for f := range strings.SplitSeq(seedList, ",") {
			seed, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("DYNWATCH_ROBUSTNESS_SEEDS: %q is not a seed", f)
			}
			seeds = append(seeds, seed)
		}
	case runs != "":
		n, err := strconv.Atoi(runs)
		if err != nil || n < 1 {
			t.Fatalf("DYNWATCH_ROBUSTNESS_RUNS: %q is not a number of runs", runs)
		}
		first := rand.Uint64() >> 16 // short enough to type
		t.Logf("seeds %d to %d", first, first+uint64(n)-1)
		for i := range n {
			seeds = append(seeds, first+uint64(i))
		}
	default:
		var out []robustnessRun
		for _, r := range fixedRuns {
			i := slices.IndexFunc(catalogue, func(f fault) bool { return f.name == r.fault })
			if i < 0 {
				t.Fatalf("fixedRuns: no fault %q in the catalogue", r.fault)
			}
			out = append(out, robustnessRun{r.seed, catalogue[i]})
		}
		return out
	}
	out := make([]robustnessRun, len(seeds))
	for i, seed := range seeds {
		out[i] = robustnessRun{seed, catalogue[seed%uint64(len(catalogue))]}
	}
	return out
}

// fault is one entry of the catalogue: inject strikes in a running scenario and returns once the
// scenario's dynwatch runs again.
type fault struct {
	name   string
	needs  needs
	inject func(t *testing.T, s *scenario)
}

// needs is what a fault needs of its scenario beside dynwatch and its test bed.
type needs int

const (
	needsNothing needs = iota
	needsDisk          // the state store on a FaultFS
	needsProxy         // dynwatch reaching the apiserver through a Proxy
	needsPeer          // a second replica, the two electing a leader, which delivers
)

// catalogue is every fault a run may inject; a seed takes catalogue[seed%len].
var catalogue = []fault{
	{"kill dynwatch", needsNothing, func(t *testing.T, s *scenario) {
		s.kill(t)
	}},
	{"pause dynwatch for 5s", needsNothing, func(t *testing.T, s *scenario) {
		s.signal(t, syscall.SIGSTOP)
		time.Sleep(5 * time.Second) // the fault's length
		s.signal(t, syscall.SIGCONT)
	}},
	{"restart dynwatch gracefully", needsNothing, func(t *testing.T, s *scenario) {
		p := s.take()
		if err := p.Stop(stopTimeout); err != nil {
			t.Error(err)
		}
		s.start(t)
	}},
	{"kill dynwatch before a commit", needsNothing, func(t *testing.T, s *scenario) {
		s.killIn(t, "beforeCommit")
	}},
	{"kill dynwatch after a commit, before its events reach the sinks", needsNothing, func(t *testing.T, s *scenario) {
		s.killIn(t, "afterCommit")
	}},
	{"kill dynwatch mid-fdatasync", needsDisk, func(t *testing.T, s *scenario) {
		s.disk.HoldSyncs()
		before := s.disk.Syncs()
		testbed.Eventually(t, 30*time.Second, func() error {
			if s.disk.Syncs() == before {
				return errors.New("no fdatasync has begun since they are held")
			}
			return nil
		})
		p := s.take()
		if err := p.Kill(); err != nil {
			t.Error(err)
		}
		s.disk.ReleaseSyncs()
		s.start(t)
	}},
	{"kill dynwatch mid-snapshot", needsNothing, func(t *testing.T, s *scenario) {
		// The failpoint beforeSnapshotRename holds the next snapshot once written, before it
		// takes the segments' place; configmaps of 200 kB grow the log past what starts one.
		s.hold(t, "beforeSnapshotRename")
		cms := kubernetes.NewForConfigOrDie(s.cluster.Config).CoreV1().ConfigMaps(s.ns)
		for i := range 30 {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bulk-%02d", i)}, Data: map[string]string{"v": strings.Repeat("x", 200<<10)}}
			if _, err := cms.Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testbed.Eventually(t, time.Minute, func() error {
			if snapshots, _ := filepath.Glob(filepath.Join(s.state, "snap-*.wal.tmp")); len(snapshots) == 0 {
				return errors.New("no snapshot is being written")
			}
			return nil
		})
		s.kill(t)
	}},
	{"kill dynwatch mid-append: a torn commit at the log's tail", needsNothing, func(t *testing.T, s *scenario) {
		if err := s.take().Kill(); err != nil {
			t.Error(err)
		}
		tearTail(t, s.state, s.seed)
		s.start(t)
		if log := s.proc().Log(); !strings.Contains(log, "a commit cut short by a crash was dropped") {
			t.Errorf("dynwatch did not report the torn commit it started on:\n%s", log)
		}
	}},
	{"pause the leader of two replicas past its lease", needsPeer, func(t *testing.T, s *scenario) {
		leader, _ := s.leader(t)
		if err := leader.Signal(syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
		time.Sleep(2 * haLease) // the other takes over meanwhile
		if err := leader.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
		t.Logf("the leader now: %s", s.leaderName(t))
	}},
	{"kill the leader of two replicas: the other takes over", needsPeer, func(t *testing.T, s *scenario) {
		_, first := s.leader(t)
		s.mu.Lock()
		leader := &s.peer
		if first {
			leader = &s.p
		}
		p := *leader
		*leader = nil
		s.mu.Unlock()
		if err := p.Kill(); err != nil {
			t.Error(err)
		}
		t.Logf("the leader now: %s", s.leaderName(t)) // the other, once its lease has run out
		if first {
			s.start(t)
		} else {
			s.startPeer(t)
		}
	}},
	{"delete the CRD of a watched resource and create it again", needsNothing, func(t *testing.T, s *scenario) {
		s.widgetsOff.Store(true)
		defer s.widgetsOff.Store(false)
		crds := dynamic.NewForConfigOrDie(s.cluster.Config).Resource(crdResource)
		name := widgetsGVR.Resource + "." + widgetGroup
		if err := crds.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// The apiserver deletes every widget first: each a DELETED to every watcher.
		testbed.Eventually(t, time.Minute, func() error {
			if _, err := crds.Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("the CRD is not gone yet (%w)", err)
			}
			return nil
		})
		s.installWidgets(t)
	}},
	{"a full disk for 3s", needsDisk, func(t *testing.T, s *scenario) {
		s.disk.Fill(true)
		time.Sleep(3 * time.Second)
		s.disk.Fill(false)
	}},
	{"fdatasync stalled for 5s", needsDisk, func(t *testing.T, s *scenario) {
		s.disk.HoldSyncs()
		time.Sleep(5 * time.Second)
		s.disk.ReleaseSyncs()
	}},
	{"restart the apiserver", needsNothing, func(t *testing.T, s *scenario) {
		if err := s.cluster.RestartAPIServer(t.Context()); err != nil {
			t.Error(err)
		}
	}},
	{"a watch gap: dynwatch paused while the apiserver restarts and etcd compacts", needsNothing, func(t *testing.T, s *scenario) {
		s.signal(t, syscall.SIGSTOP)
		// Each resource's watches through dynwatch had come no further: it had seen no change
		// of it after.
		from := map[string]uint64{configmapsSource: s.reference.known(), widgetsSource: s.widgets.known()}
		for _, f := range s.followers {
			from[f.source] = min(from[f.source], f.known())
		}
		if err := s.cluster.RestartAPIServer(t.Context()); err != nil {
			t.Error(err)
		}
		s.reference.caughtUp(t)
		s.widgets.caughtUp(t)
		if err := s.cluster.CompactEtcd(t.Context()); err != nil {
			t.Error(err)
		}
		s.signal(t, syscall.SIGCONT)
		// dynwatch lists each resource again before it delivers a change of it made after its
		// pause; once the webhook has one of each, the gap is over.
		markers := []string{s.reference.caughtUp(t), s.widgets.caughtUp(t)}
		testbed.Eventually(t, time.Minute, func() error {
			for _, marker := range markers {
				if !slices.ContainsFunc(s.sinks.webhook.got(), func(r received) bool { return r.name() == marker }) {
					return fmt.Errorf("the webhook has not received %s", marker)
				}
			}
			return nil
		})
		to := max(s.reference.known(), s.widgets.known())
		for source, from := range from {
			s.gaps[source] = append(s.gaps[source], validate.Gap{From: from, To: to})
		}
	}},
	{"cut the network to the apiserver for 5s", needsProxy, func(t *testing.T, s *scenario) {
		s.proxy.Cut()
		time.Sleep(5 * time.Second)
		s.proxy.Restore()
	}},
	{"reload the configuration, replacing the webhook", needsNothing, func(t *testing.T, s *scenario) {
		_, metrics := s.urls(t)
		reloads := `dynwatch_config_reloads_total{result="success"}`
		before := metricValue(t, metrics, reloads)
		s.writeConfig(t, "2s")
		testbed.Eventually(t, 30*time.Second, func() error {
			if metricValue(t, metrics, reloads) == before {
				return errors.New("the configuration has not been reloaded")
			}
			return nil
		})
	}},
	{"the webhook answers 503 for 3s", needsNothing, func(t *testing.T, s *scenario) {
		s.outage(outage503, 3*time.Second)
	}},
	{"the webhook answers 429 for 3s", needsNothing, func(t *testing.T, s *scenario) {
		s.outage(outage429, 3*time.Second)
	}},
	{"the webhook hangs past the sink's timeout for 3s", needsNothing, func(t *testing.T, s *scenario) {
		s.outage(outageHang, 3*time.Second)
	}},
}

// The webhook's outages: every request answered so while one lasts.
const (
	outageNone int32 = iota
	outage503
	outage429
	outageHang
)

// scenario is one run: a test bed of its own, dynwatch delivering one namespace's configmaps and
// widgets to three sinks, and the fault.
type scenario struct {
	seed       uint64
	cluster    *testbed.Cluster
	ns         string
	config     string // dynwatch's configuration file
	peerConfig string // the second replica's, with needsPeer
	kubeconfig string // dynwatch's: the test bed's, or through the proxy
	gofail     string // the failpoints' HTTP endpoint
	state      string // the state store's directory
	disk       *testbed.FaultFS
	proxy      *testbed.Proxy
	sinks      sinks
	down       atomic.Int32              // the webhook's outage
	reference  *follower                 // the apiserver's watch of the configmaps
	widgets    *follower                 // of the widgets
	gaps       map[string][]validate.Gap // where dynwatch listed each resource again (by ce-source), written by the fault
	followers  []*follower               // the watches through dynwatch, of both
	widgetsOff atomic.Bool               // the widgets' writes wait while it is set

	mu   sync.Mutex
	p    *runner.Process // nil while dynwatch is restarted
	peer *runner.Process // the second replica; nil while it is restarted
}

// The scenario's writes: one every churnEvery for churnFor over churnObjects configmaps (see
// the history test), and the fault within the first two thirds of them.
func runScenario(t *testing.T, seed uint64, f fault) {
	t.Logf("seed %d, fault %q (DYNWATCH_ROBUSTNESS_SEEDS=%[1]d replays it)", seed, f.name)
	r := rand.New(rand.NewPCG(seed, seed>>1))
	s := &scenario{seed: seed, cluster: ownCluster(t, testbed.Options{NoWatchCache: true}), ns: "robust", state: t.TempDir(), gaps: map[string][]validate.Gap{}}
	s.kubeconfig = s.cluster.Kubeconfig
	s.gofail = freeLoopback(t)
	switch f.needs {
	case needsDisk:
		s.disk = mountFaultFS(t)
		s.state = s.disk.Dir
	case needsProxy:
		s.proxied(t)
	case needsPeer:
		s.peerConfig = filepath.Join(t.TempDir(), "peer.yaml")
	}
	cs := kubernetes.NewForConfigOrDie(s.cluster.Config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.installWidgets(t)
	s.sinks = recordedSinks(t, s.cluster.Config, newJudge(t, func(rc received, n int, h http.Header) int {
		switch s.down.Load() {
		case outage503:
			return http.StatusServiceUnavailable
		case outage429:
			h.Set("Retry-After", "1")
			return http.StatusTooManyRequests
		case outageHang:
			time.Sleep(1500 * time.Millisecond)
			return http.StatusGatewayTimeout
		}
		return seededAnswer(seed, rc, n, h)
	}))
	if s.peerConfig != "" {
		// The replicas' checkpoint ConfigMap, beside the configmaps they watch, is theirs: the
		// query API serves it, no sink is handed it.
		s.sinks.selects = validate.Selector{Except: []string{s.ns + "/dynwatch-checkpoints"}}
	}
	// The references watch before dynwatch starts: they have every change it may see, its
	// leader election's checkpoint ConfigMap's creation too.
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	admin := dynamic.NewForConfigOrDie(s.cluster.Config)
	upstream := func(gvr schema.GroupVersionResource) func() (dynamic.ResourceInterface, error) {
		return func() (dynamic.ResourceInterface, error) { return admin.Resource(gvr).Namespace(s.ns), nil }
	}
	s.reference = follow("the apiserver's configmaps", upstream(configmaps), metav1.ListOptions{}, validate.Selector{})
	s.reference.source, s.reference.apiVersion, s.reference.kind = configmapsSource, "v1", "ConfigMap"
	s.widgets = follow("the apiserver's widgets", upstream(widgetsGVR), metav1.ListOptions{}, validate.Selector{})
	s.widgets.source, s.widgets.apiVersion, s.widgets.kind = widgetsSource, widgetGroup+"/v1", "Widget"
	defer s.reference.end()
	defer s.widgets.end()
	s.reference.watching(t)
	s.widgets.watching(t)

	s.config = filepath.Join(t.TempDir(), "config.yaml")
	s.writeConfig(t, "1s")
	s.start(t)
	if s.peerConfig != "" {
		s.startPeer(t)
		t.Logf("the leader: %s", s.leaderName(t))
	}
	through := func(gvr schema.GroupVersionResource) func() (dynamic.ResourceInterface, error) {
		return func() (dynamic.ResourceInterface, error) {
			p := s.proc()
			if p == nil {
				return nil, errors.New("dynwatch is restarting")
			}
			api, _, err := p.WaitListening(t.Context())
			if err != nil {
				return nil, err
			}
			return dynamic.NewForConfigOrDie(&rest.Config{Host: api}).Resource(gvr).Namespace(s.ns), nil
		}
	}
	s.followers = []*follower{
		follow("every configmap", through(configmaps), metav1.ListOptions{}, validate.Selector{}),
		follow("configmaps of team=a", through(configmaps), metav1.ListOptions{LabelSelector: "team=a"}, validate.Selector{Labels: "team=a"}),
		follow("every widget", through(widgetsGVR), metav1.ListOptions{}, validate.Selector{}),
	}
	s.followers[0].source, s.followers[1].source, s.followers[2].source = configmapsSource, configmapsSource, widgetsSource
	tracks := []struct {
		recorded
		reference *follower
		followers []*follower
	}{
		{recorded{source: configmapsSource}, s.reference, s.followers[:2]},
		{recorded{source: widgetsSource}, s.widgets, s.followers[2:]},
	}
	defer func() {
		for _, fl := range s.followers {
			fl.end()
		}
	}()
	for _, fl := range s.followers {
		fl.watching(t)
	}

	churned := make(chan struct{})
	churnSeed := r.Uint64()
	go func() {
		defer close(churned)
		var wg sync.WaitGroup
		wg.Go(func() { churnThroughFaults(t, cs.CoreV1().ConfigMaps(s.ns), churnSeed) })
		wg.Go(func() { s.churnWidgets(t, churnSeed) })
		wg.Wait()
	}()
	time.Sleep(3*time.Second + time.Duration(r.Int64N(int64(6*time.Second)))) // when the fault strikes
	t.Logf("%s", f.name)
	f.inject(t, s)
	<-churned
	if t.Failed() {
		return
	}

	var recs []validate.Record
	for i := range tracks {
		tr := &tracks[i]
		tr.reference.caughtUp(t)
		tr.reference.end()
		refStreams, relists := tr.reference.result()
		if relists != 1 {
			t.Fatalf("the reference history has a gap: %s listed %d times", tr.reference.name, relists)
		}
		for _, st := range refStreams {
			for _, e := range st.Events {
				if e.Type != validate.Bookmark {
					tr.history = append(tr.history, e)
				}
			}
		}
		tr.gaps, tr.attribution = s.gaps[tr.source], tr.reference.attr.attribution()
		rec := validate.Record{Seed: seed, Fault: f.name, History: tr.history}
		for _, fl := range tr.followers {
			fl.waitFor(t, tr.history)
			fl.end()
			streams, _ := fl.result()
			for _, st := range streams {
				// With two replicas, the leader writes its checkpoint ConfigMap on after the
				// reference has ended: what came after its last change is not known to be right.
				rec.Streams = append(rec.Streams, upTo(st, tr.history[len(tr.history)-1].Revision))
			}
			t.Logf("%s: %d streams", fl.name, len(streams))
		}
		recs = append(recs, rec)
	}
	// Every object's last state arrives, or the validators say which did not.
	held := s.sinks.converged(t, 2*time.Minute, []recorded{tracks[0].recorded, tracks[1].recorded})
	for i, rec := range recs {
		rec.Sinks = held[i]
		for _, v := range rec.Violations() {
			t.Errorf("%s: %s", tracks[i].source, v)
		}
		for _, sink := range rec.Sinks {
			t.Logf("%s: %s: %d deliveries of %d changes", tracks[i].source, sink.Name, len(sink.Deliveries), len(rec.History))
		}
		if t.Failed() {
			writeRecord(t, rec, fmt.Sprintf("dynwatch-robustness-%d-%s.json", seed, filepath.Base(tracks[i].source)))
		}
	}
}

// upTo is s without what it received after revision to.
func upTo(s validate.Stream, to uint64) validate.Stream {
	s.Events = slices.DeleteFunc(slices.Clone(s.Events), func(e validate.Event) bool { return e.Revision > to })
	return s
}

// The custom resource every run watches beside the configmaps.
const (
	widgetGroup   = "robust.dynwatch.test"
	widgetsSource = "/apis/" + widgetGroup + "/v1/widgets"
	widgetObjects = 6
	widgetsEvery  = 100 * time.Millisecond
)

var widgetsGVR = schema.GroupVersionResource{Group: widgetGroup, Version: "v1", Resource: "widgets"}

// installWidgets installs the widgets' CRD, and waits until they are served.
func (s *scenario) installWidgets(t *testing.T) {
	t.Helper()
	installCRDIn(t, s.cluster.Config, widgetGroup, "Widget")
	widgets := dynamic.NewForConfigOrDie(s.cluster.Config).Resource(widgetsGVR).Namespace(s.ns)
	testbed.Eventually(t, time.Minute, func() error {
		_, err := widgets.List(t.Context(), metav1.ListOptions{})
		return err
	})
}

// churnWidgets creates, updates and deletes widgetObjects widgets at random, as the seed says,
// one write every widgetsEvery for churnFor, but while widgetsOff is set.
func (s *scenario) churnWidgets(t *testing.T, seed uint64) {
	widgets := dynamic.NewForConfigOrDie(s.cluster.Config).Resource(widgetsGVR).Namespace(s.ns)
	r := rand.New(rand.NewPCG(seed, seed>>2))
	exists := map[string]bool{}
	for end := time.Now().Add(churnFor); time.Now().Before(end); time.Sleep(widgetsEvery) {
		if s.widgetsOff.Load() {
			clear(exists) // the CRD's deletion deleted them
			continue
		}
		name := fmt.Sprintf("w-%d", r.IntN(widgetObjects))
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": widgetGroup + "/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"v": int64(r.IntN(1 << 20))}}}
		var err error
		switch {
		case !exists[name]:
			_, err = widgets.Create(t.Context(), w, metav1.CreateOptions{})
			exists[name] = err == nil || apierrors.IsAlreadyExists(err)
		case r.IntN(10) < 7:
			var got *unstructured.Unstructured
			if got, err = widgets.Get(t.Context(), name, metav1.GetOptions{}); err == nil {
				w.SetResourceVersion(got.GetResourceVersion())
				_, err = widgets.Update(t.Context(), w, metav1.UpdateOptions{})
			}
			exists[name] = !apierrors.IsNotFound(err)
		default:
			err = widgets.Delete(t.Context(), name, metav1.DeleteOptions{})
			exists[name] = err != nil && !apierrors.IsNotFound(err)
		}
	}
}

// writeRecord writes a failed run's record to a file of name in $TMPDIR, and logs the
// command that validates it again.
func writeRecord(t *testing.T, rec validate.Record, name string) {
	path := filepath.Join(os.TempDir(), name)
	if err := rec.Write(path); err != nil {
		t.Errorf("record: %v", err)
		return
	}
	t.Logf("the run's record: %s (go run ./test/validate/cmd/validate %[1]s validates it again)", path)
}

// writeConfig writes dynwatch's configuration, with the webhook's timeout; with a second
// replica, its too, the two electing a leader.
func (s *scenario) writeConfig(t *testing.T, timeout string) {
	write := func(path, state, election string) {
		writeFile(t, path, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%[1]s]}, {group: %[5]s, version: v1, resource: widgets, namespaces: [%[1]s]}]
%[2]s
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 5000}
metrics: {address: "127.0.0.1:0"}
state: {path: %[3]s}
%[4]s`, s.ns, s.sinks.config(timeout), state, election, widgetGroup))
	}
	if s.peerConfig == "" {
		write(s.config, s.state, "")
		return
	}
	election := func(identity string) string {
		return fmt.Sprintf("leaderElection: {enabled: true, namespace: %s, identity: %s, leaseDuration: %s, renewDeadline: 3s, retryPeriod: 500ms, checkpointInterval: 1s}\n",
			s.ns, identity, haLease)
	}
	write(s.config, s.state, election("first"))
	write(s.peerConfig, filepath.Join(filepath.Dir(s.peerConfig), "state"), election("second"))
}

// startPeer starts the second replica and waits until it is ready.
func (s *scenario) startPeer(t *testing.T) {
	t.Helper()
	p := startReady(t, runner.Options{Binary: failpointBinary(t), Config: s.peerConfig, Kubeconfig: s.kubeconfig})
	s.mu.Lock()
	s.peer = p
	s.mu.Unlock()
}

// leader is the replica that leads, once one does, and whether it is the first (s.p).
func (s *scenario) leader(t *testing.T) (*runner.Process, bool) {
	t.Helper()
	var leader *runner.Process
	testbed.Eventually(t, 3*haLease, func() error {
		s.mu.Lock()
		ps := []*runner.Process{s.p, s.peer}
		s.mu.Unlock()
		for _, p := range ps {
			if p == nil {
				continue // restarting
			}
			if st, err := p.Status(t.Context()); err == nil {
				if le, ok := st.LeaderElection.(map[string]any); ok && le["leading"] == true {
					leader = p
					return nil
				}
			}
		}
		return errors.New("no replica leads")
	})
	return leader, leader == s.proc()
}

func (s *scenario) leaderName(t *testing.T) string {
	if _, first := s.leader(t); first {
		return "the first replica"
	}
	return "the second replica"
}

// start starts dynwatch and waits until it is ready.
func (s *scenario) start(t *testing.T) {
	t.Helper()
	p := startReady(t, runner.Options{Binary: failpointBinary(t), Config: s.config, Kubeconfig: s.kubeconfig, Env: []string{"GOFAIL_HTTP=" + s.gofail}})
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
}

func (s *scenario) proc() *runner.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// take is the running dynwatch, which the caller stops and starts again.
func (s *scenario) take() *runner.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.p
	s.p = nil
	return p
}

func (s *scenario) signal(t *testing.T, sig syscall.Signal) {
	if err := s.proc().Signal(sig); err != nil {
		t.Error(err)
	}
}

func (s *scenario) kill(t *testing.T) {
	if err := s.take().Kill(); err != nil {
		t.Error(err)
	}
	s.start(t)
}

func (s *scenario) urls(t *testing.T) (api, metrics string) {
	api, metrics, err := s.proc().WaitListening(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return api, metrics
}

// killIn makes every commit of the state store wait at the failpoint, waits until one does
// (the commits stop while the writes go on), and kills dynwatch there.
func (s *scenario) killIn(t *testing.T, failpoint string) {
	s.hold(t, failpoint)
	_, metrics := s.urls(t)
	last, since := -1.0, time.Now()
	testbed.Eventually(t, 30*time.Second, func() error {
		n := metricValue(t, metrics, "dynwatch_state_commits_total")
		if n != last {
			last, since = n, time.Now()
		}
		if time.Since(since) < time.Second {
			return fmt.Errorf("%v commits, the last within a second", n)
		}
		return nil
	})
	s.kill(t)
}

// tearTail appends to the newest segment of the state store's log in dir what a process killed
// while appending a commit leaves: a frame whose header checks, with some of its payload (the
// seed's bytes), not all.
func tearTail(t *testing.T, dir string, seed uint64) {
	t.Helper()
	var last string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "seg-") && strings.HasSuffix(d.Name(), ".wal") && d.Name() > filepath.Base(last) {
			last = path
		}
		return err
	})
	if err != nil || last == "" {
		t.Fatalf("no segment of the state store's log in %s (%v)", dir, err)
	}
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	payload := make([]byte, 4096)
	_, _ = rand.NewChaCha8(key).Read(payload)
	frame := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	frame = binary.LittleEndian.AppendUint32(frame, crc32.Checksum(frame, crc32.MakeTable(crc32.Castagnoli)))
	frame = binary.LittleEndian.AppendUint32(frame, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	frame = append(frame, payload[:len(payload)/3]...)
	f, err := os.OpenFile(last, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(frame); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// hold sets the failpoint of the running dynwatch to sleep a minute wherever it is reached.
func (s *scenario) hold(t *testing.T, failpoint string) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+s.gofail+"/"+failpoint, strings.NewReader("sleep(60000)"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("set failpoint %s: %s", failpoint, resp.Status)
	}
}

// outage makes the webhook answer as o says for d.
func (s *scenario) outage(o int32, d time.Duration) {
	s.down.Store(o)
	time.Sleep(d) // the fault's length
	s.down.Store(outageNone)
}

// proxied puts a Proxy between dynwatch and the apiserver.
func (s *scenario) proxied(t *testing.T) {
	cfg, err := clientcmd.LoadFromFile(s.cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(s.cluster.URL(), "https://")
	if s.proxy, err = testbed.NewProxy(target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.proxy.Close() })
	for _, c := range cfg.Clusters {
		c.Server = "https://" + s.proxy.Addr()
	}
	s.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, s.kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// freeLoopback is a loopback address no one listens on now.
func freeLoopback(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// seededAnswer is how the webhook answers a delivery when no outage lasts: the first attempt
// at one change in ten each is answered 503, 429 with Retry-After, slowly, or only after the
// sink has given up on it (its timeout is 1 s), as the seed chooses. Each of those must come
// again.
func seededAnswer(seed uint64, r received, n int, h http.Header) int {
	if n > 1 {
		return http.StatusOK
	}
	switch crc32.ChecksumIEEE(fmt.Appendf(nil, "%d/%s", seed, r.ceID)) % 10 {
	case 0:
		return http.StatusServiceUnavailable
	case 1:
		h.Set("Retry-After", "1")
		return http.StatusTooManyRequests
	case 2:
		time.Sleep(300 * time.Millisecond)
	case 3:
		time.Sleep(1500 * time.Millisecond)
		return http.StatusGatewayTimeout
	}
	return http.StatusOK
}

// churnThroughFaults writes as churnConfigMaps does, from seed, and goes on through the
// apiserver's faults: a write that fails is left out (the reference history has what was
// done), and what exists is learnt again from the next write's answer.
func churnThroughFaults(t *testing.T, cms typedcorev1.ConfigMapInterface, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed))
	exists := map[string]bool{}
	failed := 0
	for end := time.Now().Add(churnFor); time.Now().Before(end); time.Sleep(churnEvery) {
		name := fmt.Sprintf("cm-%02d", r.IntN(churnObjects))
		meta := metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": []string{"a", "b"}[r.IntN(2)]}}
		var err error
		deleting := false
		switch {
		case !exists[name]:
			_, err = cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": "0"}}, metav1.CreateOptions{})
		case r.IntN(10) < 7:
			_, err = cms.Update(t.Context(), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"v": strconv.Itoa(r.IntN(1 << 20))}}, metav1.UpdateOptions{})
		default:
			err, deleting = cms.Delete(t.Context(), name, metav1.DeleteOptions{}), true
		}
		switch {
		case err == nil:
			exists[name] = !deleting
		case apierrors.IsAlreadyExists(err):
			exists[name] = true
		case apierrors.IsNotFound(err):
			exists[name] = false
		case !apierrors.IsConflict(err):
			failed++
		}
	}
	t.Logf("churn: %d writes failed under the fault", failed)
}

// follower holds a watch through a server as a client that never gives up does: a list, then a
// watch from its resourceVersion; when the watch ends or cannot be opened (the server went
// away), a watch from the last resourceVersion it saw, through the server there is then; when
// that is refused as expired, a list again. Each watch is a stream of its own.
type follower struct {
	name string
	// source is the ce-source of the resource's deliveries; apiVersion and kind are its
	// objects' (caughtUp creates one).
	source, apiVersion, kind string
	res                      func() (dynamic.ResourceInterface, error)
	opts                     metav1.ListOptions
	sel                      validate.Selector
	stop                     chan struct{}
	done                     chan struct{}
	once                     sync.Once

	attr    *attributor // who made each version its watches received
	mu      sync.Mutex
	streams []validate.Stream // the watches that ended
	cur     *recording
	listed  uint64 // the last list's resourceVersion
	lists   int
}

// follow starts following what res selects with opts (sel saying what, as validate.Stream's
// Selects does).
func follow(name string, res func() (dynamic.ResourceInterface, error), opts metav1.ListOptions, sel validate.Selector) *follower {
	f := &follower{name: name, res: res, opts: opts, sel: sel, stop: make(chan struct{}), done: make(chan struct{}), attr: newAttributor()}
	go f.run()
	return f
}

func (f *follower) run() {
	defer close(f.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-f.stop
		cancel()
	}()
	rv := ""
	for n := 1; ; n++ {
		select {
		case <-f.stop:
			return
		default:
		}
		w, err := f.open(ctx, &rv)
		if err != nil {
			if expired(err) {
				rv = ""
			}
			select {
			case <-f.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		from, _ := strconv.ParseUint(rv, 10, 64)
		r := &recording{stream: validate.Stream{Name: fmt.Sprintf("%s, watch %d", f.name, n), From: from, Selects: f.sel}, w: w, done: make(chan struct{}), attr: f.attr}
		f.mu.Lock()
		f.cur = r
		f.mu.Unlock()
		go r.read()
		select {
		case <-r.done:
		case <-f.stop:
			r.stop()
		}
		st := r.snapshot()
		f.mu.Lock()
		f.cur, f.streams = nil, append(f.streams, st)
		f.mu.Unlock()
		if len(st.Events) > 0 {
			rv = strconv.FormatUint(st.Events[len(st.Events)-1].Revision, 10)
		}
		r.mu.Lock()
		err = r.err
		r.mu.Unlock()
		if expired(err) {
			rv = ""
		}
	}
}

// open lists first when rv is empty, setting it, and opens a watch from rv.
func (f *follower) open(ctx context.Context, rv *string) (watch.Interface, error) {
	res, err := f.res()
	if err != nil {
		return nil, err
	}
	if *rv == "" {
		list, err := res.List(ctx, f.opts)
		if err != nil {
			return nil, err
		}
		*rv = list.GetResourceVersion()
		at, _ := strconv.ParseUint(*rv, 10, 64)
		f.mu.Lock()
		f.listed, f.lists = at, f.lists+1
		f.mu.Unlock()
	}
	opts := f.opts
	opts.ResourceVersion, opts.AllowWatchBookmarks = *rv, true
	return res.Watch(ctx, opts)
}

// expired reports whether err is a 410: what a watch was opened from is too old.
func expired(err error) bool { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

// watching waits until the follower has listed and opened its first watch.
func (f *follower) watching(t *testing.T) {
	t.Helper()
	testbed.Eventually(t, time.Minute, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.cur == nil && len(f.streams) == 0 {
			return fmt.Errorf("%s has not opened its watch", f.name)
		}
		return nil
	})
}

// known is the latest resourceVersion the follower knows what it follows at.
func (f *follower) known() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.listed
	streams := f.streams
	if f.cur != nil {
		streams = append(slices.Clone(streams), f.cur.snapshot())
	}
	for _, s := range streams {
		if len(s.Events) > 0 {
			k = max(k, s.Events[len(s.Events)-1].Revision)
		}
	}
	return k
}

// waitFor waits until the follower knows the last change of history it selects.
func (f *follower) waitFor(t *testing.T, history validate.History) {
	t.Helper()
	seen := history.View(validate.Stream{Selects: f.sel})
	if len(seen) == 0 {
		return
	}
	last := seen[len(seen)-1].Revision
	testbed.Eventually(t, time.Minute, func() error {
		if k := f.known(); k < last {
			return fmt.Errorf("%s knows resourceVersion %d, the last change it selects is at %d", f.name, k, last)
		}
		return nil
	})
}

// caughtUp creates a marker object of the follower's resource and waits until the follower
// has its change: it then has every change made before. It returns the marker's name.
func (f *follower) caughtUp(t *testing.T) string {
	t.Helper()
	res, err := f.res()
	if err != nil {
		t.Fatal(err)
	}
	marker := &unstructured.Unstructured{Object: map[string]any{"apiVersion": f.apiVersion, "kind": f.kind,
		"metadata": map[string]any{"generateName": "marker-"}}}
	var made *unstructured.Unstructured
	testbed.Eventually(t, time.Minute, func() error {
		made, err = res.Create(t.Context(), marker, metav1.CreateOptions{})
		return err
	})
	rv, _ := strconv.ParseUint(made.GetResourceVersion(), 10, 64)
	testbed.Eventually(t, time.Minute, func() error {
		if k := f.known(); k < rv {
			return fmt.Errorf("%s knows resourceVersion %d, the marker is at %d", f.name, k, rv)
		}
		return nil
	})
	return made.GetName()
}

// end stops following and waits for the last watch's events.
func (f *follower) end() {
	f.once.Do(func() { close(f.stop) })
	<-f.done
}

// result is every watch the follower held, and how many times it listed.
func (f *follower) result() ([]validate.Stream, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.streams), f.lists
}
