package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// journal is the one path from the informers to the sinks' queues. OnEvent only appends to
// it; its goroutine takes everything pending at once and, in one store transaction (a group
// commit), compares each event with the stored state of its object, filters it for every
// sink, writes the outbox entries and the object's new state, and only after the commit
// queues the deliveries. So an event is queued only once it is durable, and the state of an
// object never runs ahead of the outbox: what a crash cuts short before a commit is derived
// again by the next start's comparison. A commit that fails (a full disk) queues nothing: its
// operations wait, and are committed again, until one succeeds. An operation that fails on its
// own (a corrupt entry) is counted and skipped; the rest of its batch commits. Without a store
// it only filters and queues.
type journal struct {
	store *Store // nil: memory only
	log   *slog.Logger
	now   func() time.Time
	sinks func() []*Sink
	m     *metrics
	// retired is called, after the commit, for each sink an opRemoveSink removed.
	retired func(*Sink)

	mu      sync.Mutex
	pending []op
	wake    chan struct{}
	failure atomic.Pointer[string] // the last commit's error, nil once one succeeds

	// Owned by the goroutine that flushes.
	seq   uint64
	lists map[schema.GroupVersionResource]*listing
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
)

type op struct {
	kind     opKind
	event    dynamicinformer.Event
	gvr      schema.GroupVersionResource
	run      uint64
	sink     string
	seq      uint64
	deadline time.Time
	target   *Sink // opRemoveSink
}

// listing is a resource's initial list being compared with the stored state.
type listing struct {
	run   uint64
	fresh bool                // nothing was stored for the resource
	seen  map[string]struct{} // keys listed so far
	count struct{ unchanged, modified, added, deleted int }
}

// queued is a delivery to queue once its transaction has committed.
type queued struct {
	sink *Sink
	d    Delivery
}

// batch is what one transaction produced, put into effect only once it commits.
type batch struct {
	out      []queued
	outboxes map[*Sink]int64 // outbox entries added (acks subtract)
	finished []schema.GroupVersionResource
	retired  []*Sink
}

func newJournal(store *Store, log *slog.Logger, now func() time.Time, m *metrics, sinks func() []*Sink) *journal {
	j := &journal{store: store, log: log, now: now, m: m, sinks: sinks, wake: make(chan struct{}, 1), lists: map[schema.GroupVersionResource]*listing{}}
	if store != nil {
		j.seq = store.lastSequence()
	}
	return j
}

func (j *journal) submit(o op) {
	j.mu.Lock()
	j.pending = append(j.pending, o)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

func (j *journal) ack(sink string, seq uint64) {
	if seq != 0 {
		j.submit(op{kind: opAck, sink: sink, seq: seq})
	}
}

// healthy reports the last commit's failure, if the last commit failed.
func (j *journal) healthy() error {
	if msg := j.failure.Load(); msg != nil {
		return errors.New(*msg)
	}
	return nil
}

// run flushes whenever something is pending, until ctx ends; then it flushes once more. After a
// failed commit it tries again with exponential backoff, from 100ms to 5s, not on every event.
func (j *journal) run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	delay := time.Duration(0)
	for {
		select {
		case <-j.wake:
			if delay > 0 {
				continue // failing: the timer decides when to try again
			}
		case <-retry.C:
		case <-ctx.Done():
			_ = j.flush()
			return
		}
		if err := j.flush(); err != nil {
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			retry.Reset(delay)
		} else {
			delay = 0
		}
	}
}

// flush applies everything pending in one transaction and, once it commits, queues its
// deliveries. If the commit fails, nothing is queued and the operations wait for the next
// try, ahead of any that arrive meanwhile.
func (j *journal) flush() error {
	j.mu.Lock()
	ops := j.pending
	j.pending = nil
	j.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	seq := j.seq
	var b batch
	apply := func(tx *bolt.Tx) error {
		j.seq = seq
		b = batch{outboxes: map[*Sink]int64{}}
		sinks := j.sinks()
		for _, o := range ops {
			if err := j.apply(tx, sinks, o, &b); err != nil {
				j.m.writeErrors.Inc()
				j.log.Error("state store operation failed: it is skipped, the rest of its batch commits", "op", o.String(), "err", err)
				if o.kind == opEvent && tx != nil {
					// Forget the object's state, so that the next start derives it again from the cache.
					if bk := tx.Bucket(objectsBucket).Bucket([]byte(o.event.Resource.String())); bk != nil {
						_ = bk.Delete([]byte(dynamicinformer.CacheKey(o.event.Object)))
					}
				}
			}
		}
		return nil
	}
	if j.store == nil {
		_ = apply(nil)
	} else if err := j.store.db.Update(apply); err != nil {
		j.seq = seq
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
	for s, n := range b.outboxes {
		s.outbox.Add(n)
	}
	for _, gvr := range b.finished {
		delete(j.lists, gvr)
	}
	for _, q := range b.out {
		q.sink.enqueue(q.d)
	}
	for _, s := range b.retired {
		j.retired(s)
	}
	return nil
}

func (o op) String() string {
	switch o.kind {
	case opEvent:
		return fmt.Sprintf("%s %s %s", o.event.Type, resourceName(o.event.Resource), dynamicinformer.CacheKey(o.event.Object))
	case opListStarted, opListSynced:
		return "list " + resourceName(o.gvr)
	default:
		return fmt.Sprintf("outbox %s entry %d", o.sink, o.seq)
	}
}

// apply applies one operation within tx (nil without a store).
func (j *journal) apply(tx *bolt.Tx, sinks []*Sink, o op, b *batch) error {
	if tx == nil && (o.kind == opAck || o.kind == opDeadline || o.kind == opDropSink) {
		return nil // without a store there is no outbox
	}
	var err error
	switch o.kind {
	case opEvent:
		err = j.applyEvent(tx, sinks, o.event, b)
	case opListStarted:
		j.listStarted(tx, o.gvr, o.run)
	case opListSynced:
		err = j.listSynced(tx, sinks, o.gvr, o.run, b)
	case opAck:
		err = j.applyAck(tx, o.sink, o.seq, b)
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
	}
	return err
}

// applyEvent compares an informer's event with the stored state of its object, stores the
// new state, and fans out what changed.
func (j *journal) applyEvent(tx *bolt.Tx, sinks []*Sink, e dynamicinformer.Event, bt *batch) error {
	if tx == nil {
		return j.fanOut(nil, sinks, e, nil, nil, bt)
	}
	b, err := tx.Bucket(objectsBucket).CreateBucketIfNotExists([]byte(e.Resource.String()))
	if err != nil {
		return err
	}
	key := []byte(dynamicinformer.CacheKey(e.Object)) // as in the cache
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
		return j.fanOut(tx, sinks, e, nil, nil, bt)
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
	var old *unstructured.Unstructured // the object as the sinks last saw it
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
	objJSON := dynamicinformer.AppendJSON(make([]byte, 0, 2048), e.Object.Object)
	if err := b.Put(key, storedObject(e.Object, objJSON)); err != nil {
		return err
	}
	switch {
	case prev == nil:
		if l != nil {
			l.count.added++
		}
		if rederived {
			e.Type, e.OldObject = dynamicinformer.Added, nil
		}
	case prev.uid != string(e.Object.GetUID()):
		// Deleted and created again under the same name while nobody was looking.
		if err := j.fanOut(tx, sinks, dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: e.Resource, Object: old, Observed: e.Observed}, nil, nil, bt); err != nil {
			return err
		}
		e.Type, e.OldObject = dynamicinformer.Added, nil
	default:
		if old != nil {
			// The sinks last saw the stored state, not the cache's: that is the old object.
			e.Type, e.OldObject = dynamicinformer.Modified, old
		}
		if l != nil {
			l.count.modified++
		}
	}
	return j.fanOut(tx, sinks, e, objJSON, oldJSON, bt)
}

// corruptObject counts and logs a stored object that does not decode.
func (j *journal) corruptObject(gvr schema.GroupVersionResource, key []byte, err error) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt stored object: its state is derived again from the cache", "resource", resourceName(gvr), "key", string(key), "err", err)
}

// fanOut makes a delivery of e for every sink whose filters select it, and with a store writes
// its outbox entry. objJSON and oldJSON are e.Object and e.OldObject encoded, or nil.
func (j *journal) fanOut(tx *bolt.Tx, sinks []*Sink, e dynamicinformer.Event, objJSON, oldJSON []byte, bt *batch) error {
	var body []byte
	now := j.now()
	for _, s := range sinks {
		if !s.selects(e) {
			continue
		}
		if body == nil {
			body = appendPayload(make([]byte, 0, len(objJSON)+len(oldJSON)+256), e, objJSON, oldJSON)
		}
		d := Delivery{Event: e, ID: EventID(e), Key: objectKey(e), Enqueued: now, Body: body}
		if tx != nil {
			j.seq++
			d.Seq = j.seq
			b, err := tx.Bucket(outboxBucket).CreateBucketIfNotExists([]byte(s.name))
			if err != nil {
				return err
			}
			if err := b.Put(sequenceKey(d.Seq), encodeEntry(d)); err != nil {
				return err
			}
			bt.outboxes[s]++
		}
		bt.out = append(bt.out, queued{s, d})
	}
	return nil
}

func (j *journal) applyAck(tx *bolt.Tx, sink string, seq uint64, bt *batch) error {
	b := tx.Bucket(outboxBucket).Bucket([]byte(sink))
	if b == nil || b.Get(sequenceKey(seq)) == nil {
		return nil
	}
	for _, s := range j.sinks() {
		if s.name == sink {
			bt.outboxes[s]--
		}
	}
	return b.Delete(sequenceKey(seq))
}

// listStarted begins comparing a resource's initial list with what is stored.
func (j *journal) listStarted(tx *bolt.Tx, gvr schema.GroupVersionResource, run uint64) {
	if tx == nil {
		return
	}
	b := tx.Bucket(objectsBucket).Bucket([]byte(gvr.String()))
	fresh := b == nil
	if !fresh {
		k, _ := b.Cursor().First()
		fresh = k == nil
	}
	j.lists[gvr] = &listing{run: run, fresh: fresh, seen: map[string]struct{}{}}
}

// listSynced ends the comparison: every stored object the initial list did not have was deleted
// while nobody was looking, and is delivered as DELETED with its stored state.
func (j *journal) listSynced(tx *bolt.Tx, sinks []*Sink, gvr schema.GroupVersionResource, run uint64, bt *batch) error {
	l := j.lists[gvr]
	if tx == nil || l == nil || l.run != run {
		return nil
	}
	bt.finished = append(bt.finished, gvr)
	b := tx.Bucket(objectsBucket).Bucket([]byte(gvr.String()))
	var gone, corrupt [][]byte
	var objects []*unstructured.Unstructured
	if b != nil {
		_ = b.ForEach(func(k, v []byte) error {
			if _, ok := l.seen[string(k)]; ok {
				return nil
			}
			key := append([]byte(nil), k...)
			s, err := decodeStored(v)
			var obj *unstructured.Unstructured
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
		if err := j.fanOut(tx, sinks, dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: gvr, Object: objects[i], Observed: now}, nil, nil, bt); err != nil {
			return err
		}
	}
	if l.fresh && len(l.seen) > 0 {
		j.m.fullReplays.Inc()
		j.log.Warn("no stored state for this resource: every object was delivered as ADDED", "resource", resourceName(gvr), "objects", len(l.seen))
		return nil
	}
	j.log.Info("initial list compared with the stored state", "resource", resourceName(gvr),
		"unchanged", l.count.unchanged, "modified", l.count.modified, "added", l.count.added, "deleted", l.count.deleted+len(gone))
	return nil
}

// resourceName names gvr as logs and metrics do: resource.version.group.
func resourceName(gvr schema.GroupVersionResource) string {
	return strings.TrimSuffix(gvr.Resource+"."+gvr.Version+"."+gvr.Group, ".")
}
