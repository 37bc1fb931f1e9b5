package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Sink delivers the events one configured sink (a webhook, a JetStream stream or a Kafka topic)
// selects. It lives as long as its name is configured: a reload that changes it swaps its
// settings and transport and restarts its workers, and keeps its queue, its outbox window, its
// dead letters and its metrics.
type Sink struct {
	name  string
	log   *slog.Logger
	j     *journal.Journal
	now   func() time.Time
	queue *Queue
	m     sinkMetrics
	dead  *deadLetters
	fence Fence
	cur   atomic.Pointer[settings]

	// win is the queue's window over the outbox, with a state store: when the queue is full,
	// later deliveries stay in the outbox only (spilled) and are read back in order, from
	// sequence next on, as the queue empties. last is the highest sequence queued.
	win struct {
		sync.Mutex
		spilled    bool
		next, last uint64
	}

	// filterLog lets through at most one log line a second of the filter's errors, accessLog
	// of the access reviews'.
	filterLog, accessLog rate.Sometimes
	// access decides, for a sink with a subject, what the subject may watch.
	access Access

	run     sync.Mutex         // guards cancel, cut and workers
	cancel  context.CancelFunc // stops the workers taking deliveries
	cut     context.CancelFunc // cuts their requests under way
	workers sync.WaitGroup

	stopReplay context.CancelFunc // ends its initialState replay; guarded by the Dispatcher's life
}

// settings is what a sink's configuration decides, replaced whole when it changes.
type settings struct {
	src       config.SinkConfig
	cfg       *config.Sink
	transport Transport
	// gone, once set, is the answer by which the destination asked dynwatch to stop (Gone):
	// nothing more is sent under these settings, and every delivery is dead-lettered. New
	// settings (a changed configuration) send again.
	gone atomic.Pointer[disabled]
	// durable is the destination's durability as last checked (DurabilityChecker), nil before
	// the first check or for a transport that has none.
	durable atomic.Pointer[Durability]
}

// disabled is why and since when a sink sends nothing.
type disabled struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

func newSettings(cfg config.SinkConfig, log *slog.Logger, f Fence, transports Transports) (*settings, error) {
	st := &settings{src: cfg, cfg: cfg.Shared()}
	var err error
	if st.transport, err = transports(cfg, log, f); err != nil {
		return nil, err
	}
	return st, nil
}

// newSink builds the sink cfg configures; its dead letters name cluster.
func newSink(cfg config.SinkConfig, log *slog.Logger, j *journal.Journal, now func() time.Time, m *metrics, f Fence, transports Transports, cluster string) (*Sink, error) {
	name := cfg.Shared().Name
	log = log.With("sink", name)
	st, err := newSettings(cfg, log, f, transports)
	if err != nil {
		return nil, err
	}
	s := &Sink{name: name, log: log, j: j, now: now, queue: NewQueue(st.cfg.QueueSize), fence: f,
		filterLog: rate.Sometimes{Interval: time.Second}, accessLog: rate.Sometimes{Interval: time.Second}}
	_, webhook := cfg.(*config.Webhook)
	s.m = m.forSink(s.name, s.queue, webhook)
	s.cur.Store(st)
	s.dead = newDeadLetters(s.name, cluster, s.log, s.m, j, cfg)
	return s, nil
}

func (s *Sink) cfg() *config.Sink { return s.cur.Load().cfg }

// Name implements journal.Target.
func (s *Sink) Name() string { return s.name }

// InitialState implements journal.Target: the webhook's initialState.
func (s *Sink) InitialState() bool { return s.cfg().InitialState }

// Queue implements journal.Target: it queues e. Without a state store (e.Seq 0) a full queue
// dead-letters it. With one, e is already in the outbox: when the queue is full, or the
// replica is not the leader, it stays there only, and so does every later entry, until refill
// reads them back in order.
func (s *Sink) Queue(e journal.Entry) {
	d := Delivery{Entry: e}
	if d.Seq == 0 {
		if err := s.queue.Push(d); err != nil {
			s.dead.submit(d, reasonQueueFull, err)
			return
		}
		s.m.enqueued.Inc()
		return
	}
	s.win.Lock()
	defer s.win.Unlock()
	if d.Seq <= s.win.last || s.win.spilled {
		return // already read back from the outbox, or to be
	}
	if s.queue.Push(d) != nil {
		s.win.spilled, s.win.next = true, d.Seq
		return
	}
	s.win.last = d.Seq
	s.m.enqueued.Inc()
}

// spill marks the whole outbox as not yet queued: the restore at start, and while the replica
// does not lead.
func (s *Sink) spill() {
	s.win.Lock()
	s.win.spilled, s.win.next = true, 0
	s.win.Unlock()
}

// refill reads spilled outbox entries back into the queue, oldest first, once the queue has
// room for half its capacity (or at once when force is set).
func (s *Sink) refill(force bool) {
	s.win.Lock()
	defer s.win.Unlock()
	if !s.win.spilled {
		return
	}
	room := s.queue.Room()
	if room == 0 || !force && room < s.cfg().QueueSize/2 {
		return
	}
	next, end, err := s.j.ReadOutbox(s.name, s.win.next, room, func(e journal.Entry) bool {
		if s.queue.Push(Delivery{Entry: e}) != nil { // the capacity shrank under us: read it again later
			return false
		}
		s.win.last = e.Seq
		s.m.enqueued.Inc()
		return true
	})
	s.win.next, s.win.spilled = next, !end // after an error, what was read stays read
	if err != nil {
		s.log.Error("read the outbox back into the queue", "err", err)
	}
}

// startWorkers starts the workers: they take deliveries until ctx ends or they are stopped.
// A request under way then finishes and its answer is recorded, unless finish ends first
// (half way to the shutdown deadline), the fence lapses, or cutWorkers stopped them: a stop
// does not repeat what the destination has acknowledged.
func (s *Sink) startWorkers(ctx, finish context.Context) {
	s.run.Lock()
	defer s.run.Unlock()
	ctx, s.cancel = context.WithCancel(ctx)
	finish, s.cut = context.WithCancel(finish)
	st := s.cur.Load()
	for range st.cfg.Workers {
		s.workers.Go(func() { s.work(ctx, finish) })
	}
	if c, ok := st.transport.(DurabilityChecker); ok {
		if want := durabilityOf(st.src); want != nil {
			s.workers.Go(func() { s.watchDurability(ctx, st, c, want) })
		}
	}
}

// stopWorkers stops the workers once their requests under way have finished (see
// startWorkers); a request cut short goes back to the head of the queue.
func (s *Sink) stopWorkers() { s.halt(false) }

// cutWorkers stops the workers at once: their requests under way are cut short and go back
// to the head of the queue, to be sent again. A reload does not wait on a hanging destination.
func (s *Sink) cutWorkers() { s.halt(true) }

func (s *Sink) halt(cut bool) {
	s.run.Lock()
	defer s.run.Unlock()
	if s.cancel == nil {
		return
	}
	s.cancel()
	if cut {
		s.cut()
	}
	s.workers.Wait()
	s.cut()
}

// reconfigure puts new settings of the same webhook into effect: the workers stop (a request
// under way is cut, and sent again under the new settings), the settings are swapped, and the
// workers start again under ctx (nil: not running) and finish.
func (s *Sink) reconfigure(ctx, finish context.Context, st *settings) {
	s.cutWorkers()
	old := s.cur.Swap(st)
	old.transport.Close()
	s.m.disabled.Set(0)
	s.m.durable.DeletePartialMatch(prometheus.Labels{}) // the sink's, as the new settings check it again
	s.queue.SetCapacity(st.cfg.QueueSize)
	s.dead.setTarget(st.src)
	if ctx != nil {
		s.startWorkers(ctx, finish)
		s.refill(false)
	}
}

// deadLetterQueue dead-letters every delivery left in the queue with reason: without a store,
// there is nowhere else for them to go.
func (s *Sink) deadLetterQueue(reason string) {
	left := s.queue.Drain()
	for _, d := range left {
		s.dead.submit(d, reason, errors.New("dynwatch stopped delivering to this sink"))
	}
	if len(left) > 0 {
		s.log.Warn("undelivered events dead-lettered", "events", len(left), "reason", reason)
	}
}

// work delivers until ctx ends; a request under way then runs on until finish ends. A failed
// attempt that may be retried goes back to the queue with the time of its next attempt, so the
// worker moves on to other objects. Under leader election a request is made only while the
// fence holds, and is cut short when it lapses.
func (s *Sink) work(ctx, finish context.Context) {
	for {
		d, err := s.queue.Pop(ctx)
		if err != nil {
			return
		}
		sendCtx, cancel, held := s.fence.Bound(finish)
		if !held {
			// The lease may have passed to another replica: deliver nothing until it is renewed.
			cancel()
			s.queue.Return(d)
			s.fence.Wait(ctx)
			continue
		}
		cut := s.deliver(sendCtx, &d)
		cancel()
		if cut {
			s.queue.Return(d) // cut (a stop, a reload), or the lease lapsed: delivered later, here or by the next leader
			if ctx.Err() != nil {
				return
			}
			continue
		}
		s.refill(false)
	}
}

// deliver makes d, fails it for good (dead letter) or queues it to retry. It reports whether
// ctx cut it short, in which case d is still to be made and the caller returns it to the queue.
func (s *Sink) deliver(ctx context.Context, d *Delivery) (cut bool) {
	if d.FilterError != "" && s.cfg().FilterErrors != config.FilterErrorsDeliver {
		// Recorded under deadLetter (or drop, since a reload): the filter decided nothing.
		s.dead.submit(*d, reasonFilterError, errors.New(d.FilterError))
		s.queue.Done(*d)
		return false
	}
	if !d.Deadline.IsZero() && s.now().After(d.Deadline) {
		s.dead.submit(*d, reasonRetriesExhausted, errors.New("the retry deadline passed while dynwatch was stopped"))
		s.queue.Done(*d)
		return false
	}
	// Every deletion acknowledged and never sent, for the test that shows validate.Converged
	// failing on a broken build (a failpoint: see test/runner.BuildWithFailpoints).
	// gofail: var dropDeletions struct{}
	// if d.Event.Type == "DELETED" { s.j.Ack(s.name, d.Seq); s.queue.Done(*d); return false }
	st := s.cur.Load()
	if g := st.gone.Load(); g != nil {
		s.dead.submit(*d, reasonGone, errors.New("the sink is disabled: "+g.Reason))
		s.queue.Done(*d)
		return false
	}
	err := s.authorize(st.cfg, d)
	if err == nil {
		err = s.attempt(ctx, st, d)
	}
	switch {
	case errors.Is(err, errWithheld):
		// Selected before its subject's decision was known, or revoked since: never sent.
		s.m.withheld.Inc()
		s.j.Ack(s.name, d.Seq)
		s.queue.Done(*d)
	case err == nil:
		s.m.delivered.Inc()
		s.m.age.Observe(s.now().Sub(d.Event.Observed).Seconds())
		s.j.Ack(s.name, d.Seq)
		s.queue.Done(*d)
	case errors.Is(err, ErrSuperseded):
		// The sink holds a newer version of the object: sending this one would put it after.
		s.log.Debug("delivery superseded", "id", d.ID, "err", err)
		s.m.superseded.Inc()
		s.j.Ack(s.name, d.Seq)
		s.queue.Done(*d)
	case ctx.Err() != nil || s.fence.Lapsed():
		return true // stopped, or no longer certainly the leader: not a failed attempt
	case IsGone(err):
		if st.gone.CompareAndSwap(nil, &disabled{Reason: err.Error(), Since: s.now().UTC()}) {
			s.m.disabled.Set(1)
			s.log.Warn("the destination answered 410 Gone: the sink is disabled, and its events are dead-lettered until its configuration changes", "err", err)
		}
		s.dead.submit(*d, reasonGone, err)
		s.queue.Done(*d)
	case IsRejected(err):
		s.dead.submit(*d, reasonRejected, err)
		s.queue.Done(*d)
	default:
		firstFailure := d.Deadline.IsZero()
		at, ok := nextAttempt(d, err, st.cfg.Retry, s.now())
		if !ok {
			s.dead.submit(*d, reasonRetriesExhausted, err)
			s.queue.Done(*d)
			break
		}
		if firstFailure {
			// Retrying has begun: neither a reload nor a restart gives it a new budget.
			s.j.SetDeadline(s.name, d.Seq, d.Deadline)
		}
		s.log.Debug("delivery failed, retrying", "id", d.ID, "err", err, "at", at)
		// A retry out of its object's turn, for the test that shows validate.InOrder failing
		// on a broken build (a failpoint: see test/runner.BuildWithFailpoints).
		// gofail: var retryOutOfTurn struct{}
		// s.queue.Done(*d); d.Key += "/out of turn"; _ = s.queue.Push(*d); return false
		s.queue.Retry(*d, at)
	}
	return false
}

// errWithheld is a delivery whose sink's subject may not watch its object.
var errWithheld = errors.New("the subscription's subject may not watch the object")

// authorize returns errWithheld when cfg has a subject that may not watch d's object (a sink's
// subject is asked about each event it sends, as it is sent: a grant revoked while events wait
// stops them too), and an error, retried as a failed attempt is, when that could not be
// decided: failing open would leak, and withholding would lose what the subject may watch.
func (s *Sink) authorize(cfg *config.Sink, d *Delivery) error {
	if cfg.Subject == nil {
		return nil
	}
	if s.access == nil {
		return errWithheld
	}
	ok, err := s.access.Allowed(cfg.Subject, d.Event.Resource, d.Event.Object.GetNamespace())
	switch {
	case err != nil:
		s.accessLog.Do(func() {
			s.log.Warn("could not tell whether the subscription's subject may watch an event's object; it is tried again later", "resource", object.ResourceName(d.Event.Resource),
				"namespace", d.Event.Object.GetNamespace(), "name", d.Event.Object.GetName(), "err", err)
		})
		return fmt.Errorf("review the subject's access: %w", err)
	case !ok:
		return errWithheld
	}
	return nil
}

// attempt makes one attempt to hand d to the sink. It returns nil once the destination has
// acknowledged it, a rejectedError when retrying cannot help, or a retriable error.
func (s *Sink) attempt(ctx context.Context, st *settings, d *Delivery) error {
	var body []byte // nil: the transport builds it from d
	var err error
	if d.Body != nil || st.cfg.Payload.Diff != config.DiffNone {
		raw := d.Body
		if raw == nil {
			raw = journal.AppendBody(nil, d.Entry)
		}
		if body, err = shape(raw, st.cfg.Payload); err != nil {
			return &rejectedError{err} // the recorded body is damaged: no attempt can send it
		}
	}
	if err := st.refuseUndurable(); err != nil {
		d.Attempts++
		return err // no attempt is made, and none counted
	}
	if l := st.cfg.Limiter; l != nil {
		if err := l.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err() // stopped while waiting its turn: not an attempt
			}
			return err
		}
	}
	d.Attempts++
	// Each retry under an id of its own, for the test that shows validate.StableIDs failing
	// on a broken build (a failpoint: see test/runner.BuildWithFailpoints).
	// gofail: var newIDOnRetry struct{}
	// if d.Attempts > 1 { d.ID += "+" }
	s.m.attempts.Inc()
	if d.Attempts > 1 {
		s.m.retries.Inc()
	}
	start := time.Now()
	d.Answer = ""
	err = st.transport.Send(ctx, d, body)
	s.m.requestDuration.Observe(time.Since(start).Seconds())
	answer := d.Answer
	switch {
	case answer != "" || ctx.Err() != nil:
	case errors.Is(err, context.DeadlineExceeded):
		answer = AnswerTimeout
	case err != nil:
		answer = AnswerError
	default:
		answer = AnswerAck
	}
	if answer != "" && ctx.Err() == nil { // an attempt cut short (a stop, a reload) got no answer to count
		s.m.answered(answer)
	}
	return err
}
