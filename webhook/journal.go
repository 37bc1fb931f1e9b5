package webhook

import (
	"context"
	"log/slog"
	"strings"
	"sync"
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
// again by the next start's comparison. Without a store it only filters and queues.
type journal struct {
	store *Store // nil: memory only
	log   *slog.Logger
	now   func() time.Time
	sinks func() []*Sink
	m     *metrics

	mu      sync.Mutex
	pending []op
	wake    chan struct{}

	// Owned by the goroutine that flushes.
	seq   uint64
	lists map[schema.GroupVersionResource]*listing
}

type opKind int

const (
	opEvent opKind = iota
	opListStarted
	opListSynced
	opAck      // a delivery is finished: remove its outbox entry
	opDeadline // a delivery's retry deadline is set: keep it across restarts
	opDropSink // a sink is gone: remove its outbox
)

type op struct {
	kind     opKind
	event    dynamicinformer.Event
	gvr      schema.GroupVersionResource
	run      uint64
	sink     string
	seq      uint64
	deadline time.Time
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

// run flushes whenever something is pending, until ctx ends; then it flushes once more.
func (j *journal) run(ctx context.Context) {
	for {
		select {
		case <-j.wake:
			j.flush()
		case <-ctx.Done():
			j.flush()
			return
		}
	}
}

// flush applies everything pending. Deliveries are queued after the commit; if the commit
// fails they are queued anyway, without an outbox entry, and the state stays as it was, so
// that the next start derives them again.
func (j *journal) flush() {
	j.mu.Lock()
	ops := j.pending
	j.pending = nil
	j.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	var out []queued
	apply := func(tx *bolt.Tx) error {
		out = out[:0]
		sinks := j.sinks()
		for _, o := range ops {
			var err error
			switch o.kind {
			case opEvent:
				out, err = j.applyEvent(tx, sinks, o.event, out)
			case opListStarted:
				j.listStarted(tx, o.gvr, o.run)
			case opListSynced:
				out, err = j.listSynced(tx, sinks, o.gvr, o.run, out)
			case opAck:
				err = j.applyAck(tx, o.sink, o.seq)
			case opDeadline:
				if b := tx.Bucket(outboxBucket).Bucket([]byte(o.sink)); b != nil {
					if v := b.Get(sequenceKey(o.seq)); v != nil {
						err = b.Put(sequenceKey(o.seq), setEntryDeadline(v, o.deadline))
					}
				}
			case opDropSink:
				if tx.Bucket(outboxBucket).Bucket([]byte(o.sink)) != nil {
					err = tx.Bucket(outboxBucket).DeleteBucket([]byte(o.sink))
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if j.store == nil {
		_ = apply(nil)
	} else if err := j.store.db.Update(apply); err != nil {
		j.m.commitErrors.Inc()
		j.log.Error("state store commit failed: deliveries proceed without an outbox entry", "err", err)
		for i := range out {
			out[i].d.Seq = 0
		}
	} else {
		j.m.commits.Inc()
	}
	for _, q := range out {
		q.sink.enqueue(q.d)
	}
}

// applyEvent compares an informer's event with the stored state of its object, stores the
// new state, and fans out what changed.
func (j *journal) applyEvent(tx *bolt.Tx, sinks []*Sink, e dynamicinformer.Event, out []queued) ([]queued, error) {
	if tx == nil {
		return j.fanOut(nil, sinks, e, nil, nil, out)
	}
	b, err := tx.Bucket(objectsBucket).CreateBucketIfNotExists([]byte(e.Resource.String()))
	if err != nil {
		return out, err
	}
	key := []byte(dynamicinformer.CacheKey(e.Object)) // as in the cache
	var prev *stored
	if v := b.Get(key); v != nil {
		if s, err := decodeStored(v); err == nil {
			prev = &s
		}
	}
	l := j.lists[e.Resource]
	if e.Type == dynamicinformer.Deleted {
		if l != nil {
			l.count.deleted++
		}
		if err := b.Delete(key); err != nil {
			return out, err
		}
		return j.fanOut(tx, sinks, e, nil, nil, out)
	}
	if l != nil {
		l.seen[string(key)] = struct{}{}
	}
	if prev != nil && sameObject(*prev, e.Object) {
		j.m.suppressed.Inc()
		if l != nil {
			l.count.unchanged++
		}
		return out, nil
	}
	var oldJSON []byte // the old object as stored: the same encoding a payload would make
	if prev != nil && prev.uid == string(e.Object.GetUID()) {
		oldJSON = append([]byte(nil), prev.json...)
	}
	objJSON := dynamicinformer.AppendJSON(make([]byte, 0, 2048), e.Object.Object)
	if err := b.Put(key, storedObject(e.Object, objJSON)); err != nil {
		return out, err
	}
	switch {
	case prev == nil:
		if l != nil {
			l.count.added++
		}
	case prev.uid != string(e.Object.GetUID()):
		// Deleted and created again under the same name while nobody was looking.
		old, err := prev.object()
		if err == nil {
			if out, err = j.fanOut(tx, sinks, dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: e.Resource, Object: old, Observed: e.Observed}, nil, nil, out); err != nil {
				return out, err
			}
		}
		e.Type, e.OldObject = dynamicinformer.Added, nil
	default:
		if e.OldObject == nil || e.OldObject.GetResourceVersion() != prev.rv {
			// The sinks last saw the stored state, not the cache's: that is the old object.
			old, err := prev.object()
			if err != nil {
				return out, err
			}
			e.Type, e.OldObject = dynamicinformer.Modified, old
		}
		if l != nil {
			l.count.modified++
		}
	}
	return j.fanOut(tx, sinks, e, objJSON, oldJSON, out)
}

// fanOut makes a delivery of e for every sink whose filters select it, and with a store writes
// its outbox entry. objJSON and oldJSON are e.Object and e.OldObject encoded, or nil.
func (j *journal) fanOut(tx *bolt.Tx, sinks []*Sink, e dynamicinformer.Event, objJSON, oldJSON []byte, out []queued) ([]queued, error) {
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
			b, err := tx.Bucket(outboxBucket).CreateBucketIfNotExists([]byte(s.cfg.Name))
			if err != nil {
				return out, err
			}
			if err := b.Put(sequenceKey(d.Seq), encodeEntry(d)); err != nil {
				return out, err
			}
			s.outbox.Add(1)
		}
		out = append(out, queued{s, d})
	}
	return out, nil
}

func (j *journal) applyAck(tx *bolt.Tx, sink string, seq uint64) error {
	b := tx.Bucket(outboxBucket).Bucket([]byte(sink))
	if b == nil || b.Get(sequenceKey(seq)) == nil {
		return nil
	}
	for _, s := range j.sinks() {
		if s.cfg.Name == sink {
			s.outbox.Add(-1)
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
func (j *journal) listSynced(tx *bolt.Tx, sinks []*Sink, gvr schema.GroupVersionResource, run uint64, out []queued) ([]queued, error) {
	l := j.lists[gvr]
	if tx == nil || l == nil || l.run != run {
		return out, nil
	}
	delete(j.lists, gvr)
	b := tx.Bucket(objectsBucket).Bucket([]byte(gvr.String()))
	var gone [][]byte
	var objects []*unstructured.Unstructured
	if b != nil {
		err := b.ForEach(func(k, v []byte) error {
			if _, ok := l.seen[string(k)]; ok {
				return nil
			}
			s, err := decodeStored(v)
			if err != nil {
				return err
			}
			obj, err := s.object()
			if err != nil {
				return err
			}
			gone = append(gone, append([]byte(nil), k...))
			objects = append(objects, obj)
			return nil
		})
		if err != nil {
			return out, err
		}
	}
	now := j.now()
	for i, k := range gone {
		if err := b.Delete(k); err != nil {
			return out, err
		}
		var err error
		if out, err = j.fanOut(tx, sinks, dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: gvr, Object: objects[i], Observed: now}, nil, nil, out); err != nil {
			return out, err
		}
	}
	if l.fresh && len(l.seen) > 0 {
		j.m.fullReplays.Inc()
		j.log.Warn("no stored state for this resource: every object was delivered as ADDED", "resource", resourceName(gvr), "objects", len(l.seen))
		return out, nil
	}
	j.log.Info("initial list compared with the stored state", "resource", resourceName(gvr),
		"unchanged", l.count.unchanged, "modified", l.count.modified, "added", l.count.added, "deleted", l.count.deleted+len(gone))
	return out, nil
}

// resourceName names gvr as logs and metrics do: resource.version.group.
func resourceName(gvr schema.GroupVersionResource) string {
	return strings.TrimSuffix(gvr.Resource+"."+gvr.Version+"."+gvr.Group, ".")
}
