package leader

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
)

// Options are an Elector's dependencies.
type Options struct {
	Config     config.LeaderElection
	Client     kubernetes.Interface
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Status is the leader election's part of /status.
type Status struct {
	Identity    string `json:"identity"`
	Leader      string `json:"leader"`
	Leading     bool   `json:"leading"`
	Transitions int    `json:"transitions"`
	// Checkpoint is when checkpoints were last written (leading) or read (following).
	Checkpoint *time.Time `json:"checkpointTime,omitempty"`
	// Conditions holds CheckpointsAccepted: True once this replica's checkpoints are written
	// (reason Written) or the ConfigMap's accepted (Accepted, or NoCheckpoints while there is no
	// ConfigMap); False while the ConfigMap's are
	// refused, with the refusal as reason (Malformed, NotLeaseHolder, AheadOfCluster).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// conditionCheckpointsAccepted is the condition saying whether the checkpoints are acted on.
const conditionCheckpointsAccepted = "CheckpointsAccepted"

// Elector takes part in the leader election, holds the fence and exchanges checkpoints.
type Elector struct {
	cfg      config.LeaderElection
	client   kubernetes.Interface
	log      *slog.Logger
	fence    *fence
	identity string
	m        *metrics

	mu     sync.Mutex
	status Status
}

// New builds an Elector and registers its metrics. Nothing is sent until Run. Its identity is
// leaderElection.identity, or the host name with a random suffix.
func New(o Options) (*Elector, error) {
	id := o.Config.Identity
	if id == "" {
		host, _ := os.Hostname()
		id = host + "_" + rand.String(8)
	}
	el := &Elector{cfg: o.Config, client: o.Client, log: o.Logger.With("identity", id), fence: newFence(), identity: id, m: newMetrics()}
	el.status.Identity = id
	for _, c := range el.m.collectors() {
		if err := o.Registerer.Register(c); err != nil {
			return nil, err
		}
	}
	return el, nil
}

// Run takes part in the election until ctx ends, calling lead with a context that ends when
// leadership does, and follow whenever it stops leading; meanwhile it writes j's checkpoints
// while leading and trims j to the leader's while following. It gives the Lease up on the
// way out, once lead has returned.
func (el *Elector) Run(ctx context.Context, j *journal.Journal, lead func(context.Context), follow func()) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, el.cfg.Namespace, el.cfg.LeaseName,
		el.client.CoreV1(), el.client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: el.identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	var exchanging sync.WaitGroup
	exchanging.Go(func() { el.exchange(ctx, j) })
	defer exchanging.Wait()
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

// Owns reports whether the object is the election's Lease or checkpoint ConfigMap.
func (el *Elector) Owns(gvr schema.GroupVersionResource, namespace, name string) bool {
	if namespace != el.cfg.Namespace {
		return false
	}
	switch gvr {
	case schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}:
		return name == el.cfg.LeaseName
	case schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}:
		return name == el.cfg.CheckpointName
	}
	return false
}

// Bound returns a context that ends with ctx or when the fence lapses, and whether the fence
// holds now.
func (el *Elector) Bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	return el.fence.bound(ctx)
}

// Lapsed reports whether the fence does not hold now.
func (el *Elector) Lapsed() bool {
	_, held := el.fence.held()
	return !held
}

// Wait returns once the fence is granted again, or ctx ends.
func (el *Elector) Wait(ctx context.Context) { el.fence.wait(ctx) }

// setLeading records whether this replica leads, and reports whether that changed.
func (el *Elector) setLeading(leading bool) bool {
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

func (el *Elector) newLeader(identity string) {
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

// Status reports the election as this replica sees it; it leads only while its fence holds.
func (el *Elector) Status() Status {
	_, held := el.fence.held()
	el.mu.Lock()
	defer el.mu.Unlock()
	s := el.status
	s.Leading = s.Leading && held
	s.Conditions = slices.Clone(s.Conditions)
	return s
}

// Leading reports whether this replica has been elected and not yet stopped leading; its
// fence may have lapsed meanwhile.
func (el *Elector) Leading() bool {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.status.Leading
}
