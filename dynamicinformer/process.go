package dynamicinformer

import (
	"fmt"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/object"
)

// process applies what stream's informer pops to the store and turns it into Events, one
// change at a time, in the order the informer received them: the change first, then its
// events, with nothing in between that a reader of the store and its events (Read) can see. It
// never blocks on I/O. A list's changes (its initial list, or a relist after the watch broke)
// are applied in one step at the list's revision; the events of a relist are counted and not
// in order. A change with no revision of its own (an object that came in or went out with its
// namespace) is published at the revision that follows it.
func (r *Resource) process(gvr schema.GroupVersionResource, stream string, mv *moves, st *store) cache.ProcessFunc {
	return func(obj any, isInInitialList bool) error {
		deltas, ok := obj.(cache.Deltas)
		if !ok {
			return fmt.Errorf("process %s: unexpected %T", r.name, obj)
		}
		for _, d := range deltas {
			r.apply(gvr, stream, mv, st, d, isInInitialList)
		}
		return nil
	}
}

func (r *Resource) apply(gvr schema.GroupVersionResource, stream string, mv *moves, st *store, d cache.Delta, isInInitialList bool) {
	r.emitting.RLock()
	defer r.emitting.RUnlock()
	switch info := d.Object.(type) {
	case cache.ReplacedAllInfo:
		r.replace(gvr, stream, st, info, isInInitialList)
		return
	case cache.BookmarkInfo:
		st.bookmark(stream, object.Revision(info.ResourceVersion))
		return
	case cache.SyncAllInfo:
		return // a resync: nothing changed
	case cache.DeletedFinalStateUnknown:
		d.Object = info.Obj
	}
	u, ok := d.Object.(*object.Object)
	if !ok {
		return
	}
	// A change lost on its way into the cache, for the tests of the consistency check (a
	// failpoint: see test/runner.BuildWithFailpoints).
	// gofail: var dropChange bool
	// if dropChange { return }
	e := object.Event{Resource: gvr, Object: u, Stream: stream, Revision: object.Revision(u.GetResourceVersion()), InOrder: true}
	rev := e.Revision
	m, movedWith := mv.movedWith(u)
	if movedWith {
		e.Since, e.Revision, e.InOrder, e.Moved = m.since, m.at, false, true
		rev = 0
	}
	if d.Type == cache.Deleted {
		last := st.remove(stream, u, rev)
		if last == nil {
			return // never cached: nothing to tell
		}
		r.objects.Add(-1)
		e.Type, e.Last = object.Deleted, last
		if !movedWith {
			e.Managers = object.ChangedManagers(last, u)
		}
		r.emit(e)
		return
	}
	old := st.set(stream, u, rev)
	switch {
	case old == nil:
		r.objects.Add(1)
		e.Type = object.Added
	case old.GetResourceVersion() == u.GetResourceVersion():
		return // a transition of an unchanged object
	default:
		e.Type, e.OldObject = object.Modified, old
	}
	if !movedWith {
		e.Managers = object.ChangedManagers(old, u)
	}
	// Every change naming every manager of its object, for the test that shows
	// validate.Attributed failing on a broken build (a failpoint: see
	// test/runner.BuildWithFailpoints).
	// gofail: var nameEveryManager struct{}
	// if !movedWith { e.Managers = object.ChangedManagers(nil, u) }
	r.emit(e)
}

// replace applies a list of stream's objects at its revision: the initial list's objects are
// object.Added with InitialList set; a relist's changes are counted, and not in order. A delete a
// relist found happened after the object's last known resourceVersion, by the list's. The
// changes are emitted in key order, as the apiserver lists: a streamed list (WatchList) reaches
// the store in no order, and a history reads a page of objects as a list found them from a few
// blocks only when they were written in order.
func (r *Resource) replace(gvr schema.GroupVersionResource, stream string, st *store, info cache.ReplacedAllInfo, initial bool) {
	objs := make([]*object.Object, 0, len(info.Objects))
	for _, o := range info.Objects {
		if u, ok := o.(*object.Object); ok {
			objs = append(objs, u)
		}
	}
	slices.SortFunc(objs, object.CompareObjects)
	rev := object.Revision(info.ResourceVersion)
	gone, changes := st.replace(stream, objs, rev)
	for _, u := range gone {
		r.objects.Add(-1)
		r.relistEvents[object.Deleted].Inc()
		last := object.Revision(u.GetResourceVersion())
		r.emit(object.Event{Type: object.Deleted, Resource: gvr, Object: u, Last: u, Stream: stream, Since: object.After(last), Revision: rev})
	}
	for _, c := range changes {
		e := object.Event{Resource: gvr, Object: c.new, Stream: stream, Revision: object.Revision(c.new.GetResourceVersion()), Managers: object.ChangedManagers(c.old, c.new)}
		switch {
		case c.old == nil:
			r.objects.Add(1)
			e.Type, e.InitialList = object.Added, initial
		case c.old.GetResourceVersion() == c.new.GetResourceVersion():
			continue // unchanged
		default:
			e.Type, e.OldObject = object.Modified, c.old
		}
		if !initial {
			r.relistEvents[e.Type].Inc()
		}
		r.emit(e)
	}
}

func (r *Resource) emit(e object.Event) {
	e.Observed = r.m.clock()
	r.lastEvent.Store(e.Observed.UnixNano())
	r.events[e.Type].Inc()
	for _, s := range r.m.subscribed() {
		s.OnEvent(e)
	}
}

// versioned is an object as a watch sends it or as the cache keeps it: named, at a
// resourceVersion.
type versioned interface {
	object.Named
	GetResourceVersion() string
}

// moves follows, for a resource with a namespaceSelector, the objects that came in or went
// out with their namespace until their events pass, and the selection's revisions.
type moves struct {
	mu    sync.Mutex
	moved map[string]moved // objects that came in or went out with their namespace
	// applied is the namespace selection's revision the watch has brought the cache to, and
	// emitted the one through which the events of doing so have been emitted.
	applied, emitted uint64
}

// moved is an object, at resourceVersion rv, that came in or went out of the cache with its
// namespace, as a namespaceSelector changed somewhere from since to at (see object.Event.Since).
type moved struct {
	rv        string
	since, at uint64
}

// move notes that u comes in or goes out because its namespace joined or left the selection
// between revisions since and at.
func (x *moves) move(u versioned, since, at uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.moved == nil {
		x.moved = map[string]moved{}
	}
	x.moved[object.KeyOf(u)] = moved{rv: u.GetResourceVersion(), since: since, at: at}
}

// movedWith reports whether u, as it is, came in or went out with its namespace, and when (see
// move), and forgets it.
func (x *moves) movedWith(u versioned) (moved, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.moved) == 0 {
		return moved{}, false
	}
	key := object.KeyOf(u)
	m, ok := x.moved[key]
	delete(x.moved, key)
	if len(x.moved) == 0 {
		x.emitted = x.applied
	}
	return m, ok && m.rv == u.GetResourceVersion()
}

// selectionApplied notes that the watch has passed on every event of bringing the cache to the
// namespace selection of revision rev; restart, that a list starts again from it.
func (x *moves) selectionApplied(rev uint64, restart bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if restart {
		clear(x.moved)
	}
	x.applied = rev
	if len(x.moved) == 0 {
		x.emitted = rev
	}
}

// selectionEmitted is the namespace selection's revision through which every event of its
// changes has been emitted.
func (x *moves) selectionEmitted() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.emitted
}
