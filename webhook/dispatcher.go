package webhook

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
	// ShutdownTimeout bounds what Run does once its context ends.
	ShutdownTimeout time.Duration
}

// Dispatcher hands every event to the sinks whose filters select it, through the journal.
type Dispatcher struct {
	log             *slog.Logger
	now             func() time.Time
	m               *metrics
	store           *Store
	journal         *journal
	shutdownTimeout time.Duration
	// abandon ends when the shutdown deadline passes: work still running then is cut short.
	abandon       context.Context
	abandonCancel context.CancelFunc
	retiring      sync.WaitGroup

	life  sync.Mutex // held by Update, and by Run while it starts and stops
	mu    sync.RWMutex
	sinks []*Sink         // in configuration order
	ctx   context.Context // Run's while the sinks run
}

// New builds a Dispatcher with one Sink per configured webhook and registers the metrics.
// Nothing is sent until Run.
func New(o Options) (*Dispatcher, error) {
	d := &Dispatcher{log: o.Logger, now: o.Now, store: o.Store, shutdownTimeout: o.ShutdownTimeout}
	if d.now == nil {
		d.now = time.Now
	}
	if d.shutdownTimeout <= 0 {
		d.shutdownTimeout = config.DefaultShutdownTimeout
	}
	d.abandon, d.abandonCancel = context.WithCancel(context.Background())
	d.m = newMetrics(o.Store)
	d.journal = newJournal(o.Store, o.Logger, d.now, d.m, d.current)
	d.journal.retired = d.retire
	for i := range o.Webhooks {
		s, err := newSink(&o.Webhooks[i], d.log, d.journal, d.now, d.m)
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

func (d *Dispatcher) current() []*Sink {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.sinks
}

// Ready implements httpapi.Readiness: not ready while the state store cannot commit.
func (d *Dispatcher) Ready() (bool, []string) {
	if err := d.journal.healthy(); err != nil {
		return false, []string{err.Error()}
	}
	return true, nil
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
// run, ahead of any new event, and dead-letters those of webhooks no longer configured; at the
// end what is undelivered stays in the outboxes. Without a store, what is undelivered at the
// end is dead-lettered with reason shutdown. Once ctx ends, Run returns within the shutdown
// timeout. OnEvent must not be called once ctx has ended: end it only after the informers
// have stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.life.Lock()
	if err := d.restore(); err != nil {
		d.life.Unlock()
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
	d.life.Unlock()

	<-ctx.Done()
	deadline := time.AfterFunc(d.shutdownTimeout, d.abandonCancel)
	defer deadline.Stop()
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
			if d.store == nil {
				s.deadLetterQueue(reasonShutdown)
			}
			s.dead.close(d.abandon)
		})
	}
	wg.Wait()
	d.waitRetired()
	_ = d.journal.flush() // the last acks
	if d.store != nil {
		return d.store.Close()
	}
	return nil
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
	if d.store == nil {
		return nil
	}
	for _, s := range d.sinks {
		n := d.store.outboxLen(s.name)
		s.outbox.Store(int64(n))
		if n > 0 {
			s.spill()
			s.refill(true)
			d.log.Info("outbox from the previous run queued", "sink", s.name, "events", n)
		}
	}
	names, err := d.store.sinks()
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

// orphaned dead-letters the outbox of a webhook no longer configured (removed or renamed
// while dynwatch was stopped): with no target left to write to, each event is logged and
// counted with reason sink_removed.
func (d *Dispatcher) orphaned(name string) error {
	log := d.log.With("sink", name)
	dead := d.m.deadLetters.WithLabelValues(name, reasonRemoved)
	var from uint64
	n := 0
	for {
		p, err := d.store.outboxPage(name, from, 1000)
		if err != nil {
			return err
		}
		for _, seq := range p.corrupt {
			d.m.corrupt.Inc()
			d.journal.ack(name, seq)
		}
		for _, dl := range p.deliveries {
			ref := refOf(dl)
			log.Error("dead letter", "id", dl.ID, "type", string(dl.Event.Type), "resource", ref.Resource, "namespace", ref.Namespace, "name", ref.Name,
				"reason", reasonRemoved, "error", "the webhook is no longer configured")
			dead.Inc()
			d.journal.ack(name, dl.Seq)
			n++
		}
		if p.end {
			break
		}
		from = p.next
	}
	log.Warn("the outbox of a webhook no longer configured was dead-lettered", "events", n, "reason", reasonRemoved)
	d.journal.submit(op{kind: opDropSink, sink: name})
	return nil
}

// Update applies a new webhook configuration while running. Unchanged sinks go on as they
// are. A changed sink keeps its queue, outbox and retry deadlines and restarts its workers
// with the new settings. A removed sink stops; once what was queued for it is committed, its
// queue and outbox are dead-lettered with reason sink_removed. A new sink receives the events
// that arrive from now on.
func (d *Dispatcher) Update(webhooks []config.Webhook) error {
	d.life.Lock()
	defer d.life.Unlock()
	type change struct {
		s   *Sink
		cfg *config.Webhook
		st  *settings
	}
	d.mu.Lock()
	old := map[string]*Sink{}
	for _, s := range d.sinks {
		old[s.name] = s
	}
	var changes []change
	var next []*Sink
	for i := range webhooks {
		cfg := &webhooks[i]
		prev := old[cfg.Name]
		if prev == nil {
			continue
		}
		if !prev.cfg().Same(cfg) {
			st, err := newSettings(cfg, cfg.BearerToken, cfg.SigningSecret)
			if err != nil {
				d.mu.Unlock()
				return err
			}
			changes = append(changes, change{prev, cfg, st})
		}
	}
	var started []*Sink
	for i := range webhooks {
		cfg := &webhooks[i]
		if prev := old[cfg.Name]; prev != nil {
			next = append(next, prev)
			delete(old, cfg.Name)
			continue
		}
		s, err := newSink(cfg, d.log, d.journal, d.now, d.m)
		if err != nil {
			d.mu.Unlock()
			return err
		}
		next = append(next, s)
		started = append(started, s)
	}
	d.sinks = next
	ctx := d.ctx
	d.mu.Unlock()

	for _, c := range changes {
		c.s.reconfigure(ctx, c.st)
		c.s.log.Info("webhook reconfigured")
	}
	for _, s := range old {
		s.stopWorkers()
		d.journal.submit(op{kind: opRemoveSink, target: s})
		s.log.Info("webhook removed")
	}
	for _, s := range started {
		if ctx != nil {
			s.start(ctx)
		}
	}
	return nil
}

// retire dead-letters what a removed sink had not delivered, with reason sink_removed: its
// queue, and with a store its whole outbox, which holds the queue and whatever did not fit.
// The journal calls it once everything queued for the sink is committed.
func (d *Dispatcher) retire(s *Sink) {
	d.retiring.Add(1)
	go func() {
		defer d.retiring.Done()
		s.dead.start()
		if d.store == nil {
			s.deadLetterQueue(reasonRemoved)
		} else {
			s.queue.Drain() // every one of them is in the outbox
			var from uint64
			for {
				p, err := d.store.outboxPage(s.name, from, 1000)
				if err != nil {
					s.log.Error("read the outbox of a removed webhook", "err", err)
					break
				}
				for _, seq := range p.corrupt {
					d.m.corrupt.Inc()
					d.journal.ack(s.name, seq)
				}
				for _, dl := range p.deliveries {
					s.dead.submit(dl, reasonRemoved, errRemoved)
				}
				if p.end {
					break
				}
				from = p.next
			}
		}
		s.dead.close(d.abandon)
		d.journal.submit(op{kind: opDropSink, sink: s.name})
		if !slices.ContainsFunc(d.current(), func(o *Sink) bool { return o.name == s.name }) {
			d.m.removeSink(s.name)
		}
	}()
}

var errRemoved = errors.New("the webhook was removed from the configuration")
