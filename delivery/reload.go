package delivery

import (
	"context"
	"errors"
	"slices"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
)

// orphaned dead-letters the outbox of a webhook no longer configured (removed or renamed
// while dynwatch was stopped): with no target left to write to, each event is logged and
// counted with reason sink_removed.
func (d *Dispatcher) orphaned(name string) error {
	log := d.log.With("sink", name)
	dead := d.m.deadLetters.WithLabelValues(name, reasonRemoved)
	n := 0
	_, _, err := d.journal.ReadOutbox(name, 0, 0, func(e journal.Entry) bool {
		ref := refOf(e)
		log.Error("dead letter", "id", e.ID, "type", string(e.Event.Type), "resource", ref.Resource, "namespace", ref.Namespace, "name", ref.Name,
			"reason", reasonRemoved, "error", "the webhook is no longer configured")
		dead.Inc()
		d.journal.Ack(name, e.Seq)
		n++
		return true
	})
	if err != nil {
		return err
	}
	log.Warn("the outbox of a webhook no longer configured was dead-lettered", "events", n, "reason", reasonRemoved)
	d.journal.DropSink(name)
	return nil
}

// Update applies a new webhook configuration while running. Unchanged sinks go on as they
// are. A changed sink keeps its queue, outbox and retry deadlines and restarts its workers
// with the new settings. A removed sink stops; once what was queued for it is committed, its
// queue and outbox are dead-lettered with reason sink_removed. A new sink receives the events
// that arrive from now on and, with initialState, every current object first (see replay.go).
func (d *Dispatcher) Update(sinks []config.SinkConfig) error {
	d.life.Lock()
	defer d.life.Unlock()
	changes, removed, started, ctx, err := d.swapSinks(sinks)
	if err != nil {
		return err
	}
	for _, c := range changes {
		c.s.reconfigure(ctx, d.finish, c.st)
		c.s.log.Info("webhook reconfigured")
	}
	for _, s := range removed {
		if s.stopReplay != nil {
			s.stopReplay()
		}
		s.cutWorkers()
		s.cur.Load().transport.Close()
		d.journal.RemoveTarget(s)
		s.log.Info("webhook removed")
	}
	for _, s := range started {
		s.dead.start()
		if ctx != nil {
			s.startWorkers(ctx, d.finish)
		}
		if d.replayCtx != nil && d.replayCtx.Err() == nil {
			d.startReplay(d.replayCtx, s)
		}
	}
	return nil
}

// sinkChange is a sink a reload gives new settings.
type sinkChange struct {
	s  *Sink
	st *settings
}

// swapSinks makes sinks the current sinks: it builds the settings of those that changed and
// the new sinks, and returns them with the sinks removed and the context the sinks deliver
// under (nil: not delivering). If a sink cannot be built, nothing changes.
func (d *Dispatcher) swapSinks(sinks []config.SinkConfig) (changes []sinkChange, removed map[string]*Sink, started []*Sink, ctx context.Context, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := map[string]*Sink{}
	for _, s := range d.sinks {
		old[s.name] = s
	}
	defer func() {
		if err != nil {
			for _, c := range changes {
				c.st.transport.Close()
			}
			for _, s := range started {
				s.cur.Load().transport.Close()
			}
		}
	}()
	for _, cfg := range sinks {
		prev := old[cfg.Shared().Name]
		if prev == nil || prev.cur.Load().src.Same(cfg) {
			continue
		}
		st, err := newSettings(cfg, prev.log, d.fence(), d.transports)
		if err != nil {
			return changes, nil, nil, nil, err
		}
		changes = append(changes, sinkChange{prev, st})
	}
	var next []*Sink
	for _, cfg := range sinks {
		name := cfg.Shared().Name
		if prev := old[name]; prev != nil {
			next = append(next, prev)
			delete(old, name)
			continue
		}
		s, err := d.newSink(cfg)
		if err != nil {
			return changes, nil, started, nil, err
		}
		if d.leadership != nil && d.ctx == nil {
			s.spill() // following: it records, the leader delivers
		}
		next = append(next, s)
		started = append(started, s)
	}
	d.sinks = next
	return changes, old, started, d.ctx, nil
}

// Retire dead-letters what a removed sink had not delivered, with reason sink_removed: its
// queue, and with a store its whole outbox, which holds the queue and whatever did not fit.
// The journal calls it (journal.Options.Retired) once everything queued for the sink is committed. A replica that does
// not lead drops the outbox instead: the leader dead-letters its own.
func (d *Dispatcher) Retire(t journal.Target) {
	s := t.(*Sink)
	d.retiring.Add(1)
	go func() {
		defer d.retiring.Done()
		s.dead.start()
		if !d.journal.Durable() {
			s.deadLetterQueue(reasonRemoved)
		} else {
			s.queue.Drain() // every one of them is in the outbox
			following := d.leadership != nil && !d.leadership.Leading()
			_, _, err := d.journal.ReadOutbox(s.name, 0, 0, func(e journal.Entry) bool {
				if following {
					d.journal.Ack(s.name, e.Seq) // the leader dead-letters its own
				} else {
					s.dead.submit(Delivery{Entry: e}, reasonRemoved, errRemoved)
				}
				return true
			})
			if err != nil {
				s.log.Error("read the outbox of a removed webhook", "err", err)
			}
		}
		s.dead.close(d.abandon)
		d.journal.DropSink(s.name)
		if !slices.ContainsFunc(d.current(), func(o *Sink) bool { return o.name == s.name }) {
			d.m.removeSink(s.name)
		}
	}()
}

var errRemoved = errors.New("the webhook was removed from the configuration")
