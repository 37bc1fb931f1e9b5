package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/journal"
)

// Election is what a Dispatcher needs to elect the replica that delivers.
type Election struct {
	Config config.LeaderElection
	Client kubernetes.Interface
}

// fence lets a replica deliver only while the lease is certainly its own: until its last
// successful renewal's start plus the renew deadline. The others take the lease over no
// sooner than the lease duration after they saw that renewal, which was after it started; so
// a leader that is paused, partitioned or slow stops delivering at least LeaseDuration -
// RenewDeadline before another can start, provided the replicas' clocks run at about the
// same rate. Requests in flight when it lapses are cut.
type fence struct {
	mu      sync.Mutex
	until   time.Time // carries a monotonic reading; zero: not held
	renewed chan struct{}
}

func newFence() *fence { return &fence{renewed: make(chan struct{})} }

func (f *fence) grant(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.until = until
	close(f.renewed)
	f.renewed = make(chan struct{})
}

func (f *fence) revoke() {
	f.mu.Lock()
	f.until = time.Time{}
	f.mu.Unlock()
}

func (f *fence) held() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until, !f.until.IsZero() && time.Now().Before(f.until)
}

// bound returns a context that ends with ctx or when the fence lapses, and whether it holds
// now. A nil fence always holds.
func (f *fence) bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if f == nil {
		return ctx, func() {}, true
	}
	until, ok := f.held()
	if !ok {
		return ctx, func() {}, false
	}
	c, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var t *time.Timer
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if u, ok := f.held(); ok {
			t.Reset(time.Until(u)) // renewed meanwhile
			return
		}
		cancel()
	}
	mu.Lock()
	t = time.AfterFunc(time.Until(until), check)
	mu.Unlock()
	return c, func() { t.Stop(); cancel() }, true
}

// lapsed reports whether the fence exists and does not hold now.
func (f *fence) lapsed() bool {
	if f == nil {
		return false
	}
	_, held := f.held()
	return !held
}

// errFenceLapsed is what a fenced connection's Write returns once the fence has lapsed.
var errFenceLapsed = errors.New("the leader election fence has lapsed: not sending")

// dialer wraps dial so that its connections refuse to write once the fence has lapsed. It is
// the last check before a request's bytes reach the network: a worker paused between its own
// check and its write (before the fence's timer cuts its context) sends nothing on resuming.
func (f *fence) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return fencedConn{Conn: c, fence: f}, nil
	}
}

type fencedConn struct {
	net.Conn
	fence *fence
}

func (c fencedConn) Write(b []byte) (int, error) {
	if c.fence.lapsed() {
		return 0, errFenceLapsed
	}
	return c.Conn.Write(b)
}

// wait returns once the fence is granted again, or ctx ends.
func (f *fence) wait(ctx context.Context) {
	f.mu.Lock()
	ch := f.renewed
	f.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// fencedLock is the Lease lock, granting the fence on every write that makes this replica the
// holder and revoking it before any write that does not (the release at shutdown).
type fencedLock struct {
	resourcelock.Interface
	fence *fence
	hold  time.Duration
}

func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.Interface.Create(ctx, r) })
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.Interface.Update(ctx, r) })
}

func (l *fencedLock) write(r resourcelock.LeaderElectionRecord, do func() error) error {
	if r.HolderIdentity != l.Identity() {
		l.fence.revoke()
		return do()
	}
	start := time.Now()
	err := do()
	if err == nil {
		l.fence.grant(start.Add(l.hold))
	}
	return err
}

// LeaderStatus is the leader election's part of /status.
type LeaderStatus struct {
	Identity    string `json:"identity"`
	Leader      string `json:"leader"`
	Leading     bool   `json:"leading"`
	Transitions int    `json:"transitions"`
	// Checkpoint is when checkpoints were last written (leading) or read (following).
	Checkpoint *time.Time `json:"checkpointTime,omitempty"`
}

// elector runs the leader election and the checkpoint exchange.
type elector struct {
	cfg      config.LeaderElection
	client   kubernetes.Interface
	log      *slog.Logger
	fence    *fence
	identity string
	m        *leaderMetrics

	mu     sync.Mutex
	status LeaderStatus
}

func newElector(e *Election, log *slog.Logger) *elector {
	id := e.Config.Identity
	if id == "" {
		host, _ := os.Hostname()
		id = host + "_" + rand.String(8)
	}
	el := &elector{cfg: e.Config, client: e.Client, log: log.With("identity", id), fence: newFence(), identity: id, m: newLeaderMetrics()}
	el.status.Identity = id
	return el
}

// run takes part in the election until ctx ends, calling lead with a context that ends when
// leadership does, and follow whenever it is not leading. It gives the lease up on the way out.
func (el *elector) run(ctx context.Context, lead func(context.Context), follow func()) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, el.cfg.Namespace, el.cfg.LeaseName,
		el.client.CoreV1(), el.client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: el.identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            &fencedLock{Interface: lock, fence: el.fence, hold: el.cfg.RenewDeadline},
			LeaseDuration:   el.cfg.LeaseDuration,
			RenewDeadline:   el.cfg.RenewDeadline,
			RetryPeriod:     el.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            el.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					el.setLeading(true)
					el.log.Info("leading: this replica delivers")
					lead(ctx)
				},
				OnStoppedLeading: func() {
					el.fence.revoke()
					if el.setLeading(false) {
						el.log.Warn("no longer leading: delivery stopped")
					}
					follow()
				},
				OnNewLeader: el.newLeader,
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

// owns reports whether e is a change of the election's Lease or checkpoint ConfigMap.
func (el *elector) owns(e dynamicinformer.Event) bool {
	if e.Object.GetNamespace() != el.cfg.Namespace {
		return false
	}
	switch e.Resource {
	case schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}:
		return e.Object.GetName() == el.cfg.LeaseName
	case schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}:
		return e.Object.GetName() == el.cfg.CheckpointName
	}
	return false
}

// setLeading records whether this replica leads, and reports whether that changed.
func (el *elector) setLeading(leading bool) bool {
	el.mu.Lock()
	defer el.mu.Unlock()
	changed := el.status.Leading != leading
	el.status.Leading = leading
	if leading {
		el.m.leading.Set(1)
	} else {
		el.m.leading.Set(0)
	}
	return changed
}

func (el *elector) newLeader(identity string) {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.status.Leader != identity {
		if el.status.Leader != "" {
			el.status.Transitions++
			el.m.transitions.Inc()
		}
		el.status.Leader = identity
		el.log.Info("leader elected", "leader", identity)
	}
}

// leaderStatus reports the election as this replica sees it; it leads only while its fence
// holds.
func (el *elector) leaderStatus() LeaderStatus {
	_, held := el.fence.held()
	el.mu.Lock()
	defer el.mu.Unlock()
	s := el.status
	s.Leading = s.Leading && held
	return s
}

func (el *elector) leading() bool {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.status.Leading
}

// exchange writes the journal's checkpoints to the checkpoint ConfigMap every interval while
// this replica leads and its fence holds, and while it follows reads them and trims the
// journal to them.
func (el *elector) exchange(ctx context.Context, j *journal.Journal) {
	t := time.NewTicker(el.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		op := "read"
		if el.leading() {
			op = "write"
			if _, held := el.fence.held(); held {
				err = el.publish(ctx, j.Checkpoints())
			}
		} else {
			var cp journal.Checkpoints
			if cp, _, err = el.fetch(ctx); err == nil {
				j.Trim(cp)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			el.m.checkpoints.WithLabelValues(op, "error").Inc()
			el.log.Warn("checkpoint "+op+" failed", "configMap", el.cfg.Namespace+"/"+el.cfg.CheckpointName, "err", err)
			continue
		}
		el.m.checkpoints.WithLabelValues(op, "ok").Inc()
		now := time.Now().UTC()
		el.mu.Lock()
		el.status.Checkpoint = &now
		el.mu.Unlock()
	}
}

// checkpointKey is the ConfigMap's data key holding the checkpoints as JSON:
// {"sink": {"apps/v1/deployments": "1234"}}.
const checkpointKey = "checkpoints.json"

// fetch reads the checkpoints and the ConfigMap they came from (nil when it does not exist).
func (el *elector) fetch(ctx context.Context) (journal.Checkpoints, *corev1.ConfigMap, error) {
	cm, err := el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Get(ctx, el.cfg.CheckpointName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return journal.Checkpoints{}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	cp, err := decodeCheckpoints(cm.Data[checkpointKey])
	if err != nil {
		return nil, nil, fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return cp, cm, nil
}

// publish merges cp into the stored checkpoints, which only ever rise, and writes them if any
// rose. A conflicting write is retried at the next interval.
func (el *elector) publish(ctx context.Context, cp journal.Checkpoints) error {
	stored, cm, err := el.fetch(ctx)
	if err != nil {
		return err
	}
	if !stored.Merge(cp) {
		return nil
	}
	data := map[string]string{checkpointKey: encodeCheckpoints(stored)}
	if cm == nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: el.cfg.CheckpointName, Namespace: el.cfg.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "dynwatch"}}, Data: data}
		_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[checkpointKey] = data[checkpointKey]
	_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

func encodeCheckpoints(cp journal.Checkpoints) string {
	out := map[string]map[string]string{}
	for sink, byResource := range cp {
		out[sink] = map[string]string{}
		for gvr, rev := range byResource {
			out[sink][gvr.GroupVersion().String()+"/"+gvr.Resource] = fmt.Sprint(rev)
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func decodeCheckpoints(s string) (journal.Checkpoints, error) {
	cp := journal.Checkpoints{}
	if s == "" {
		return cp, nil
	}
	var in map[string]map[string]string
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("%s: %w", checkpointKey, err)
	}
	for sink, byResource := range in {
		cp[sink] = map[schema.GroupVersionResource]uint64{}
		for key, rev := range byResource {
			i := strings.LastIndex(key, "/")
			gv, err := schema.ParseGroupVersion(key[:max(i, 0)])
			if i < 0 || err != nil {
				return nil, fmt.Errorf("%s: sink %s: resource %q is not group/version/resource", checkpointKey, sink, key)
			}
			var n uint64
			if _, err := fmt.Sscan(rev, &n); err != nil {
				return nil, fmt.Errorf("%s: sink %s: resource %s: revision %q is not an integer", checkpointKey, sink, key, rev)
			}
			cp[sink][gv.WithResource(key[i+1:])] = n
		}
	}
	return cp, nil
}

// leaderMetrics are the leader election's metrics.
type leaderMetrics struct {
	leading     prometheus.Gauge
	transitions prometheus.Counter
	checkpoints *prometheus.CounterVec
}

func newLeaderMetrics() *leaderMetrics {
	m := &leaderMetrics{
		leading:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynwatch_leader_election_leading", Help: "1 while this replica holds the Lease and delivers, else 0."}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_leader_election_transitions_total", Help: "Changes of leader this replica has seen."}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynwatch_leader_election_checkpoints_total", Help: "Checkpoint exchanges with the cluster, by operation (write while leading, read while following) and result (ok, error)."}, []string{"operation", "result"}),
	}
	for _, op := range []string{"read", "write"} {
		for _, r := range []string{"ok", "error"} {
			m.checkpoints.WithLabelValues(op, r)
		}
	}
	return m
}

func (m *leaderMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leading, m.transitions, m.checkpoints}
}
