package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
)

// Options are a Dispatcher's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Sinks are the configured sinks of every kind.
	Sinks []config.SinkConfig
	// Transports builds each sink's transport, by its kind.
	Transports Transports
	// Journal is what the sinks' deliveries come from and are acknowledged to: its Targets
	// are the Dispatcher's (Targets) and it hands retired sinks back (Retire). Its caller runs
	// and closes it (see Stop).
	Journal *journal.Journal
	// Leadership, when set, makes this replica deliver only from Lead to Follow, each request
	// made under its Fence; the journal then needs a state store.
	Leadership Leadership
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// ShutdownTimeout bounds what Stop does once Start's context has ended.
	ShutdownTimeout time.Duration
	// Cache is what initialState replays read (see replay.go); nil replays nothing.
	Cache Cache
	// Cluster is the id of the cluster the events come from, which dead letters name; the
	// transports carry it in every event themselves (see Transports).
	Cluster string
	// Access decides for the sinks that have a subject (Subscriptions); without it such a
	// sink selects nothing.
	Access Access
}

// Dispatcher runs the sinks: it queues what the journal hands each of them, delivers it while
// this replica delivers (Lead, Follow), applies reloads (Update) and dead-letters what cannot
// be delivered.
type Dispatcher struct {
	log             *slog.Logger
	now             func() time.Time
	m               *metrics
	journal         *journal.Journal
	leadership      Leadership // nil: this replica always delivers
	transports      Transports
	cluster         string
	shutdownTimeout time.Duration
	// abandon ends when the shutdown deadline passes: work still running then is cut short.
	abandon       context.Context
	abandonCancel context.CancelFunc
	// finish ends half way to the shutdown deadline: requests still under way then are cut
	// short, and the rest of the time is the dead letters'.
	finish       context.Context
	finishCancel context.CancelFunc
	retiring     sync.WaitGroup
	cache        Cache
	access       Access
	replays      sync.WaitGroup  // the initialState replays
	replayCtx    context.Context // Start's: Update starts replays under it

	life  sync.Mutex // held by Update, Start, Lead, Follow and Stop
	mu    sync.RWMutex
	sinks []*Sink         // in configuration order
	ctx   context.Context // Lead's while the sinks deliver
}

// New builds a Dispatcher with one Sink per configured sink and registers the metrics.
// Nothing is sent until Lead.
func New(o Options) (*Dispatcher, error) {
	d := &Dispatcher{log: o.Logger, now: o.Now, journal: o.Journal, leadership: o.Leadership, transports: o.Transports, shutdownTimeout: o.ShutdownTimeout, cache: o.Cache, cluster: o.Cluster, access: o.Access}
	if d.now == nil {
		d.now = time.Now
	}
	if o.Transports == nil {
		return nil, errors.New("no transports: Options.Transports builds each sink's")
	}
	if o.Journal == nil {
		return nil, errors.New("no journal: Options.Journal is what the sinks deliver")
	}
	if o.Leadership != nil && !o.Journal.Durable() {
		return nil, errors.New("leader election needs a state store (state.path)")
	}
	if d.shutdownTimeout <= 0 {
		d.shutdownTimeout = config.DefaultShutdownTimeout
	}
	d.abandon, d.abandonCancel = context.WithCancel(context.Background())
	d.finish, d.finishCancel = context.WithCancel(context.Background())
	d.m = newMetrics(d.journal)
	for _, cfg := range o.Sinks {
		s, err := d.newSink(cfg)
		if err != nil {
			return nil, err
		}
		d.sinks = append(d.sinks, s)
	}
	if err := o.Registerer.Register(d.m); err != nil {
		return nil, err
	}
	return d, nil
}

// newSink builds the sink cfg configures.
func (d *Dispatcher) newSink(cfg config.SinkConfig) (*Sink, error) {
	s, err := newSink(cfg, d.log, d.journal, d.now, d.m, d.fence(), d.transports, d.cluster)
	if err != nil {
		return nil, err
	}
	s.access = d.access
	return s, nil
}

// Access decides what the subject of a sink that has one (config.Sink.Subject) may watch. A
// sink with a subject selects an event unless Known says its subject may not watch it, and
// sends it only if Allowed says it may, when its turn comes.
type Access interface {
	// Known reports, without blocking, whether subject may watch gvr's objects in namespace
	// ("" for a cluster-scoped object), if that is known; it is called for every event such a
	// sink's other filters select, from the journal's filter workers.
	Known(subject *config.Subject, gvr schema.GroupVersionResource, namespace string) (allowed, known bool)
	// Allowed reports whether subject may watch gvr's objects in namespace, asking the
	// apiserver if it must; it is called by the sink's workers before each attempt.
	Allowed(subject *config.Subject, gvr schema.GroupVersionResource, namespace string) (bool, error)
}

// Targets are the sinks as the journal sees them (journal.Options.Targets).
func (d *Dispatcher) Targets() []journal.Target {
	sinks := d.current()
	out := make([]journal.Target, len(sinks))
	for i, s := range sinks {
		out[i] = s
	}
	return out
}

// SinkStatus is one sink's state in /status.
type SinkStatus struct {
	Name string `json:"name"`
	// Disabled is set while the sink sends nothing because its destination answered 410 Gone,
	// until its configuration changes.
	Disabled *disabled `json:"disabled,omitempty"`
	// Durable is a stream sink's destination as its last durability check found it; absent for
	// a webhook, and before the first check (a replica that does not lead checks nothing).
	Durable *Durability `json:"durable,omitempty"`
}

// Status is every sink's state, in configuration order.
func (d *Dispatcher) Status() []SinkStatus {
	sinks := d.current()
	out := make([]SinkStatus, len(sinks))
	for i, s := range sinks {
		st := s.cur.Load()
		out[i] = SinkStatus{Name: s.name, Disabled: st.gone.Load(), Durable: st.durable.Load()}
	}
	return out
}

func (d *Dispatcher) current() []*Sink {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.sinks
}

// Start starts the sinks' dead letters and initialState replays, under ctx. Once ctx ends, the
// shutdown timeout runs: requests under way have half of it to finish (see Stop). With
// Leadership the sinks record into their outboxes only until Lead; without, call Lead next.
func (d *Dispatcher) Start(ctx context.Context) {
	context.AfterFunc(ctx, func() {
		time.AfterFunc(d.shutdownTimeout, d.abandonCancel)
		time.AfterFunc(d.shutdownTimeout/2, d.finishCancel)
	})
	d.life.Lock()
	defer d.life.Unlock()
	d.replayCtx = ctx
	for _, s := range d.current() {
		s.dead.start()
	}
	for _, s := range d.current() {
		d.startReplay(ctx, s)
	}
	if d.leadership != nil {
		for _, s := range d.current() {
			s.spill()
		}
	}
}

// Stop stops delivering once Start's context has ended (and, with Leadership, once the
// election has stopped: the Lease is given up only once delivery has stopped), within the
// shutdown timeout. The replays end; then stopJournal is called, and must return once the
// journal's writer has stopped, so that what the informers handed over last is queued; then
// requests under way finish (or are cut half way to the timeout) and, without a state store,
// what is still queued is dead-lettered with reason shutdown. The caller then flushes the
// journal's last acknowledgements and closes it.
func (d *Dispatcher) Stop(stopJournal func()) {
	d.replays.Wait()
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	d.ctx = nil
	d.mu.Unlock()
	stopJournal()
	var wg sync.WaitGroup
	for _, s := range d.current() {
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
}

// Lead starts delivering under ctx: the outboxes are queued again from their oldest entry, and
// the sinks' workers start.
func (d *Dispatcher) Lead(ctx context.Context) error {
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

// Follow stops delivering: everything queued stays in the outboxes only, for the leader's
// checkpoints to trim, or for this replica to deliver if it leads again.
func (d *Dispatcher) Follow() {
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

// waitRetired waits for the removed sinks' dead letters, until the shutdown deadline.
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
	if d.leadership == nil {
		return Always{}
	}
	return d.leadership
}
