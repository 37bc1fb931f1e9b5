package journal

import (
	"sync"
	"time"

	"github.com/dynwatch/dynwatch/object"
	"github.com/prometheus/client_golang/prometheus"
)

// opOverhead is about what an event costs the journal besides its objects' bytes: the
// operation, its place in a queue, the preselector's verdicts.
const opOverhead = 512

// heldBytes is what the journal counts an event as holding until it is committed: its
// object's bytes and its old object's (which the cache no longer holds once the object
// changed), and opOverhead.
func heldBytes(e object.Event) int64 {
	n := int64(opOverhead + len(e.Object.JSON()))
	if e.OldObject != nil {
		n += int64(len(e.OldObject.JSON()))
	}
	return n
}

// pressure bounds the bytes of events recorded and not yet committed (none when limit is 0):
// while they pass limit
// (a full disk fails every commit, a stalled fdatasync stops the writer, a costly filter
// slows the preselector), Room's channel stays open, and the informers stop reading their
// watches until it closes, once what is held is down to half the limit. Recording itself
// never blocks: what is in flight when the limit is passed (an event per watch, an initial
// list) is taken, and the bound holds to within it.
type pressure struct {
	limit int64
	m     *pressureMetrics

	mu    sync.Mutex
	held  int64
	full  chan struct{} // non-nil while backpressure is on: closed when it ends
	since time.Time     // when it began
	now   func() time.Time
}

// roomy is the channel Room returns while there is room: closed, so that a receive from it
// returns at once.
var roomy = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

type pressureMetrics struct {
	held, on prometheus.Gauge
	seconds  prometheus.Counter
}

func newPressureMetrics() *pressureMetrics {
	return &pressureMetrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynwatch_state_pending_bytes",
			Help: "Bytes of events recorded and not yet committed to the state store (objects and old objects, and a fixed cost each)."}),
		on: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynwatch_state_backpressure",
			Help: "1 while the events waiting to be committed pass state.maxPendingBytes and the informers stop reading their watches; 0 otherwise."}),
		seconds: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_backpressure_seconds_total",
			Help: "Time the informers have been held back by the state store, in seconds."}),
	}
}

func (m *pressureMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.held, m.on, m.seconds}
}

func newPressure(limit int64, now func() time.Time) *pressure {
	return &pressure{limit: limit, now: now, m: newPressureMetrics()}
}

// take counts n bytes recorded.
func (p *pressure) take(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held += n
	p.m.held.Set(float64(p.held))
	if p.limit > 0 && p.held > p.limit && p.full == nil {
		p.full, p.since = make(chan struct{}), p.now()
		p.m.on.Set(1)
	}
}

// give counts n bytes committed.
func (p *pressure) give(n int64) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held -= n
	p.m.held.Set(float64(p.held))
	if p.full != nil && p.held <= p.limit/2 {
		close(p.full)
		p.full = nil
		p.m.on.Set(0)
		p.m.seconds.Add(p.now().Sub(p.since).Seconds())
	}
}

// room is closed while there is room, and closes once there is again.
func (p *pressure) room() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.full != nil {
		return p.full
	}
	return roomy
}

// PressureStatus is what /status reports of the journal's backpressure.
type PressureStatus struct {
	// Backpressure is true while the informers are held back.
	Backpressure bool `json:"backpressure"`
	// Since is when it began; absent when it is off.
	Since *time.Time `json:"since,omitempty"`
	// PendingBytes are the bytes of events recorded and not yet committed; LimitBytes is
	// state.maxPendingBytes.
	PendingBytes int64 `json:"pendingBytes"`
	LimitBytes   int64 `json:"limitBytes"`
}

func (p *pressure) status() PressureStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PressureStatus{Backpressure: p.full != nil, PendingBytes: p.held, LimitBytes: p.limit}
	if p.full != nil {
		since := p.since
		s.Since = &since
	}
	return s
}

// Room returns a channel that is closed while the journal has room for more events, and
// closes once it has again: the informers wait on it before they read more of a watch or
// start a list (see dynamicinformer.Gate). OnEvent never blocks on it.
func (j *Journal) Room() <-chan struct{} { return j.pressure.room() }

// Pressure reports the journal's backpressure, for /status.
func (j *Journal) Pressure() PressureStatus { return j.pressure.status() }
