package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
)

// Journal is the one path from the informers to the sinks' queues. Record only appends to
// it; its goroutine takes everything pending at once and, in one store transaction (a group
// commit), compares each event with the stored state of its object, filters it for every
// sink, writes the outbox entries and the object's new state, and only after the commit
// queues the deliveries. So an event is queued only once it is durable, and the state of an
// object never runs ahead of the outbox: what a crash cuts short before a commit is derived
// again by the next start's comparison. A commit that fails (a full disk) queues nothing: its
// operations wait, and are committed again, until one succeeds. An operation that fails on its
// own (a corrupt entry) is counted and skipped; the rest of its batch commits. Without a store
// it only filters and queues.
type Journal struct {
	store   *store // nil: memory only
	log     *slog.Logger
	now     func() time.Time
	targets func() []Target
	m       *metrics
	retired func(Target)
	pre     *preselector // nil: the writer filters
	bound   func(schema.GroupVersionResource) (uint64, bool)

	mu      sync.Mutex
	pending []op
	wake    chan struct{}          // something is pending that should commit now
	lazy    chan struct{}          // an acknowledgement is pending: it may wait up to ackDelay
	failure atomic.Pointer[string] // the last commit's error, nil once one succeeds

	// Owned by the goroutine that flushes.
	seq   uint64
	lists map[schema.GroupVersionResource]*listing
	floor Checkpoints            // the checkpoints Trim was given: what they cover is not recorded
	sinks map[string]*sinkReplay // every target seen, by name: where its initialState replay stands
	first bool                   // no batch has been applied yet
	// listsCoverAll: the initial lists hand the first batch's targets every object as ADDED
	// (no store, a new one, or one without sink records), so none of them replays.
	listsCoverAll bool

	// What is committed, read by Checkpoints and OutboxLen.
	idx      sync.Mutex
	outbox   map[string]map[uint64]indexed // sink → sequence → entry
	progress map[schema.GroupVersionResource]*progress
	seen     map[string]sinkView // the sinks' replay states as committed
}

// Target is a sink as the journal sees it.
type Target interface {
	// Name is the sink's name; its outbox is kept under it.
	Name() string
	// Selects reports whether the sink's filters select the event and, when its filter could
	// not decide, why: such an event is recorded (selected) with that error for the sink to
	// act on, or left out (not selected), as the sink chooses.
	Selects(dynamicinformer.Event) (bool, error)
	// Queue is handed each entry recorded for the sink once it is committed, in order, from
	// the journal's goroutine; it must not block.
	Queue(Entry)
	// InitialState reports whether the sink, when the journal first sees it, is to be handed
	// every current object as ADDED (see ReplayPage).
	InitialState() bool
}

// Options are a Journal's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Path is the state store's file, opened (or created) by New and closed by Close; empty
	// keeps nothing: no outbox, no comparison after a restart.
	Path string
	Now  func() time.Time
	// Targets are the sinks, in configuration order; called from the journal's goroutine.
	Targets func() []Target
	// Retired is called, after the commit, for each target RemoveTarget removed.
	Retired func(Target)
	// Workers evaluate the targets' filters for events seen on a watch, off
	// the writer and in parallel across objects (each object's events in order); 0 leaves it
	// to the writer. Targets' Selects must then be safe to call from several goroutines.
	Workers int
	// Bound, when set, caps a resource's checkpoints: the revision through which the changes
	// the resource's informers make on their own (a namespaceSelector's namespaces joining and
	// leaving) have been handed to the journal; false for a resource without any. It is called
	// before the outboxes are read.
	Bound func(schema.GroupVersionResource) (uint64, bool)
}

type opKind int

const (
	opEvent opKind = iota
	opListStarted
	opListSynced
	opAck        // a delivery is finished: remove its outbox entry
	opDeadline   // a delivery's retry deadline is set: keep it across restarts
	opDropSink   // a sink's outbox is empty and the sink gone: remove the outbox
	opRemoveSink // a sink is removed: hand it to retired once what was queued for it is committed
	opTrim       // checkpoints: remove the outbox entries they acknowledge
	opReplay     // a page of current objects for one target's initialState
	opReplayStatus
)

type op struct {
	kind     opKind
	event    dynamicinformer.Event
	gvr      schema.GroupVersionResource
	run      uint64
	sink     string
	seq      uint64
	deadline time.Time
	target   Target                    // opRemoveSink
	streams  []string                  // opListStarted
	revision uint64                    // opListSynced
	cp       Checkpoints               // opTrim
	pre      *preselected              // opEvent: what the preselector computed; nil for the writer to
	objects  []*dynamicinformer.Object // opReplay
	complete bool                      // opReplay: the resource's last page
	replayed chan<- int                // opReplay: how many entries, once committed
	status   chan<- ReplayStatus       // opReplayStatus
}

// listing is a resource's initial list being compared with the stored state.
type listing struct {
	run   uint64
	fresh bool                // nothing was stored for the resource
	seen  map[string]struct{} // keys listed so far
	count struct{ unchanged, modified, added, deleted int }
}

// queued is an entry to queue once its transaction has committed.
type queued struct {
	target Target
	e      Entry
}

// batch is what one transaction produced, put into effect only once it commits.
type batch struct {
	out      []queued
	added    []added
	removed  []removed
	progress []step
	finished []schema.GroupVersionResource
	retired  []Target
	sinks    bool     // a replay state changed
	replies  []func() // answers to send once committed
}

type added struct {
	sink string
	seq  uint64
	x    indexed
}

type removed struct {
	sink string
	seq  uint64
}

// New opens the state store at o.Path (none when it is empty), reads the index of its
// outboxes, and registers the journal's metrics. Nothing is recorded until Run; Close closes
// the store.
func New(o Options) (*Journal, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	st, err := open(o.Logger, o.Path)
	if err != nil {
		return nil, err
	}
	j := &Journal{store: st, log: o.Logger, now: o.Now, targets: o.Targets, retired: o.Retired, bound: o.Bound, m: newMetrics(st),
		wake: make(chan struct{}, 1), lazy: make(chan struct{}, 1), lists: map[schema.GroupVersionResource]*listing{}, floor: Checkpoints{},
		outbox: map[string]map[uint64]indexed{}, progress: map[schema.GroupVersionResource]*progress{},
		sinks: map[string]*sinkReplay{}, first: true, listsCoverAll: st == nil || st.Fresh || st.NoSinkRecords}
	if st != nil {
		j.seq = st.lastSequence()
		idx, err := st.outboxIndex()
		if err != nil {
			_ = st.close()
			return nil, fmt.Errorf("state: read the outboxes: %w", err)
		}
		j.outbox = idx
	}
	if err := o.Registerer.Register(j.m); err != nil {
		_ = j.Close()
		return nil, err
	}
	if o.Workers > 0 {
		j.pre = newPreselector(j, o.Workers)
	}
	return j, nil
}

// open opens the state store at path, logging what an operator should know of its state, or
// returns nil when path is empty.
func open(log *slog.Logger, path string) (*store, error) {
	if path == "" {
		log.Warn("state.path is not set: events queued at shutdown are dead-lettered, and a restart delivers every object as ADDED again")
		return nil, nil
	}
	st, err := openStore(path)
	if err != nil {
		return nil, err
	}
	if st.Damaged != "" {
		log.Error("state store damaged: set aside, and every object is delivered again as ADDED with its usual event id", "path", path, "setAside", st.Damaged, "err", st.DamageErr)
	} else if st.Fresh {
		log.Warn("state store created: with no earlier state, every object is delivered as ADDED (expected on a first start; otherwise the state was lost)", "path", path)
	}
	return st, nil
}

// Durable reports whether the journal keeps a state store: without one nothing outlives the
// process, and there are no outboxes to read back.
func (j *Journal) Durable() bool { return j.store != nil }

// Close stops the preselector's workers and closes the state store, if there is one. Call it
// once Run has returned and nothing reads the outboxes any more.
func (j *Journal) Close() error {
	if j.pre != nil {
		j.pre.stop()
	}
	if j.store == nil {
		return nil
	}
	return j.store.close()
}

// outboxPageSize is how many entries ReadOutbox reads in one transaction.
const outboxPageSize = 1000

// ReadOutbox reads sink's outbox in order from sequence from, calling fn with each entry until
// fn returns false, limit entries were read (no limit when limit <= 0), or the outbox ends. An
// entry read back carries its object's identity only; its Body is the whole request. Entries
// that do not decode are counted and acknowledged, and skipped. It returns the sequence to read
// from next (that of the entry fn refused, if it refused one) and whether the outbox ended.
// It is the one way anything reads an outbox back: a sink's window, the restore at start and
// the retirement of a removed sink.
func (j *Journal) ReadOutbox(sink string, from uint64, limit int, fn func(Entry) bool) (next uint64, end bool, err error) {
	if j.store == nil {
		return from, true, nil
	}
	for read := 0; limit <= 0 || read < limit; {
		n := outboxPageSize
		if limit > 0 {
			n = min(n, limit-read)
		}
		p, err := j.store.page(sink, from, n)
		if err != nil {
			return from, false, err
		}
		for _, seq := range p.Corrupt {
			j.Corrupt(sink, seq)
		}
		for _, e := range p.Entries {
			if !fn(e) {
				return e.Seq, false, nil
			}
			read++
		}
		from = p.Next
		if p.End {
			return from, true, nil
		}
	}
	return from, false, nil
}

// Sinks lists the sinks that have an outbox in the state store.
func (j *Journal) Sinks() ([]string, error) {
	if j.store == nil {
		return nil, nil
	}
	return j.store.sinks()
}

// Record hands an informer's event to the journal. It never blocks. With workers, an event
// other than an initial list's is filtered by them first; an initial list's, mostly unchanged
// objects after a restart, goes straight to the writer, which filters only what changed.
func (j *Journal) Record(e dynamicinformer.Event) {
	if j.pre != nil && !e.InitialList {
		j.pre.add(op{kind: opEvent, event: e})
		return
	}
	j.submit(op{kind: opEvent, event: e})
}

// ListStarted implements dynamicinformer.ListObserver. With workers, it first waits until what
// they hold is committed: the list's comparison starts after every earlier event.
func (j *Journal) ListStarted(gvr schema.GroupVersionResource, run uint64, streams []string) {
	if j.pre != nil {
		j.pre.drain()
	}
	j.submit(op{kind: opListStarted, gvr: gvr, run: run, streams: streams})
}

// ListSynced implements dynamicinformer.ListObserver. With workers, it first waits until what
// they hold is committed, as ListStarted does.
func (j *Journal) ListSynced(gvr schema.GroupVersionResource, run uint64, revision uint64) {
	if j.pre != nil {
		j.pre.drain()
	}
	j.submit(op{kind: opListSynced, gvr: gvr, run: run, revision: revision})
}

// SetDeadline keeps an entry's retry deadline across restarts.
func (j *Journal) SetDeadline(sink string, seq uint64, deadline time.Time) {
	if seq != 0 {
		j.submit(op{kind: opDeadline, sink: sink, seq: seq, deadline: deadline})
	}
}

// Corrupt counts an outbox entry that does not decode, and removes it.
func (j *Journal) Corrupt(sink string, seq uint64) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt outbox entry removed", "sink", sink, "seq", seq)
	j.Ack(sink, seq)
}

// DropSink removes a sink's outbox if it is empty.
func (j *Journal) DropSink(sink string) { j.submit(op{kind: opDropSink, sink: sink}) }

// RemoveTarget hands t to Retired once everything recorded for it so far is committed.
func (j *Journal) RemoveTarget(t Target) { j.submit(op{kind: opRemoveSink, target: t}) }

// Trim removes, from every outbox, the entries cp acknowledges, and until the next Trim does
// not record what it covers. cp is the journal's from then on.
func (j *Journal) Trim(cp Checkpoints) { j.submit(op{kind: opTrim, cp: cp}) }

// OutboxLen counts a sink's outbox entries.
func (j *Journal) OutboxLen(sink string) int {
	j.idx.Lock()
	defer j.idx.Unlock()
	return len(j.outbox[sink])
}

func (j *Journal) submit(o op) {
	j.mu.Lock()
	j.pending = append(j.pending, o)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// ackDelay bounds how long an acknowledgement waits for a transaction. Acknowledgements do
// not start transactions of their own: they go with the next one that events start, and only
// when none has started for this long with one of their own. Under a steady stream of events
// that removes a transaction (two fsyncs) per delivery; an acknowledgement lost in a crash is a
// delivery repeated with the same id, never one lost.
const ackDelay = time.Second

// Ack removes an outbox entry: its delivery is finished (made or dead-lettered).
func (j *Journal) Ack(sink string, seq uint64) {
	if seq == 0 {
		return
	}
	j.mu.Lock()
	j.pending = append(j.pending, op{kind: opAck, sink: sink, seq: seq})
	j.mu.Unlock()
	select {
	case j.lazy <- struct{}{}:
	default:
	}
}

// Healthy reports the last commit's failure, if the last commit failed.
func (j *Journal) Healthy() error {
	if msg := j.failure.Load(); msg != nil {
		return errors.New(*msg)
	}
	return nil
}

// Run flushes whenever something is pending that should commit now, and acknowledgements
// within ackDelay, until ctx ends; then it flushes once more. Every releaseEvery it drops the
// store's pages from resident memory. After a failed commit it tries
// again with exponential backoff, from 100ms to 5s, not on every event.
func (j *Journal) Run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	acks := time.NewTimer(time.Hour)
	acks.Stop()
	acksArmed := false
	var release <-chan time.Time
	if j.store != nil {
		t := time.NewTicker(releaseEvery)
		defer t.Stop()
		release = t.C
	}
	delay := time.Duration(0)
	for {
		select {
		case <-release:
			if err := j.store.release(); err != nil {
				j.log.Warn("state store: could not drop its pages from resident memory", "err", err)
			}
			continue
		case <-j.wake:
			if delay > 0 {
				continue // failing: the timer decides when to try again
			}
		case <-j.lazy:
			if !acksArmed {
				acks.Reset(ackDelay)
				acksArmed = true
			}
			continue
		case <-acks.C:
			acksArmed = false
			if delay > 0 {
				continue
			}
		case <-retry.C:
		case <-ctx.Done():
			j.finish()
			return
		}
		if err := j.Flush(); err != nil {
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			retry.Reset(delay)
		} else {
			delay = 0
		}
	}
}

// finish commits what is pending and what the workers still evaluate, until a commit fails.
func (j *Journal) finish() {
	for j.Flush() == nil && j.pre != nil && !j.pre.empty() {
		select {
		case <-j.wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// releaseEvery is how often the store's pages are dropped from resident memory: what counts as
// resident of the file is what one interval's reads and writes touched. Each drop costs a
// page fault at the next touch of every page in use: dropped every second, the faults took
// 15% of dynwatch's CPU in the storm of `make bench`; every 30 seconds they are noise.
const releaseEvery = 30 * time.Second

// maxBatch bounds the operations of one transaction. A transaction holds every page it
// changes in memory until it commits: an initial list of 20,000 objects committed at once took
// the process's resident memory from 275 MB to 799 MB, where batches of this size keep it at
// the level of the cache.
const maxBatch = 256

// Flush applies everything pending, in transactions of up to maxBatch operations, and queues
// each transaction's entries once it commits. If a commit fails, nothing of it is queued and its
// operations wait for the next try, ahead of any that arrive meanwhile.
func (j *Journal) Flush() error {
	for {
		j.mu.Lock()
		n := len(j.pending)
		j.mu.Unlock()
		if n == 0 {
			return nil
		}
		if err := j.flushBatch(); err != nil {
			return err
		}
	}
}

// flushBatch applies up to maxBatch pending operations in one transaction.
func (j *Journal) flushBatch() error {
	j.mu.Lock()
	ops := j.pending[:min(len(j.pending), maxBatch)]
	j.pending = j.pending[len(ops):]
	j.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	seq, sinks, first := j.seq, j.sinks, j.first
	var b batch
	apply := func(tx *bolt.Tx) error {
		j.seq, j.sinks, j.first = seq, cloneSinks(sinks), first
		b = batch{}
		targets := j.targets()
		if err := j.see(tx, targets, &b); err != nil {
			return fmt.Errorf("note the sinks: %w", err)
		}
		for _, o := range ops {
			if err := j.apply(tx, targets, o, &b); err != nil {
				j.m.writeErrors.Inc()
				j.log.Error("state store operation failed: it is skipped, the rest of its batch commits", "op", o.String(), "err", err)
				if o.kind == opEvent && tx != nil {
					// Forget the object's state, so that the next start derives it again from the cache.
					if bk := tx.Bucket(objectsBucket).Bucket(resourceBucket(o.event.Resource)); bk != nil {
						_ = bk.Delete([]byte(object.KeyOf(o.event.Object)))
					}
				}
			}
		}
		return nil
	}
	if j.store == nil {
		_ = apply(nil)
	} else if err := j.store.db.Update(apply); err != nil {
		j.seq, j.sinks, j.first = seq, sinks, first
		j.m.commitErrors.Inc()
		msg := fmt.Sprintf("state store %s: commit failed: %v", j.store.Path, err)
		if j.failure.Swap(&msg) == nil {
			j.log.Error("state store commit failed: nothing more is delivered until a commit succeeds", "path", j.store.Path, "err", err)
		}
		j.mu.Lock()
		j.pending = append(ops, j.pending...)
		j.mu.Unlock()
		return err
	} else {
		j.m.commits.Inc()
		if j.failure.Swap(nil) != nil {
			j.log.Info("state store commits again", "path", j.store.Path)
		}
	}
	j.committed(&b)
	if b.sinks {
		j.publishSinks()
	}
	if j.pre != nil {
		for _, o := range ops {
			if o.pre != nil {
				j.pre.committed(o)
			}
		}
	}
	for _, gvr := range b.finished {
		delete(j.lists, gvr)
	}
	for _, q := range b.out {
		q.target.Queue(q.e)
	}
	for _, t := range b.retired {
		j.retired(t)
	}
	for _, reply := range b.replies {
		reply()
	}
	return nil
}

func (o op) String() string {
	switch o.kind {
	case opEvent:
		return fmt.Sprintf("%s %s %s", o.event.Type, object.ResourceName(o.event.Resource), object.KeyOf(o.event.Object))
	case opListStarted, opListSynced:
		return "list " + object.ResourceName(o.gvr)
	case opTrim:
		return "trim to checkpoints"
	case opReplay, opReplayStatus:
		return fmt.Sprintf("initialState of %s: %s", o.target.Name(), object.ResourceName(o.gvr))
	default:
		return fmt.Sprintf("outbox %s entry %d", o.sink, o.seq)
	}
}

// apply applies one operation within tx (nil without a store).
func (j *Journal) apply(tx *bolt.Tx, targets []Target, o op, b *batch) error {
	if tx == nil && (o.kind == opAck || o.kind == opDeadline || o.kind == opDropSink || o.kind == opTrim) {
		return nil // without a store there is no outbox
	}
	var err error
	switch o.kind {
	case opEvent:
		err = j.applyEvent(tx, targets, o.event, o.pre, b)
		b.advance(o.event)
	case opListStarted:
		j.listStarted(tx, o.gvr, o.run)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, streams: o.streams})
	case opListSynced:
		err = j.listSynced(tx, targets, o.gvr, o.run, o.revision, b)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, synced: true})
	case opAck:
		err = j.applyAck(tx, o.sink, o.seq, b)
	case opTrim:
		err = j.trim(tx, o.cp, b)
	case opDeadline:
		if bk := tx.Bucket(outboxBucket).Bucket([]byte(o.sink)); bk != nil {
			if v := bk.Get(sequenceKey(o.seq)); v != nil {
				err = bk.Put(sequenceKey(o.seq), setEntryDeadline(v, o.deadline))
			}
		}
	case opDropSink:
		// Only empty: a webhook added again under the name may already have entries.
		if bk := tx.Bucket(outboxBucket).Bucket([]byte(o.sink)); bk != nil {
			if k, _ := bk.Cursor().First(); k == nil {
				err = tx.Bucket(outboxBucket).DeleteBucket([]byte(o.sink))
			}
		}
	case opRemoveSink:
		b.retired = append(b.retired, o.target)
		err = j.forget(tx, o.target, b)
	case opReplay:
		var n int
		n, err = j.applyReplay(tx, o, b)
		b.replies = append(b.replies, func() { o.replayed <- n })
	case opReplayStatus:
		st := j.status(o.target)
		b.replies = append(b.replies, func() { o.status <- st })
	}
	return err
}

// applyEvent compares an informer's event with the stored state of its object, stores the
// new state, and fans out what changed. pre, when not nil, is what the preselector computed
// for e as recorded: its verdicts hold unless the comparison changes the event.
func (j *Journal) applyEvent(tx *bolt.Tx, targets []Target, e dynamicinformer.Event, pre *preselected, bt *batch) error {
	if pre == nil {
		pre = &preselected{}
	}
	if tx == nil {
		return j.fanOut(nil, targets, e, nil, pre.verdicts, bt)
	}
	b, err := tx.Bucket(objectsBucket).CreateBucketIfNotExists(resourceBucket(e.Resource))
	if err != nil {
		return err
	}
	key := []byte(object.KeyOf(e.Object)) // as in the cache
	var prev *stored
	if v := b.Get(key); v != nil {
		if s, err := decodeStored(v); err == nil {
			prev = &s
		} else {
			j.corruptObject(e.Resource, key, err)
		}
	}
	l := j.lists[e.Resource]
	if e.Type == dynamicinformer.Deleted {
		if l != nil {
			l.count.deleted++
		}
		if err := b.Delete(key); err != nil {
			return err
		}
		return j.fanOut(tx, targets, e, nil, pre.verdicts, bt)
	}
	if l != nil {
		l.seen[string(key)] = struct{}{}
	}
	if prev != nil && sameObject(*prev, e.Object) {
		j.m.suppressed.Inc()
		if l != nil {
			l.count.unchanged++
		}
		return nil
	}
	var old *dynamicinformer.Object // the object as the sinks last saw it
	rederived := false
	if prev != nil && (prev.uid != string(e.Object.GetUID()) || e.OldObject == nil || e.OldObject.GetResourceVersion() != prev.rv) {
		var err error
		if old, err = prev.object(); err != nil {
			// What the sinks saw is unknown: deliver the object as new, derived from the cache.
			j.corruptObject(e.Resource, key, err)
			prev, rederived = nil, true
		}
	}
	var oldJSON []byte // the old object as stored: the same encoding a payload would make
	if prev != nil && prev.uid == string(e.Object.GetUID()) {
		oldJSON = append([]byte(nil), prev.json...)
	}
	verdicts := pre.verdicts // hold while the event stays as recorded
	if err := b.Put(key, storedObject(e.Object)); err != nil {
		return err
	}
	switch {
	case prev == nil:
		if l != nil {
			l.count.added++
		}
		if rederived {
			e.Type, e.OldObject, verdicts = dynamicinformer.Added, nil, nil
		}
	case prev.uid != string(e.Object.GetUID()):
		// Deleted and created again under the same name while nobody was looking.
		gone := dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: e.Resource, Object: old, Observed: e.Observed, Stream: e.Stream, Revision: e.Revision, Since: object.After(object.Revision(prev.rv))}
		if err := j.fanOut(tx, targets, gone, nil, nil, bt); err != nil {
			return err
		}
		e.Type, e.OldObject, verdicts = dynamicinformer.Added, nil, nil
	default:
		if old != nil {
			// The sinks last saw the stored state, not the cache's: that is the old object.
			e.Type, e.OldObject, verdicts = dynamicinformer.Modified, old, nil
		}
		if l != nil {
			l.count.modified++
		}
	}
	return j.fanOut(tx, targets, e, oldJSON, verdicts, bt)
}

// corruptObject counts and logs a stored object that does not decode.
func (j *Journal) corruptObject(gvr schema.GroupVersionResource, key []byte, err error) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt stored object: its state is derived again from the cache", "resource", object.ResourceName(gvr), "key", string(key), "err", err)
}

// fanOut makes an entry of e for every target whose filters select it, and with a store
// writes it to the target's outbox, unless a checkpoint Trim was given already covers it.
// oldJSON, when not nil, is the old object as the sinks last saw it (the stored state) to send
// in place of e.OldObject's; verdicts are the targets' on e, computed before, or nil (a target
// missing from them, added since, is asked now).
func (j *Journal) fanOut(tx *bolt.Tx, targets []Target, e dynamicinformer.Event, oldJSON []byte, verdicts map[Target]verdict, bt *batch) error {
	var body []byte
	now := j.now()
	for _, t := range targets {
		v, ok := verdicts[t]
		if !ok {
			v.selected, v.err = t.Selects(e)
		}
		selected, filterErr := v.selected, v.err
		if !selected || !j.delivers(t, e) {
			continue
		}
		if tx != nil && e.Revision != 0 && e.Revision <= j.floor[t.Name()][e.Resource] {
			continue // the leader has delivered it, or a later state of the object
		}
		if body == nil {
			body = appendPayload(make([]byte, 0, payloadSize(e, oldJSON)), e, oldJSON)
		}
		d := Entry{Event: e, ID: EventID(e), Key: object.OrderingKey(e.Resource, e.Object.GetNamespace(), e.Object.GetName()), Enqueued: now, Body: body, Revision: e.Revision, Since: e.Since}
		if filterErr != nil {
			d.FilterError = filterErr.Error()
		}
		if tx != nil {
			j.seq++
			d.Seq = j.seq
			b, err := tx.Bucket(outboxBucket).CreateBucketIfNotExists([]byte(t.Name()))
			if err != nil {
				return err
			}
			if err := b.Put(sequenceKey(d.Seq), encodeEntry(d)); err != nil {
				return err
			}
			bt.added = append(bt.added, added{t.Name(), d.Seq, indexed{resource: e.Resource, revision: d.Revision, since: d.Since}})
		}
		bt.out = append(bt.out, queued{t, d})
	}
	return nil
}

func (j *Journal) applyAck(tx *bolt.Tx, sink string, seq uint64, bt *batch) error {
	b := tx.Bucket(outboxBucket).Bucket([]byte(sink))
	if b == nil || b.Get(sequenceKey(seq)) == nil {
		return nil
	}
	bt.removed = append(bt.removed, removed{sink, seq})
	return b.Delete(sequenceKey(seq))
}

// listStarted begins comparing a resource's initial list with what is stored.
func (j *Journal) listStarted(tx *bolt.Tx, gvr schema.GroupVersionResource, run uint64) {
	if tx == nil {
		return
	}
	b := tx.Bucket(objectsBucket).Bucket(resourceBucket(gvr))
	fresh := b == nil
	if !fresh {
		k, _ := b.Cursor().First()
		fresh = k == nil
	}
	j.lists[gvr] = &listing{run: run, fresh: fresh, seen: map[string]struct{}{}}
}

// listSynced ends the comparison: every stored object the initial list did not have was deleted
// while nobody was looking, by the list's revision, and is delivered as DELETED with its
// stored state.
func (j *Journal) listSynced(tx *bolt.Tx, targets []Target, gvr schema.GroupVersionResource, run, revision uint64, bt *batch) error {
	l := j.lists[gvr]
	if tx == nil || l == nil || l.run != run {
		return nil
	}
	bt.finished = append(bt.finished, gvr)
	b := tx.Bucket(objectsBucket).Bucket(resourceBucket(gvr))
	var gone, corrupt [][]byte
	var objects []*dynamicinformer.Object
	if b != nil {
		_ = b.ForEach(func(k, v []byte) error {
			if _, ok := l.seen[string(k)]; ok {
				return nil
			}
			key := append([]byte(nil), k...)
			s, err := decodeStored(v)
			var obj *dynamicinformer.Object
			if err == nil {
				obj, err = s.object()
			}
			if err != nil {
				// Gone, and what it was is unreadable: nothing to deliver but the count.
				j.corruptObject(gvr, key, err)
				corrupt = append(corrupt, key)
				return nil
			}
			gone = append(gone, key)
			objects = append(objects, obj)
			return nil
		})
	}
	for _, k := range corrupt {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	now := j.now()
	for i, k := range gone {
		if err := b.Delete(k); err != nil {
			return err
		}
		e := dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: gvr, Object: objects[i], Observed: now, Revision: revision, Since: object.After(object.Revision(objects[i].GetResourceVersion()))}
		if err := j.fanOut(tx, targets, e, nil, nil, bt); err != nil {
			return err
		}
	}
	if l.fresh && len(l.seen) > 0 {
		j.m.fullReplays.Inc()
		j.log.Warn("no stored state for this resource: every object was delivered as ADDED", "resource", object.ResourceName(gvr), "objects", len(l.seen))
		return nil
	}
	j.log.Info("initial list compared with the stored state", "resource", object.ResourceName(gvr),
		"unchanged", l.count.unchanged, "modified", l.count.modified, "added", l.count.added, "deleted", l.count.deleted+len(gone))
	return nil
}
