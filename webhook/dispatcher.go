package webhook

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Options are a Dispatcher's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Webhooks   []config.Webhook
	// Store keeps the object state and the outboxes across restarts; nil keeps them in memory.
	// Run closes it.
	Store *Store
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Dispatcher hands every event to the sinks whose filters select it, through the journal.
type Dispatcher struct {
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	store   *Store
	journal *journal

	life  sync.Mutex // held by Update, and by Run while it stops
	mu    sync.RWMutex
	sinks []*Sink         // in configuration order
	ctx   context.Context // Run's while the sinks run
}

// New builds a Dispatcher with one Sink per configured webhook and registers the metrics.
// Nothing is sent until Run.
func New(o Options) (*Dispatcher, error) {
	d := &Dispatcher{log: o.Logger, now: o.Now, store: o.Store}
	if d.now == nil {
		d.now = time.Now
	}
	d.m = newMetrics(o.Store)
	d.journal = newJournal(o.Store, o.Logger, d.now, d.m, d.current)
	for i := range o.Webhooks {
		s, err := d.newSink(&o.Webhooks[i], nil)
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

// newSink builds a sink for cfg, taking over the queue and metrics of the sink it replaces, if any.
func (d *Dispatcher) newSink(cfg *config.Webhook, replaces *Sink) (*Sink, error) {
	var st sinkState
	if replaces != nil {
		st = replaces.sinkState
	} else {
		q := NewMemoryQueue(cfg.QueueSize)
		st = sinkState{queue: q, outbox: new(atomic.Int64)}
		st.m = d.m.forSink(cfg.Name, q, st.outbox)
	}
	return newSink(cfg, d.log, d.journal, d.now, st)
}

func (d *Dispatcher) current() []*Sink {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.sinks
}

// OnEvent implements dynamicinformer.Subscriber: it hands e to the journal, never blocking.
func (d *Dispatcher) OnEvent(e dynamicinformer.Event) {
	d.journal.submit(op{kind: opEvent, event: e})
}

// ListStarted implements dynamicinformer.ListObserver.
func (d *Dispatcher) ListStarted(gvr schema.GroupVersionResource, run uint64) {
	d.journal.submit(op{kind: opListStarted, gvr: gvr, run: run})
}

// ListSynced implements dynamicinformer.ListObserver.
func (d *Dispatcher) ListSynced(gvr schema.GroupVersionResource, run uint64) {
	d.journal.submit(op{kind: opListSynced, gvr: gvr, run: run})
}

// Run delivers until ctx ends. With a store it first queues the outboxes left by the previous
// run, ahead of any new event; at the end what is undelivered stays in the outboxes. Without a
// store, what is undelivered at the end is dead-lettered with reason shutdown. OnEvent must
// not be called once ctx has ended: end it only after the informers have stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.restore(); err != nil {
		return err
	}
	journalCtx, stopJournal := context.WithCancel(context.WithoutCancel(ctx))
	journalDone := make(chan struct{})
	go func() { defer close(journalDone); d.journal.run(journalCtx) }()
	d.mu.Lock()
	d.ctx = ctx
	for _, s := range d.sinks {
		s.start(ctx)
	}
	d.mu.Unlock()

	<-ctx.Done()
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	d.ctx = nil
	d.mu.Unlock()
	stopJournal() // queue what the informers handed over last
	<-journalDone
	leftover := reasonShutdown
	if d.store != nil {
		leftover = ""
	}
	var wg sync.WaitGroup
	for _, s := range d.current() {
		wg.Go(func() { s.stop(leftover) })
	}
	wg.Wait()
	d.journal.flush() // the last acks
	if d.store != nil {
		return d.store.Close()
	}
	return nil
}

// restore queues every configured sink's outbox and removes the outboxes of sinks no longer
// configured.
func (d *Dispatcher) restore() error {
	if d.store == nil {
		return nil
	}
	for _, s := range d.sinks {
		entries, err := d.store.Outbox(s.cfg.Name)
		if err != nil {
			return fmt.Errorf("state: %w", err)
		}
		s.outbox.Store(int64(len(entries)))
		for _, e := range entries {
			s.enqueue(e)
		}
		if len(entries) > 0 {
			d.log.Info("outbox from the previous run queued", "sink", s.cfg.Name, "events", len(entries))
		}
	}
	names, err := d.store.Sinks()
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	for _, name := range names {
		if !slices.ContainsFunc(d.sinks, func(s *Sink) bool { return s.cfg.Name == name }) {
			d.log.Warn("dropping the outbox of a sink no longer configured", "sink", name)
			d.journal.submit(op{kind: opDropSink, sink: name})
		}
	}
	return nil
}

// Update applies a new webhook configuration while running. Unchanged sinks go on as they
// are. A changed sink is replaced by one with the new configuration that takes over its queue
// and outbox. A removed sink stops; what it had not delivered is dead-lettered with reason
// sink_removed. A new sink receives the events that arrive from now on.
func (d *Dispatcher) Update(webhooks []config.Webhook) error {
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	old := map[string]*Sink{}
	for _, s := range d.sinks {
		old[s.cfg.Name] = s
	}
	var next, started, replaced []*Sink
	for i := range webhooks {
		cfg := &webhooks[i]
		prev := old[cfg.Name]
		if prev != nil && prev.cfg.Same(cfg) {
			next = append(next, prev)
			delete(old, cfg.Name)
			continue
		}
		s, err := d.newSink(cfg, prev)
		if err != nil {
			d.mu.Unlock()
			return err
		}
		if prev != nil {
			replaced = append(replaced, prev)
			delete(old, cfg.Name)
		}
		next = append(next, s)
		started = append(started, s)
	}
	d.sinks = next
	ctx := d.ctx
	d.mu.Unlock()

	for _, s := range replaced {
		s.stop("")
		d.log.Info("webhook reconfigured", "sink", s.cfg.Name)
	}
	for _, s := range old {
		s.stop(reasonRemoved)
		d.m.removeSink(s.cfg.Name)
		d.journal.submit(op{kind: opDropSink, sink: s.cfg.Name})
		d.log.Info("webhook removed", "sink", s.cfg.Name)
	}
	for _, s := range started {
		if ctx != nil {
			s.start(ctx)
		}
	}
	return nil
}
