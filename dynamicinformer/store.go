package dynamicinformer

import (
	"strings"
	"sync"
	"unsafe"

	"github.com/dynwatch/dynwatch/object"
	"github.com/google/btree"
)

// storeDegree is the B-trees' degree: nodes of up to 63 items, a few cache lines of pointers.
const storeDegree = 32

// entry is one cached object in list order, under its key (see storeKey). The key is the
// store's own string, not read from the object's JSON: the index entries share it, and outlive
// the version that made them.
type entry struct {
	key string
	obj *object.Object
}

// storeKey is the key the store orders an object by: its namespace and name joined by a NUL,
// which neither may hold, so that keys compare as object.Compare compares their objects (a
// namespace ends with a byte below any of a longer one's). One string, not two, keeps an entry
// in a B-tree at 24 bytes and an index entry at 32 (from 40 and 48).
func storeKey(namespace, name string) string {
	var buf [64]byte // a key this long or shorter is built on the stack, then copied once
	return string(appendKey(buf[:0], namespace, name))
}

// appendKey appends namespace and name's storeKey to buf.
func appendKey(buf []byte, namespace, name string) []byte {
	return append(append(append(buf, namespace...), 0), name...)
}

// keyPrefix is what the keys of namespace's objects begin with; "" (every key) for "".
func keyPrefix(namespace string) string {
	if namespace == "" {
		return ""
	}
	return storeKey(namespace, "")
}

// lessEntry orders entries in list order.
func lessEntry(a, b entry) bool { return a.key < b.key }

// indexed is one object under one value of an index: its key, not the object, so that a
// change that keeps the object's values leaves the index as it is. A snapshot's index and its
// objects are taken together, so the key finds the object at the same moment. Nothing in it
// is read from an object's JSON (its key is its entry's, see setLocked; its value, see
// ownValue): an entry lives on through updates that keep its value, and would keep the JSON of
// the version that made it alive.
type indexed struct {
	value, key string
}

// lessIndexed orders an index by value, then in list order.
func lessIndexed(a, b indexed) bool {
	if a.value != b.value {
		return a.value < b.value
	}
	return a.key < b.key
}

// store is a resource's cache: its objects in list order, the objects of each value of each
// configured indexer in list order, and for each of its streams (one list and watch, see
// object.Event.Stream) the revision through which that stream's changes are applied. Only the
// informers' processing changes it, one change at a time and before the change's event is
// emitted; readers take snapshots, in O(1): the trees are shared copy-on-write, so later
// changes copy the few nodes they touch and do not show in a snapshot.
//
// A snapshot shows each stream's changes through its revision and none after, as the
// apiserver's watch cache does: a list at a stream's revision followed by a watch from it
// misses nothing and repeats nothing. A change known by no revision of its own (an object
// that came in or went out with its namespace, see selectWatch) is applied at once but
// published only with the revision that follows it: until then snapshots show the store as
// it was before that change began.
type store struct {
	mu      sync.Mutex
	t       *btree.BTreeG[entry]
	indexes []string                          // the configured indexers' names, in the order of an object.Object's values
	idx     map[string]*btree.BTreeG[indexed] // index name → its objects by value
	revs    map[string]uint64                 // stream → revision applied through
	frozen  *Snapshot                         // what snapshots show while a change has no revision yet
	probe   []byte                            // a key to look up, reused under mu (see probeLocked)
}

// newStore keeps objects in order, and by the values of the indexers ix, which computed their
// objects' values.
func newStore(ix []object.Indexer) *store {
	s := &store{t: btree.NewG(storeDegree, lessEntry), idx: map[string]*btree.BTreeG[indexed]{}, revs: map[string]uint64{}}
	for _, x := range ix {
		s.indexes = append(s.indexes, x.Name)
		s.idx[x.Name] = btree.NewG(storeDegree, lessIndexed)
	}
	return s
}

// change is one object's change by a list: old is nil for an object that was not cached.
type change struct {
	old, new *object.Object
}

// replace makes stream's objects (those of its namespace, or every object for the stream of
// all namespaces) objs, as a list at revision rev shows them, in one step. It returns the
// objects that are no longer there, and every object of the list with what it replaced.
func (s *store) replace(stream string, objs []*object.Object, rev uint64) (gone []*object.Object, changes []change) {
	listed := make(map[Key]struct{}, len(objs))
	for _, u := range objs {
		listed[Key{u.GetNamespace(), u.GetName()}] = struct{}{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.thaw()
	s.scan(s.t, stream, func(e entry) {
		if _, ok := listed[Key{e.obj.GetNamespace(), e.obj.GetName()}]; !ok {
			gone = append(gone, e.obj)
		}
	})
	for _, u := range gone {
		s.removeLocked(u)
	}
	changes = make([]change, len(objs))
	for i, u := range objs {
		changes[i] = change{old: s.setLocked(u), new: u}
	}
	s.revs[stream] = rev
	return gone, changes
}

// scan calls fn with every entry of t in namespace ("" for every namespace).
func (s *store) scan(t *btree.BTreeG[entry], namespace string, fn func(entry)) {
	prefix := keyPrefix(namespace)
	t.AscendGreaterOrEqual(entry{key: prefix}, func(e entry) bool {
		if !strings.HasPrefix(e.key, prefix) {
			return false
		}
		fn(e)
		return true
	})
}

// set caches u as stream's change: at revision rev, or with no revision of its own when rev
// is 0. It returns the object u replaced, or nil.
func (s *store) set(stream string, u *object.Object, rev uint64) *object.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(stream, rev)
	return s.setLocked(u)
}

// remove drops u as stream's change, as set does; it returns the object it dropped, or nil.
func (s *store) remove(stream string, u *object.Object, rev uint64) *object.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(stream, rev)
	return s.removeLocked(u)
}

// bookmark notes that stream has every change through rev.
func (s *store) bookmark(stream string, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(stream, rev)
}

// advance publishes stream's changes through rev, or, with rev 0, freezes what snapshots show
// before a change with no revision of its own is applied.
func (s *store) advance(stream string, rev uint64) {
	if rev == 0 {
		if s.frozen == nil {
			snap := s.snapshotLocked()
			s.frozen = &snap
		}
		return
	}
	s.thaw()
	s.revs[stream] = max(s.revs[stream], rev)
}

// thaw lets snapshots show the store as it is again.
func (s *store) thaw() { s.frozen = nil }

func (s *store) setLocked(u *object.Object) *object.Object {
	e := entry{key: s.probeLocked(u.GetNamespace(), u.GetName()), obj: u}
	old, had := s.t.Get(e)
	if had { // the key the index entries share
		e.key = old.key
	} else {
		e.key = strings.Clone(e.key)
	}
	s.t.ReplaceOrInsert(e)
	if !had {
		s.index(e)
		return nil
	}
	s.reindex(old, e)
	return old.obj
}

// probeLocked is namespace and name's key (storeKey) in a buffer the store reuses: for a
// lookup under mu, not to be kept.
func (s *store) probeLocked(namespace, name string) string {
	s.probe = appendKey(s.probe[:0], namespace, name)
	return unsafe.String(unsafe.SliceData(s.probe), len(s.probe))
}

// ownValue is v as index ix keeps it: the string of an entry of ix that has the same value
// (the objects under one value share it), or else a copy.
func ownValue(ix *btree.BTreeG[indexed], v string) string {
	owned := ""
	ix.AscendGreaterOrEqual(indexed{value: v}, func(i indexed) bool {
		if i.value == v {
			owned = i.value
		}
		return false
	})
	if owned == "" && v != "" {
		owned = strings.Clone(v)
	}
	return owned
}

// reindex moves old's place in the indexes to e, the same object changed: only the values
// one has and the other has not change an index.
func (s *store) reindex(old, e entry) {
	for i, name := range s.indexes {
		ix := s.idx[name]
		was, is := old.obj.IndexValueCount(i), e.obj.IndexValueCount(i) // each sorted, without repeats
		for j, k := 0, 0; j < was || k < is; {
			var a, b string
			if j < was {
				a = old.obj.IndexValue(i, j)
			}
			if k < is {
				b = e.obj.IndexValue(i, k)
			}
			switch {
			case k == is || (j < was && a < b):
				ix.Delete(indexed{value: a, key: e.key})
				j++
			case j == was || b < a:
				ix.ReplaceOrInsert(indexed{value: ownValue(ix, b), key: e.key})
				k++
			default:
				j, k = j+1, k+1
			}
		}
	}
}

func (s *store) removeLocked(u *object.Object) *object.Object {
	old, had := s.t.Delete(entry{key: s.probeLocked(u.GetNamespace(), u.GetName())})
	if !had {
		return nil
	}
	s.unindex(old)
	return old.obj
}

// index adds e under its values of the store's indexers; an object made without them (see
// NewObject) is in none.
func (s *store) index(e entry) {
	for i, name := range s.indexes {
		ix := s.idx[name]
		for j := range e.obj.IndexValueCount(i) {
			ix.ReplaceOrInsert(indexed{value: ownValue(ix, e.obj.IndexValue(i, j)), key: e.key})
		}
	}
}

func (s *store) unindex(e entry) {
	for i, name := range s.indexes {
		for j := range e.obj.IndexValueCount(i) {
			s.idx[name].Delete(indexed{value: e.obj.IndexValue(i, j), key: e.key})
		}
	}
}

// snapshot is what the store shows now, in O(1).
func (s *store) snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen != nil {
		return *s.frozen
	}
	return s.snapshotLocked()
}

// get is the object namespace/name as snapshots show it now, without taking one: a snapshot
// makes the next changes copy the nodes they touch.
func (s *store) get(namespace, name string) (*object.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen != nil {
		return s.frozen.Get(namespace, name)
	}
	e, ok := s.t.Get(entry{key: s.probeLocked(namespace, name)})
	return e.obj, ok
}

// current is what the store holds now, changes with no revision yet included.
func (s *store) current() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked()
}

func (s *store) snapshotLocked() Snapshot {
	snap := Snapshot{t: s.t.Clone(), idx: make(map[string]*btree.BTreeG[indexed], len(s.idx)), revs: make(map[string]uint64, len(s.revs))}
	for name, t := range s.idx {
		snap.idx[name] = t.Clone()
	}
	for stream, rev := range s.revs {
		snap.revs[stream] = rev
	}
	return snap
}

// Snapshot is a resource's cache as it was at one moment: its objects in list order (by
// namespace, then name, cluster-scoped objects first), by the values of its indexers, and the
// revision each of its streams had reached. Its objects are shared with the cache: callers must
// not modify them. The zero Snapshot holds nothing.
type Snapshot struct {
	t    *btree.BTreeG[entry]
	idx  map[string]*btree.BTreeG[indexed]
	revs map[string]uint64
	// by restricts Scan to one value of one index.
	by *restriction
}

// restriction is one value of one index.
type restriction struct{ index, value string }

// Revision is the resourceVersion the snapshot shows namespace's objects at: every change up to
// it and none after. With one stream for every namespace (or a namespace it has a stream of
// its own for) that is exact; for every namespace ("") of a resource watched in several, it is
// the oldest of their revisions, and objects of the others may be newer.
func (s Snapshot) Revision(namespace string) uint64 {
	if rev, ok := s.revs[namespace]; ok {
		return rev
	}
	var oldest uint64
	first := true
	for _, rev := range s.revs {
		if first || rev < oldest {
			oldest, first = rev, false
		}
	}
	return oldest
}

// OneStream reports whether the resource is watched in one stream, for every namespace or for
// its one namespace: its changes then come in resourceVersion order.
func (s Snapshot) OneStream() bool { return len(s.revs) == 1 }

// Exact reports whether Revision(namespace) is exact: the resource is watched in one stream for
// every namespace, or namespace has a stream of its own.
func (s Snapshot) Exact(namespace string) bool {
	_, ok := s.revs[namespace]
	return ok
}

// Get is the object namespace/name ("" namespace for a cluster-scoped object).
func (s Snapshot) Get(namespace, name string) (*object.Object, bool) {
	if s.t == nil {
		return nil, false
	}
	e, ok := s.t.Get(entry{key: storeKey(namespace, name)})
	return e.obj, ok
}

// Len is how many objects the snapshot holds.
func (s Snapshot) Len() int {
	if s.t == nil {
		return 0
	}
	return s.t.Len()
}

// ByIndex is the snapshot restricted to the objects whose configured indexer index has value,
// still in list order; false when the resource has no such indexer.
func (s Snapshot) ByIndex(index, value string) (Snapshot, bool) {
	if _, ok := s.idx[index]; !ok {
		return Snapshot{}, false
	}
	s.by = &restriction{index: index, value: value}
	return s, true
}

// Scan calls fn with the objects of namespace ("" for every namespace) that come after the
// object namespace/name of after ("" for none; a cluster-scoped object's is its name), in
// order, until fn returns false.
func (s Snapshot) Scan(namespace string, after Key, fn func(*object.Object) bool) {
	if s.t == nil {
		return
	}
	prefix := keyPrefix(namespace)
	from, skip := prefix, ""
	if after != (Key{}) {
		skip = storeKey(after.Namespace, after.Name)
		from = max(from, skip)
	}
	visit := func(e entry) bool {
		if !strings.HasPrefix(e.key, prefix) {
			return false
		}
		if e.key == skip {
			return true
		}
		return fn(e.obj)
	}
	if s.by == nil {
		s.t.AscendGreaterOrEqual(entry{key: from}, visit)
		return
	}
	s.idx[s.by.index].AscendGreaterOrEqual(indexed{value: s.by.value, key: from}, func(x indexed) bool {
		if x.value != s.by.value {
			return false
		}
		e, ok := s.t.Get(entry{key: x.key})
		return !ok || visit(e) // an index holds only keys its snapshot's objects have
	})
}

// Key names an object of a resource: its namespace ("" when cluster-scoped) and name.
type Key struct {
	Namespace, Name string
}

// NewSnapshot builds a snapshot of objects held outside a cache, for code that pages them the
// way it pages a cache's.
func NewSnapshot(objs ...*object.Object) Snapshot {
	s := newStore(nil)
	for _, u := range objs {
		s.setLocked(u)
	}
	return Snapshot{t: s.t}
}
