package dynamicinformer

import (
	"slices"
	"sync"

	"github.com/google/btree"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/object"
)

// orderDegree is the B-tree's degree: nodes of up to 63 items, a few cache lines of pointers.
const orderDegree = 32

// entry is one cached object in list order.
type entry struct {
	namespace, name string
	obj             *unstructured.Unstructured
}

// lessEntry orders entries in list order.
func lessEntry(a, b entry) bool { return object.Compare(a.namespace, a.name, b.namespace, b.name) < 0 }

// order keeps a resource's cached objects sorted by namespace and name, and the objects of
// each value of each configured indexer too, so that a page is read in order instead of sorted
// per request. The handlers update it before they emit an event: whoever has seen an event
// finds the object in order.
type order struct {
	mu      sync.Mutex
	t       *btree.BTreeG[entry]
	indexes cache.Indexers                             // the configured indexers
	byValue map[string]map[string]*btree.BTreeG[entry] // index → value → its objects in order
}

// newOrder keeps objects in order, and by the values of indexes.
func newOrder(indexes cache.Indexers) *order {
	return &order{t: btree.NewG(orderDegree, lessEntry), indexes: indexes, byValue: map[string]map[string]*btree.BTreeG[entry]{}}
}

func (o *order) set(u *unstructured.Unstructured) {
	e := entry{namespace: u.GetNamespace(), name: u.GetName(), obj: u}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, had := o.t.ReplaceOrInsert(e); had {
		o.unindex(old)
	}
	o.index(e)
}

func (o *order) delete(u *unstructured.Unstructured) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, had := o.t.Delete(entry{namespace: u.GetNamespace(), name: u.GetName()}); had {
		o.unindex(old)
	}
}

// values are e's values for the index f; an object the index function fails on is in none.
func values(f cache.IndexFunc, e entry) []string {
	vs, err := f(e.obj)
	if err != nil {
		return nil
	}
	slices.Sort(vs)
	return slices.Compact(vs)
}

func (o *order) index(e entry) {
	for name, f := range o.indexes {
		for _, v := range values(f, e) {
			trees := o.byValue[name]
			if trees == nil {
				trees = map[string]*btree.BTreeG[entry]{}
				o.byValue[name] = trees
			}
			t := trees[v]
			if t == nil {
				t = btree.NewG(orderDegree, lessEntry)
				trees[v] = t
			}
			t.ReplaceOrInsert(e)
		}
	}
}

func (o *order) unindex(e entry) {
	for name, f := range o.indexes {
		for _, v := range values(f, e) {
			if t := o.byValue[name][v]; t != nil {
				t.Delete(e)
				if t.Len() == 0 {
					delete(o.byValue[name], v)
				}
			}
		}
	}
}

// snapshotIndex is, in O(1), the objects whose index has value, in order.
func (o *order) snapshotIndex(index, value string) Ordered {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t := o.byValue[index][value]; t != nil {
		return Ordered{t: t.Clone()}
	}
	return Ordered{}
}

// snapshot is the order as it is now, in O(1): the tree is shared copy-on-write, so later
// changes copy the few nodes they touch and do not show in the snapshot.
func (o *order) snapshot() Ordered {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Ordered{t: o.t.Clone()}
}

// Ordered is a snapshot of a resource's cached objects in list order: by namespace, then name,
// cluster-scoped objects first. Its objects are shared with the cache: callers must not modify
// them.
type Ordered struct {
	t *btree.BTreeG[entry]
}

// Scan calls fn with the objects of namespace ("" for every namespace) that come after the
// object namespace/name of after ("" for none; a cluster-scoped object's is its name), in
// order, until fn returns false.
func (s Ordered) Scan(namespace string, after Key, fn func(*unstructured.Unstructured) bool) {
	if s.t == nil {
		return
	}
	from := entry{namespace: namespace}
	if after != (Key{}) && !lessEntry(entry{namespace: after.Namespace, name: after.Name}, from) {
		from = entry{namespace: after.Namespace, name: after.Name}
	}
	s.t.AscendGreaterOrEqual(from, func(e entry) bool {
		if namespace != "" && e.namespace != namespace {
			return false
		}
		if after != (Key{}) && e.namespace == after.Namespace && e.name == after.Name {
			return true
		}
		return fn(e.obj)
	})
}

// Key names an object of a resource: its namespace ("" when cluster-scoped) and name.
type Key struct {
	Namespace, Name string
}

// NewOrdered builds a snapshot of objects held outside a cache, for code that pages them the
// way it pages a cache's.
func NewOrdered(objs ...*unstructured.Unstructured) Ordered {
	o := newOrder(nil)
	for _, u := range objs {
		o.set(u)
	}
	return Ordered{t: o.t}
}
