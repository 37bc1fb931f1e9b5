package app

import (
	"context"
	"log/slog"
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/history"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/leader"
	"github.com/dynwatch/dynwatch/object"
)

// pipeline is dynwatch's event path, wired here and nowhere else:
//
//	informers ──events, initial lists, resumptions──▶ journal ──committed entries──▶ delivery ──▶ transports
//	    ▲                                               │  ▲                         (the sinks)
//	    └──────────── held back while it is full ───────┘  └── checkpoints ── election
//
// The informers (package dynamicinformer) hand each event to the journal, which is one of
// their subscribers (the query API's watch hub is the other) and holds them back while too
// much waits to be committed. The journal compares each event with what it recorded of the
// object, makes it durable in the state store, and queues it for every sink whose filters
// select it; after a restart it resumes the informers' streams from what it recorded. Delivery
// sends what is queued while this replica delivers, which with leaderElection the election
// decides, exchanging the journal's checkpoints with the other replicas. initialState replays
// and the journal's questions about the cache are answered from the informers' (cache).
type pipeline struct {
	log      *slog.Logger
	journal  *journal.Journal
	delivery *delivery.Dispatcher
	elector  *leader.Elector // nil without leader election
}

// The informers find what the journal does for them by asserting its type: a journal that
// stopped implementing one of these would lose it silently, so the build fails instead.
var (
	_ dynamicinformer.Subscriber   = (*journal.Journal)(nil)
	_ dynamicinformer.ListObserver = (*journal.Journal)(nil)
	_ dynamicinformer.Resumer      = (*journal.Journal)(nil)
	_ dynamicinformer.Gate         = (*journal.Journal)(nil)
	_ dynamicinformer.ListObserver = (*history.Recorder)(nil)
)

// newPipeline builds the journal and delivery for cfg, delivering to sinks (the configured
// ones and the subscriptions', these under access); elector is nil without leader election,
// and resources are the informers', which are built after the pipeline (they subscribe the
// journal) and asked for only once it runs.
func newPipeline(log *slog.Logger, reg prometheus.Registerer, cfg *config.Config, sinks []config.SinkConfig, access delivery.Access, cluster object.Cluster, elector *leader.Elector, resources func() []*dynamicinformer.Resource) (*pipeline, error) {
	c := cache{resources}
	var ignore func(schema.GroupVersionResource, string, string) bool
	var leadership delivery.Leadership
	if elector != nil {
		ignore, leadership = elector.Owns, elector
	}
	var d *delivery.Dispatcher // the journal asks for its targets, and retires them, only once it runs
	j, err := journal.New(journal.Options{
		Logger: log, Registerer: reg, Path: cfg.State.Path, MaxPendingBytes: cfg.State.MaxPendingBytes,
		Targets: func() []journal.Target { return d.Targets() }, Retired: func(t journal.Target) { d.Retire(t) },
		Ignore: ignore, Workers: filterWorkers(), Bound: c.selectionRevision, Current: c.cached,
	})
	if err != nil {
		return nil, err
	}
	if d, err = delivery.New(delivery.Options{
		Logger: log, Registerer: reg, Sinks: sinks, Access: access, Transports: transports(cluster), Cluster: cluster.ID, Journal: j,
		Leadership: leadership, ShutdownTimeout: cfg.ShutdownTimeout, Cache: c,
	}); err != nil {
		_ = j.Close()
		return nil, err
	}
	return &pipeline{log: log, journal: j, delivery: d, elector: elector}, nil
}

// run runs the journal and delivers until ctx ends: at once, or with leader election while
// this replica leads. Once ctx has ended (end it only after the informers have stopped: no
// event may reach a journal that is closing) it stops within the shutdown timeout, in order:
// the election gives up the Lease, delivery stops taking work, the journal's writer queues
// what the informers handed over last, requests under way finish, and the journal commits the
// last acknowledgements and closes.
func (p *pipeline) run(ctx context.Context) error {
	writing, stopWriting := context.WithCancel(context.WithoutCancel(ctx))
	written := make(chan struct{})
	go func() { defer close(written); p.journal.Run(writing) }()
	stopJournal := func() { stopWriting(); <-written }
	p.delivery.Start(ctx)
	var elected sync.WaitGroup
	if p.elector == nil {
		if err := p.delivery.Lead(ctx); err != nil {
			stopJournal()
			return err
		}
	} else {
		elected.Go(func() {
			lead := func(ctx context.Context) {
				if err := p.delivery.Lead(ctx); err != nil {
					p.log.Error("start delivering", "err", err)
				}
			}
			if err := p.elector.Run(ctx, p.journal, lead, p.delivery.Follow); err != nil {
				p.log.Error("leader election stopped", "err", err)
			}
		})
	}
	<-ctx.Done()
	elected.Wait() // the Lease is given up only once delivery has stopped
	p.delivery.Stop(stopJournal)
	_ = p.journal.Flush() // the last acknowledgements
	return p.journal.Close()
}

// filterWorkers is how many goroutines filter events off the journal's writer: twice the
// CPUs, at least 4, so that a few costly objects being filtered at once do not hold up
// everyone else's.
func filterWorkers() int { return max(4, 2*runtime.GOMAXPROCS(0)) }

// cache is the informers' cache as the journal (journal.Options.Bound, Current) and the
// initialState replays (delivery.Cache) ask about it.
type cache struct {
	resources func() []*dynamicinformer.Resource
}

// running is the informers' resource of gvr, if one is running.
func (c cache) running(gvr schema.GroupVersionResource) (*dynamicinformer.Resource, bool) {
	for _, r := range c.resources() {
		if g, _, running := r.API(); running && g == gvr {
			return r, true
		}
	}
	return nil, false
}

// cached is the object namespace/name of gvr as the informers' cache holds it now; false when
// no running informer has it.
func (c cache) cached(gvr schema.GroupVersionResource, namespace, name string) (*object.Object, bool) {
	if r, ok := c.running(gvr); ok {
		return r.Get(namespace, name)
	}
	return nil, false
}

// selectionRevision bounds the journal's checkpoints of a resource with a namespaceSelector
// (see dynamicinformer.Resource.SelectionRevision).
func (c cache) selectionRevision(gvr schema.GroupVersionResource) (uint64, bool) {
	if r, ok := c.running(gvr); ok {
		return r.SelectionRevision()
	}
	return 0, false
}

// Lookup implements delivery.Cache.
func (c cache) Lookup(gvr schema.GroupVersionResource) (running, synced, pending bool) {
	for _, r := range c.resources() {
		st := r.State()
		if g, _, run := r.API(); run && g == gvr {
			running, synced = true, st == dynamicinformer.StateSynced || st == dynamicinformer.StateStale
		}
		pending = pending || st == dynamicinformer.StatePending
	}
	return running, synced, pending
}

// Page implements delivery.Cache.
func (c cache) Page(gvr schema.GroupVersionResource, after string, size int, fn func([]*object.Object, bool)) bool {
	r, ok := c.running(gvr)
	return ok && r.Page(after, size, fn)
}
