package history

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// maxQueued bounds the bytes of events waiting to be written: past it, while the disk stalls,
// events are left out of the history (which says so: a gap) rather than held in memory. An
// initial list's are not counted: 100,000 listed configmaps are 210 MB of the cache's own.
const maxQueued = 32 << 20

// maxSpare bounds the queue kept for the next batch once written: a batch of a few seconds of
// changes, not an initial list's.
const maxSpare = 4096

// linger is how long the writer gathers events before writing them: what a read of the
// history may lag behind the cache.
const linger = 200 * time.Millisecond

// retainEvery is how often retention drops what the histories no longer keep.
const retainEvery = time.Minute

// Options are what a Recorder needs.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Path is the directory the histories are kept in, one directory each.
	Path string
	// Policy is the history configured for a resource; false (or a policy not Enabled) keeps
	// none.
	Policy func(schema.GroupVersionResource) (config.History, bool)
}

// Recorder writes the history of every resource configured with one, from the informers'
// events (it is a dynamicinformer.Subscriber and ListObserver), and opens each for reading.
type Recorder struct {
	o     Options
	codec *codec

	mu     sync.Mutex // the queue
	queue  []op
	spare  []op // the queue written last, emptied, for the next
	queued int64
	gaps   map[schema.GroupVersionResource]uint64 // the highest revision of an event dropped while the queue was full
	// enqueued counts what was handed over (queued or dropped), and written how much of it the
	// histories hold: see Barrier.
	enqueued uint64
	written  atomic.Uint64
	wake     chan struct{}
	now      chan struct{} // a reader waits (Sync): write at once

	logsMu sync.RWMutex
	logs   map[schema.GroupVersionResource]*Log
	// openMu serialises opening a history (by the writer, or by a read before the writer has
	// come to it): a log's files are opened once. closed is set, under it, once they are closed.
	openMu sync.Mutex
	closed bool
}

// op is an event, or a list's end (synced set): revision then says how far the list reached.
type op struct {
	event    object.Event
	synced   bool
	gvr      schema.GroupVersionResource
	revision uint64
}

// New returns a Recorder writing under o.Path. Nothing is opened until an event of a resource
// with a history arrives.
func New(o Options) (*Recorder, error) {
	c, err := newCodec()
	if err != nil {
		return nil, err
	}
	r := &Recorder{o: o, codec: c, gaps: map[schema.GroupVersionResource]uint64{}, wake: make(chan struct{}, 1), now: make(chan struct{}, 1),
		logs: map[schema.GroupVersionResource]*Log{}}
	if o.Registerer != nil {
		if err := o.Registerer.Register(collector{r}); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// OnEvent implements dynamicinformer.Subscriber: it queues e, or, past maxQueued, leaves it out
// and notes the gap.
func (r *Recorder) OnEvent(e object.Event) {
	if p, ok := r.o.Policy(e.Resource); !ok || !p.Enabled() || e.Moved {
		// An object that came or went with its namespace did not change: nothing to keep.
		return
	}
	n := int64(len(e.Object.JSON()))
	if e.InitialList {
		// An initial list's objects are the cache's own, just listed: queued, they hold no
		// more than it does, and the history needs each (a past list reads their states).
		n = 0
	}
	r.mu.Lock()
	r.enqueued++
	if r.queued+n > maxQueued {
		r.gaps[e.Resource] = max(r.gaps[e.Resource], e.Revision)
		r.mu.Unlock()
		return
	}
	r.queue = append(r.queue, op{event: e})
	r.queued += n
	r.mu.Unlock()
	r.signal()
}

// ListStarted implements dynamicinformer.ListObserver: the resource's history is opened now
// (reading its index back takes a while for a large one), in the background, so that /status
// reports it from the start, before its first change.
func (r *Recorder) ListStarted(gvr schema.GroupVersionResource, _ uint64, _ []string) {
	if p, ok := r.o.Policy(gvr); ok && p.Enabled() {
		go r.open(gvr, p)
	}
}

// ListSynced implements dynamicinformer.ListObserver: a history that does not reach the
// revision the list was taken at misses what changed meanwhile, and says so (a gap).
func (r *Recorder) ListSynced(gvr schema.GroupVersionResource, _ uint64, revision uint64) {
	if p, ok := r.o.Policy(gvr); !ok || !p.Enabled() {
		return
	}
	r.mu.Lock()
	r.enqueued++
	r.queue = append(r.queue, op{synced: true, gvr: gvr, revision: revision})
	r.mu.Unlock()
	r.signal()
}

func (r *Recorder) signal() { poke(r.wake) }

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Barrier is a mark of everything handed over so far: once Sync(mark) has returned, the
// histories hold it. Called within dynamicinformer.Resource.Read, whose snapshot holds exactly
// the changes handed over before it, it makes a snapshot and the histories agree.
func (r *Recorder) Barrier() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.enqueued
}

// Sync waits until the histories hold everything handed over before mark (see Barrier), or
// ctx ends.
func (r *Recorder) Sync(ctx context.Context, mark uint64) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for r.written.Load() < mark {
		poke(r.now)
		r.signal()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// Of is gvr's history, if it keeps one: opened if need be, so that a read just after a start,
// before any change or list's end of the resource was written, reads what the history holds.
func (r *Recorder) Of(gvr schema.GroupVersionResource) (*Log, bool) {
	p, ok := r.o.Policy(gvr)
	if !ok || !p.Enabled() {
		return nil, false
	}
	r.logsMu.RLock()
	l, ok := r.logs[gvr]
	r.logsMu.RUnlock()
	if ok {
		return l, true
	}
	l = r.open(gvr, p)
	return l, l != nil
}

// Stats are every open history's.
func (r *Recorder) Stats() []Stats {
	r.logsMu.RLock()
	defer r.logsMu.RUnlock()
	out := make([]Stats, 0, len(r.logs))
	for _, l := range r.logs {
		out = append(out, l.Stats())
	}
	return out
}

// Run writes what is queued until ctx ends, then what is left, and closes the histories.
func (r *Recorder) Run(ctx context.Context) error {
	retain := time.NewTicker(retainEvery)
	defer retain.Stop()
	sync := time.NewTicker(syncEvery)
	defer sync.Stop()
	for {
		select {
		case <-ctx.Done():
			r.write(time.Now())
			return r.close()
		case <-retain.C:
			r.retain(time.Now())
			continue
		case <-sync.C:
			r.sync()
			continue
		case <-r.wake:
		}
		select { // gather a little more, unless a reader waits
		case <-ctx.Done():
		case <-r.now:
		case <-time.After(linger):
		}
		r.write(time.Now())
	}
}

// write writes what is queued: each event as a change of its history, each list's end as a gap
// when the history did not reach it.
func (r *Recorder) write(now time.Time) {
	r.mu.Lock()
	ops, gaps, mark := r.queue, r.gaps, r.enqueued
	r.queue, r.spare, r.queued = r.spare, nil, 0
	if len(gaps) > 0 {
		r.gaps = map[schema.GroupVersionResource]uint64{}
	} else {
		gaps = nil // r.gaps stays, the queue's
	}
	r.mu.Unlock()
	defer r.written.Store(mark)
	defer func() {
		if cap(ops) > maxSpare {
			return // an initial list's: let it go
		}
		clear(ops) // the events' objects
		r.mu.Lock()
		r.spare = ops[:0]
		r.mu.Unlock()
	}()
	touched := map[*Log]bool{}
	opened := map[schema.GroupVersionResource]*Log{} // looked up once a batch: nil keeps none
	for _, o := range ops {
		gvr := o.gvr
		if !o.synced {
			gvr = o.event.Resource
		}
		l, ok := opened[gvr]
		if !ok {
			l = r.log(gvr)
			opened[gvr] = l
		}
		if l == nil {
			continue
		}
		touched[l] = true
		if o.synced {
			l.endList(o.revision, now)
			continue
		}
		l.record(o.event, now)
	}
	for gvr, rev := range gaps {
		if l := r.log(gvr); l != nil {
			l.lost.Add(1)
			l.add(record{kind: kindGap, rev: rev, cause: gapLost}, nil, now)
			touched[l] = true
		}
	}
	for l := range touched {
		l.write() // readable now; synced by the next tick (syncEvery)
	}
}

// sync syncs what each history wrote since the last tick.
func (r *Recorder) sync() {
	r.logsMu.RLock()
	logs := slices.Collect(maps.Values(r.logs))
	r.logsMu.RUnlock()
	for _, l := range logs { // outside the lock, which a reader opening a log takes: a sync may wait on the disk
		l.sync()
	}
}

// log is gvr's history, opened if need be; nil when it keeps none or cannot be opened.
func (r *Recorder) log(gvr schema.GroupVersionResource) *Log {
	p, ok := r.o.Policy(gvr)
	if !ok || !p.Enabled() {
		return nil
	}
	r.logsMu.RLock()
	l := r.logs[gvr]
	r.logsMu.RUnlock()
	if l != nil {
		l.mu.RLock()
		same := l.policy == p
		l.mu.RUnlock()
		if !same { // reloaded
			l.mu.Lock()
			l.policy = p
			l.mu.Unlock()
		}
		return l
	}
	return r.open(gvr, p)
}

// open opens gvr's history, unless it is open already or the Recorder is closed.
func (r *Recorder) open(gvr schema.GroupVersionResource, p config.History) *Log {
	r.openMu.Lock()
	defer r.openMu.Unlock()
	r.logsMu.RLock()
	l := r.logs[gvr]
	r.logsMu.RUnlock()
	if l != nil || r.closed {
		return l
	}
	l, err := open(filepath.Join(r.o.Path, object.ResourceName(gvr)), gvr, p, r.codec, r.o.Logger)
	if err != nil {
		r.o.Logger.Error("history: could not open; the resource's changes are not kept", "resource", object.ResourceName(gvr), "err", err)
		return nil
	}
	r.logsMu.Lock()
	r.logs[gvr] = l
	r.logsMu.Unlock()
	return l
}

// record writes e, a change of l's resource.
func (l *Log) record(e object.Event, now time.Time) {
	key := object.KeyOf(e.Object)
	rec := record{kind: kindOf(e.Type), rev: e.Revision, time: e.Observed.UnixNano(), key: key, uid: string(e.Object.GetUID()), managers: e.Managers, obj: e.Object.JSON()}
	if rec.time <= 0 {
		rec.time = now.UnixNano()
	}
	var prev []byte
	switch {
	case e.InitialList:
		// An object listed as the informer starts: kept when the history does not hold it
		// at this resourceVersion already, as what the list found.
		n, ok := l.newest(key)
		if ok && n.rev >= rec.rev {
			return // held already (a watch resumed from before what the history holds)
		}
		rec.kind, rec.flags = kindAdded, flagListed
		if ok && n.kind != kindDeleted {
			rec.kind = kindModified
		}
	case !e.InOrder:
		// A change a relist found: the changes before it were missed.
		rec.flags = flagListed
		defer l.add(record{kind: kindGap, rev: e.Revision, cause: gapRelisted}, nil, now)
	}
	if e.OldObject != nil {
		prev = e.OldObject.JSON()
	} else if e.Last != nil {
		prev = e.Last.JSON()
	}
	l.add(rec, prev, now)
}

// retain drops from each history what it no longer keeps.
func (r *Recorder) retain(now time.Time) {
	r.logsMu.RLock()
	defer r.logsMu.RUnlock()
	for _, l := range r.logs {
		l.flush()
		l.retain(now)
	}
}

func (r *Recorder) close() error {
	r.openMu.Lock()
	defer r.openMu.Unlock()
	r.closed = true
	r.logsMu.Lock()
	defer r.logsMu.Unlock()
	var err error
	for gvr, l := range r.logs {
		err = errors.Join(err, l.close())
		delete(r.logs, gvr)
	}
	return err
}
