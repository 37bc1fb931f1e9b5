package journal

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// listing is a resource's initial list being compared with the stored state.
type listing struct {
	run     uint64
	streams []string
	fresh   bool                // nothing was stored for the resource
	seen    map[string]struct{} // keys listed so far
	count   struct{ unchanged, modified, added, deleted int }
}

// apply applies one operation within tx (nil without a store).
func (j *Journal) apply(tx *txn, targets []Target, o op, b *batch) error {
	if tx == nil && (o.kind == opDeadline || o.kind == opDropSink || o.kind == opTrim) {
		return nil // without a store there is no outbox
	}
	var err error
	switch o.kind {
	case opEvent:
		if o.quiet {
			targets = nil
		}
		err = j.applyEvent(tx, targets, o.event, o.pre, b)
		b.advance(o.event)
	case opListStarted:
		j.listStarted(tx, o.gvr, o.run, o.streams)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, streams: o.streams})
	case opListSynced:
		err = j.listSynced(tx, targets, o.gvr, o.run, o.revision, b)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, synced: true})
	case opTrim:
		j.trim(tx, o.cp, b)
	case opDeadline:
		if tx.deadline(o.sink, o.seq, o.deadline) {
			b.deadlines = append(b.deadlines, deadline{o.sink, o.seq, unixNano(o.deadline)})
		}
	case opDropSink:
		// Only empty: a webhook added again under the name may already have entries.
		if tx.drop(o.sink, slices.ContainsFunc(b.added, func(a added) bool { return a.sink == o.sink })) {
			b.dropped = append(b.dropped, o.sink)
		}
	case opRemoveSink:
		b.retired = append(b.retired, o.target)
		j.forget(tx, o.target, b)
	case opReplay, opReplayStatus, opResume:
		b.replies = append(b.replies, j.applyControl(tx, o, b))
	}
	return err
}

// applyControl applies an operation that answers its caller, and returns the reply, sent once
// the commit is written. Apart from apply, so that the reply's closure does not move every
// operation apply is handed to the heap.
func (j *Journal) applyControl(tx *txn, o op, b *batch) func() {
	switch o.kind {
	case opReplay:
		n := j.applyReplay(tx, o, b)
		return func() { o.replayed <- n }
	case opReplayStatus:
		st := j.status(o.target)
		return func() { o.status <- st }
	default: // opResume
		inner(j.selections, object.ResourceName(o.gvr))[o.stream] = o.sel
		// Once committed: the stream's state as of its revision, with nothing of the batch
		// half applied.
		return func() { o.resumed <- j.resumption(o.gvr, o.stream, o.sel) }
	}
}

// outcome is what an event means given the state stored of its object: the cases of the
// comparison that makes a watch resumed, or an initial list, after a restart deliver what the
// sinks have not seen, and nothing they have (see decide).
type outcome int

const (
	outStale      outcome = iota // a watch's event older than the stored state: dropped
	outDeleted                   // the object is gone: its state removed, the deletion handed on
	outUnchanged                 // the stored state already: nothing handed on
	outNew                       // nothing stored: stored, and handed on as it came
	outRecreated                 // another incarnation is stored: DELETED of it, then ADDED
	outFromStored                // changed, and the event's old object is not the stored state: MODIFIED from the stored state
	outAsCame                    // changed, and the event's old object is the stored state: handed on as it came
	outRederived                 // the stored state does not decode: handed on as ADDED (what the sinks saw is unknown)
)

// decide is the restart decision: what e means given prev, the stored state of its object
// (nil: none). It reads nothing; outRecreated and outFromStored need the stored object, which
// the caller reads, and which becomes outRederived if it does not decode.
func decide(e object.Event, prev *stored) outcome {
	switch {
	case prev != nil && e.InOrder && e.Revision != 0 && stale(e, *prev):
		return outStale
	case e.Type == object.Deleted:
		return outDeleted
	case prev == nil:
		return outNew
	case prev.uid != string(e.Object.GetUID()):
		return outRecreated
	case prev.rv == e.Object.GetResourceVersion():
		return outUnchanged
	case e.OldObject == nil || e.OldObject.GetResourceVersion() != prev.rv:
		return outFromStored
	default:
		return outAsCame
	}
}

// note counts an event of the resource's initial list by its outcome, and notes its key as
// listed (a deletion's or a stale event's is not). l may be nil: no list is being compared.
func (l *listing) note(key string, out outcome) {
	if l == nil || out == outStale {
		return
	}
	switch out {
	case outDeleted:
		l.count.deleted++
		return
	case outUnchanged:
		l.count.unchanged++
	case outNew, outRederived:
		l.count.added++
	case outFromStored, outAsCame:
		l.count.modified++
	}
	l.seen[key] = struct{}{}
}

// applyEvent compares an informer's event with the stored state of its object (decide),
// stores the new state, and fans out what changed. pre, when not nil, is what the preselector
// computed for e as recorded: its verdicts hold unless the comparison changes the event.
func (j *Journal) applyEvent(tx *txn, targets []Target, e object.Event, pre *preselected, bt *batch) error {
	if pre == nil {
		pre = &preselected{}
	}
	if tx == nil {
		j.fanOut(nil, targets, e, nil, pre.verdicts, bt)
		return nil
	}
	res, key := object.ResourceName(e.Resource), object.KeyOf(e.Object) // as in the cache
	var prev *stored
	if st, ok := tx.get(res, key); ok {
		prev = &st
	}
	if e.InOrder && e.Revision != 0 {
		if sel, ok := j.selections[res][e.Stream]; ok {
			tx.revision(res, e.Stream, sel, e.Revision)
		}
	}
	out := decide(e, prev)
	var old *object.Object // the object as the sinks last saw it
	if out == outRecreated || out == outFromStored {
		var err error
		if old, err = j.store.object(*prev); err != nil {
			j.corruptObject(e.Resource, key, err)
			out = outRederived
		}
	}
	j.lists[e.Resource].note(key, out)
	switch out {
	case outStale, outUnchanged:
		j.m.suppressed.Inc()
		if out == outUnchanged {
			j.store.keep(res, key, e.Object)
		}
		return nil
	case outDeleted:
		tx.del(res, key)
		j.fanOut(tx, targets, e, nil, pre.verdicts, bt)
		return nil
	}
	tx.put(res, key, e.Object)
	j.handOn(tx, targets, e, out, prev, old, pre.verdicts, bt)
	return nil
}

// handOn fans out e, whose object's new state is stored, as its outcome says: as it came, or as
// the sinks must see it given what they saw of the object last, old (the stored state, read
// for outRecreated and outFromStored). verdicts hold while the event stays as recorded.
func (j *Journal) handOn(tx *txn, targets []Target, e object.Event, out outcome, prev *stored, old *object.Object, verdicts map[Target]verdict, bt *batch) {
	var oldJSON []byte // the old object as the sinks saw it: the same encoding a payload would make
	switch out {
	case outRederived:
		e.Type, e.OldObject, verdicts = object.Added, nil, nil
	case outRecreated:
		// Deleted and created again under the same name while nobody was looking.
		gone := object.Event{Type: object.Deleted, Resource: e.Resource, Object: old, Observed: e.Observed, Stream: e.Stream, Revision: e.Revision, Since: object.After(object.Revision(prev.rv))}
		j.fanOut(tx, targets, gone, nil, nil, bt)
		e.Type, e.OldObject, verdicts = object.Added, nil, nil
	case outFromStored:
		// The sinks last saw the stored state, not the cache's: that is the old object.
		oldJSON = old.JSON()
		e.Type, e.OldObject, verdicts = object.Modified, old, nil
	case outAsCame:
		if prev.obj != nil {
			oldJSON = prev.obj.JSON()
		} else {
			oldJSON = e.OldObject.JSON() // the same state: its resourceVersion is the stored one
		}
	}
	j.fanOut(tx, targets, e, oldJSON, verdicts, bt)
}

// corruptObject counts and logs a stored object that does not decode.
func (j *Journal) corruptObject(gvr schema.GroupVersionResource, key string, err error) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt stored object: its state is derived again from the cache", "resource", object.ResourceName(gvr), "key", key, "err", err)
}

// fanOut makes an entry of e for every target whose filters select it, and with a store
// writes it to the target's outbox, unless a checkpoint Trim was given already covers it.
// oldJSON, when not nil, is the old object as the sinks last saw it (the stored state) to send
// in place of e.OldObject's; verdicts are the targets' on e, computed before, or nil (a target
// missing from them, added since, is asked now).
func (j *Journal) fanOut(tx *txn, targets []Target, e object.Event, oldJSON []byte, verdicts map[Target]verdict, bt *batch) {
	var body payload // built once for every entry the commit records
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
		// Queued without its body: the sink builds it from the event and the old object, which
		// live on anyway, when it sends it.
		d := Entry{Event: e, ID: EventID(e), Key: object.OrderingKey(e.Resource, e.Object.GetNamespace(), e.Object.GetName()), Enqueued: now, Old: oldJSON, Revision: e.Revision, Since: e.Since}
		if filterErr != nil {
			d.FilterError = filterErr.Error()
		}
		if tx != nil {
			if body.head == nil {
				j.payload = appendPayloadHead(j.payload[:0], e)
				body = payloadOf(e, oldJSON)
				body.head = j.payload
			}
			j.seq++
			d.Seq = j.seq
			off, n, whole := tx.entry(t.Name(), d.Seq, d, body)
			bt.added = append(bt.added, added{t.Name(), d.Seq, indexed{resource: e.Resource, revision: d.Revision, since: d.Since, n: int32(n), whole: int32(whole)}, off})
		}
		bt.out = append(bt.out, queued{t, d})
	}
}

// stale reports whether e, a watch's event, is older than prev, the state recorded of its
// object: as a watch resumed from a revision before the object's last recorded change (see
// Resume) may send it. A watch sends an object's versions in order, and its deletion as the
// last version of the incarnation recorded, so such an event was recorded already (or passed
// over by a relist) and is never delivered after the newer state.
func stale(e object.Event, prev stored) bool {
	if object.Revision(e.Object.GetResourceVersion()) < object.Revision(prev.rv) {
		return true
	}
	return e.Type == object.Deleted && prev.uid != string(e.Object.GetUID()) // an earlier incarnation's
}

// listStarted begins comparing a resource's initial list with what is stored.
func (j *Journal) listStarted(tx *txn, gvr schema.GroupVersionResource, run uint64, streams []string) {
	if tx == nil {
		return
	}
	j.lists[gvr] = &listing{run: run, streams: streams, fresh: !tx.holds(object.ResourceName(gvr)), seen: map[string]struct{}{}}
}

// listSynced ends the comparison: every stored object the initial list did not have was deleted
// while nobody was looking, by the list's revision, and is delivered as DELETED with its
// stored state.
func (j *Journal) listSynced(tx *txn, targets []Target, gvr schema.GroupVersionResource, run, revision uint64, bt *batch) error {
	l := j.lists[gvr]
	if tx == nil || l == nil || l.run != run {
		return nil
	}
	bt.finished = append(bt.finished, gvr)
	res := object.ResourceName(gvr)
	if len(l.streams) == 1 {
		// The states now hold every change through the list's revision (with several streams,
		// revision is the latest of their lists', and each stream waits for an event of its own).
		if sel, ok := j.selections[res][l.streams[0]]; ok {
			tx.revision(res, l.streams[0], sel, revision)
		}
	}
	var gone []string
	tx.each(res, func(key string, _ stored) {
		if _, ok := l.seen[key]; !ok {
			gone = append(gone, key)
		}
	})
	slices.SortFunc(gone, object.CompareKeys)
	now := j.now()
	for _, key := range gone {
		st, _ := tx.get(res, key)
		tx.del(res, key)
		obj, err := j.store.object(st)
		if err != nil {
			// Gone, and what it was is unreadable: nothing to deliver but the count.
			j.corruptObject(gvr, key, err)
			continue
		}
		if j.ignores(gvr, obj) {
			continue
		}
		e := object.Event{Type: object.Deleted, Resource: gvr, Object: obj, Observed: now, Revision: revision, Since: object.After(object.Revision(obj.GetResourceVersion()))}
		j.fanOut(tx, targets, e, nil, nil, bt)
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
