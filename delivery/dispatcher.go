package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Options are a Dispatcher's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Sinks are the configured sinks of every kind.
	Sinks []config.SinkConfig
	// Transports builds each sink's transport, by its kind.
	Transports Transports
	// StatePath is the state store's file, which keeps the object state and the outboxes
	// across restarts; empty keeps them in memory.
	StatePath string
	// MaxPendingBytes bounds the events the journal holds before the informers are held back
	// (see journal.Options.MaxPendingBytes).
	MaxPendingBytes int64
	// Election, when set, makes this replica deliver only while it leads; it needs a
	// StatePath.
	Election Election
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// ShutdownTimeout bounds what Run does once its context ends.
	ShutdownTimeout time.Duration
	// Resources are the informers' resources, read by the initialState replays (package
	// dynamicinformer's Manager.Resources); nil replays nothing.
	Resources func() []*dynamicinformer.Resource
}

// Dispatcher hands every event to the sinks whose filters select it, through the journal.
type Dispatcher struct {
	log             *slog.Logger
	now             func() time.Time
	m               *metrics
	journal         *journal.Journal
	election        Election // nil: this replica always delivers
	transports      Transports
	shutdownTimeout time.Duration
	// abandon ends when the shutdown deadline passes: work still running then is cut short.
	abandon       context.Context
	abandonCancel context.CancelFunc
	// finish ends half way to the shutdown deadline: requests still under way then are cut
	// short, and the rest of the time is the dead letters'.
	finish       context.Context
	finishCancel context.CancelFunc
	retiring     sync.WaitGroup
	resources    func() []*dynamicinformer.Resource
	replays      sync.WaitGroup  // the initialState replays
	replayCtx    context.Context // Run's, once it runs: Update starts replays under it

	life  sync.Mutex // held by Update, and by Run while it starts and stops
	mu    sync.RWMutex
	sinks []*Sink         // in configuration order
	ctx   context.Context // Run's while the sinks run
}

// New builds a Dispatcher with one Sink per configured webhook and registers the metrics.
// Nothing is sent until Run.
func New(o Options) (*Dispatcher, error) {
	d := &Dispatcher{log: o.Logger, now: o.Now, election: o.Election, transports: o.Transports, shutdownTimeout: o.ShutdownTimeout, resources: o.Resources}
	if d.now == nil {
		d.now = time.Now
	}
	if o.Transports == nil {
		return nil, errors.New("no transports: Options.Transports builds each sink's")
	}
	if d.shutdownTimeout <= 0 {
		d.shutdownTimeout = config.DefaultShutdownTimeout
	}
	d.abandon, d.abandonCancel = context.WithCancel(context.Background())
	d.finish, d.finishCancel = context.WithCancel(context.Background())
	var err error
	if o.Election != nil && o.StatePath == "" {
		return nil, errors.New("leader election needs a state store (state.path)")
	}
	d.journal, err = journal.New(journal.Options{Logger: o.Logger, Registerer: o.Registerer, Path: o.StatePath, MaxPendingBytes: o.MaxPendingBytes, Now: d.now, Targets: d.targets, Retired: d.retire,
		Workers: filterWorkers(), Bound: d.selectionRevision, Current: d.cached})
	if err != nil {
		return nil, err
	}
	d.m = newMetrics(d.journal)
	for _, cfg := range o.Sinks {
		s, err := newSink(cfg, d.log, d.journal, d.now, d.m, d.fence(), d.transports)
		if err != nil {
			_ = d.journal.Close()
			return nil, err
		}
		d.sinks = append(d.sinks, s)
	}
	if err := o.Registerer.Register(d.m); err != nil {
		_ = d.journal.Close()
		return nil, err
	}
	return d, nil
}

// Close releases what New took (the state store), for a Dispatcher whose Run is never to be
// called. Run closes it itself.
func (d *Dispatcher) Close() error { return d.journal.Close() }

// targets are the sinks as the journal sees them.
func (d *Dispatcher) targets() []journal.Target {
	sinks := d.current()
	out := make([]journal.Target, len(sinks))
	for i, s := range sinks {
		out[i] = s
	}
	return out
}

func (d *Dispatcher) current() []*Sink {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.sinks
}

// Ready implements httpapi.Readiness: not ready while the state store cannot commit.
func (d *Dispatcher) Ready() (bool, []string) {
	if err := d.journal.Healthy(); err != nil {
		return false, []string{err.Error()}
	}
	return true, nil
}

// Room implements dynamicinformer.Gate: the journal's room for more events.
func (d *Dispatcher) Room() <-chan struct{} { return d.journal.Room() }

// Pressure reports the journal's backpressure, for /status.
func (d *Dispatcher) Pressure() journal.PressureStatus { return d.journal.Pressure() }

// OnEvent implements dynamicinformer.Subscriber: it hands e to the journal, never blocking.
// Changes of the election's own Lease and checkpoint ConfigMap are not events to deliver: a
// delivery would move the checkpoint, whose write would be another change, every second.
func (d *Dispatcher) OnEvent(e object.Event) {
	if d.election != nil && d.election.Owns(e.Resource, e.Object.GetNamespace(), e.Object.GetName()) {
		return
	}
	d.journal.Record(e)
}

// ListStarted implements dynamicinformer.ListObserver.
func (d *Dispatcher) ListStarted(gvr schema.GroupVersionResource, run uint64, streams []string) {
	d.journal.ListStarted(gvr, run, streams)
}

// ListSynced implements dynamicinformer.ListObserver.
func (d *Dispatcher) ListSynced(gvr schema.GroupVersionResource, run uint64, revision uint64) {
	d.journal.ListSynced(gvr, run, revision)
}

// Resume implements dynamicinformer.Resumer: with a store, an informer's stream resumes from
// what the journal recorded of it (see journal.Journal.Resume).
func (d *Dispatcher) Resume(ctx context.Context, gvr schema.GroupVersionResource, stream, selection string) ([][]byte, uint64, bool, error) {
	return d.journal.Resume(ctx, gvr, stream, selection)
}

// Run delivers until ctx ends. With a store it first queues the outboxes left by the previous
// run, ahead of any new event, and dead-letters those of webhooks no longer configured; at the
// end what is undelivered stays in the outboxes. Without a store, what is undelivered at the
// end is dead-lettered with reason shutdown. With leader election it delivers only while it
// leads, and until then records into the outboxes, trimmed to the leader's checkpoints. Once
// ctx ends, Run returns within the shutdown timeout. OnEvent must not be called once ctx has
// ended: end it only after the informers have stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	journalCtx, stopJournal := context.WithCancel(context.WithoutCancel(ctx))
	journalDone := make(chan struct{})
	go func() { defer close(journalDone); d.journal.Run(journalCtx) }()
	for _, s := range d.current() {
		s.dead.start()
	}
	d.life.Lock()
	d.replayCtx = ctx
	for _, s := range d.current() {
		d.startReplay(ctx, s)
	}
	d.life.Unlock()
	var elected sync.WaitGroup
	if d.election == nil {
		if err := d.lead(ctx); err != nil {
			stopJournal()
			<-journalDone
			return err
		}
	} else {
		for _, s := range d.current() {
			s.spill()
		}
		elected.Go(func() {
			if err := d.election.Run(ctx, d.journal, func(ctx context.Context) {
				if err := d.lead(ctx); err != nil {
					d.log.Error("start delivering", "err", err)
				}
			}, d.follow); err != nil {
				d.log.Error("leader election stopped", "err", err)
			}
		})
	}

	<-ctx.Done()
	return d.shutdown(&elected, stopJournal, journalDone)
}

// shutdown stops delivering once Run's context has ended, within the shutdown timeout: the
// election gives up the Lease once delivery has stopped, requests under way have half of the
// timeout to finish, the journal queues what the informers handed over last and commits the
// last acknowledgements before it closes.
func (d *Dispatcher) shutdown(elected *sync.WaitGroup, stopJournal context.CancelFunc, journalDone <-chan struct{}) error {
	deadline := time.AfterFunc(d.shutdownTimeout, d.abandonCancel)
	defer deadline.Stop()
	finishBy := time.AfterFunc(d.shutdownTimeout/2, d.finishCancel)
	defer finishBy.Stop()
	elected.Wait() // the lease is given up only once delivery has stopped
	d.replays.Wait()
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	d.ctx = nil
	d.mu.Unlock()
	stopJournal() // queue what the informers handed over last
	<-journalDone
	sinks := d.current()
	var wg sync.WaitGroup
	for _, s := range sinks {
		wg.Go(func() {
			s.stopWorkers()
			s.cur.Load().transport.Close()
			if !d.journal.Durable() {
				s.deadLetterQueue(reasonShutdown)
			}
			s.dead.close(d.abandon)
		})
	}
	wg.Wait()
	d.waitRetired()
	_ = d.journal.Flush() // the last acks
	return d.journal.Close()
}

// lead starts delivering under ctx: the outboxes are queued again from their oldest entry,
// and the sinks' workers start.
func (d *Dispatcher) lead(ctx context.Context) error {
	d.life.Lock()
	defer d.life.Unlock()
	if ctx.Err() != nil {
		return nil
	}
	if err := d.restore(); err != nil {
		return err
	}
	d.mu.Lock()
	d.ctx = ctx
	sinks := d.sinks
	d.mu.Unlock()
	for _, s := range sinks {
		s.startWorkers(ctx, d.finish)
	}
	return nil
}

// follow stops delivering: everything queued stays in the outboxes only, for the leader's
// checkpoints to trim, or for this replica to deliver if it leads again.
func (d *Dispatcher) follow() {
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	d.ctx = nil
	sinks := d.sinks
	d.mu.Unlock()
	for _, s := range sinks {
		s.spill()
		s.stopWorkers()
		s.queue.Drain()
		s.cur.Load().transport.Close() // a follower holds no connection to a broker
	}
}

func (d *Dispatcher) waitRetired() {
	done := make(chan struct{})
	go func() { d.retiring.Wait(); close(done) }()
	select {
	case <-done:
	case <-d.abandon.Done():
	}
}

// restore queues every configured sink's outbox and dead-letters, with reason sink_removed,
// the outboxes of webhooks no longer configured.
func (d *Dispatcher) restore() error {
	if !d.journal.Durable() {
		return nil
	}
	for _, s := range d.sinks {
		s.queue.Drain() // every one of them is in the outbox
		s.spill()
		s.refill(true)
		if n := d.journal.OutboxLen(s.name); n > 0 {
			d.log.Info("outbox queued", "sink", s.name, "events", n)
		}
	}
	names, err := d.journal.Sinks()
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	for _, name := range names {
		if !slices.ContainsFunc(d.sinks, func(s *Sink) bool { return s.name == name }) {
			if err := d.orphaned(name); err != nil {
				return fmt.Errorf("state: %w", err)
			}
		}
	}
	return nil
}

// fence is what every request is made under: the election's, or one that always holds.
func (d *Dispatcher) fence() Fence {
	if d.election == nil {
		return Always{}
	}
	return d.election
}

// filterWorkers is how many goroutines filter events off the journal's writer: twice the CPUs, at least 4, so that a few costly objects being filtered at once do not
// hold up everyone else's.
func filterWorkers() int { return max(4, 2*runtime.GOMAXPROCS(0)) }

// cached is the object namespace/name of gvr as the informers' cache holds it now (see
// journal.Options.Current); false when no running informer has it.
func (d *Dispatcher) cached(gvr schema.GroupVersionResource, namespace, name string) (*object.Object, bool) {
	if r, ok := d.running(gvr); ok {
		return r.Get(namespace, name)
	}
	return nil, false
}

// selectionRevision bounds the journal's checkpoints of a resource with a namespaceSelector
// (see journal.Options.Bound and dynamicinformer.Resource.SelectionRevision).
func (d *Dispatcher) selectionRevision(gvr schema.GroupVersionResource) (uint64, bool) {
	if r, ok := d.running(gvr); ok {
		return r.SelectionRevision()
	}
	return 0, false
}

// running is the informers' resource of gvr, if one is running.
func (d *Dispatcher) running(gvr schema.GroupVersionResource) (*dynamicinformer.Resource, bool) {
	if d.resources == nil {
		return nil, false
	}
	for _, r := range d.resources() {
		if g, _, running := r.API(); running && g == gvr {
			return r, true
		}
	}
	return nil, false
}
