package webhook

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Options are a Dispatcher's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Webhooks   []config.Webhook
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Dispatcher hands every event to the sinks whose filters select it.
type Dispatcher struct {
	sinks []*Sink
}

// New builds a Dispatcher with one Sink per configured webhook, each with an in-memory queue,
// and registers their metrics. Nothing is sent until Run.
func New(o Options) (*Dispatcher, error) {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	m := newMetrics()
	d := &Dispatcher{}
	for i := range o.Webhooks {
		cfg := &o.Webhooks[i]
		q := NewMemoryQueue(cfg.QueueSize)
		s, err := newSink(cfg, o.Logger, q, m.forSink(cfg.Name, q), now)
		if err != nil {
			return nil, err
		}
		d.sinks = append(d.sinks, s)
	}
	if err := o.Registerer.Register(m); err != nil {
		return nil, err
	}
	return d, nil
}

// OnEvent implements dynamicinformer.Subscriber: it filters and enqueues, never blocking.
func (d *Dispatcher) OnEvent(e dynamicinformer.Event) {
	for _, s := range d.sinks {
		if s.selects(e) {
			s.enqueue(e)
		}
	}
}

// Run delivers until ctx ends. Then each sink dead-letters what it could not deliver, with
// reason shutdown, and Run returns nil. OnEvent must not be called once ctx has ended: end it
// only after the informers that call OnEvent have stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range d.sinks {
		wg.Go(func() { s.run(ctx) })
	}
	wg.Wait()
	return nil
}
