package dynamicinformer

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// orderChecker checks, on every event, that the resource's order already shows it: whoever has
// seen an event finds the object (this very object) in a page, or no longer finds it.
type orderChecker struct {
	r    func() *Resource
	mu   sync.Mutex
	errs []string
}

func (c *orderChecker) OnEvent(e object.Event) {
	r := c.r()
	if r == nil {
		return
	}
	var found *object.Object
	r.Snapshot().Scan(e.Object.GetNamespace(), Key{}, func(o *object.Object) bool {
		if o.GetName() == e.Object.GetName() {
			found = o
			return false
		}
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Type == object.Deleted && found != nil {
		c.errs = append(c.errs, fmt.Sprintf("%s is still in order after its DELETED event", object.KeyOf(e.Object)))
	} else if e.Type != object.Deleted && found != e.Object {
		c.errs = append(c.errs, fmt.Sprintf("%s in order is %p, not the %s event's object %p", object.KeyOf(e.Object), found, e.Type, e.Object))
	}
}

func orderedKeys(s Snapshot, namespace string, after Key) []string {
	var keys []string
	s.Scan(namespace, after, func(o *object.Object) bool {
		keys = append(keys, object.KeyOf(o))
		return true
	})
	return keys
}

// TestOrderFollowsTheCacheAndSnapshotsStayPut runs a resource over two namespaces through
// creates, updates and deletes: each event finds the order already updated, the order holds
// exactly what the cache holds sorted by namespace and name, and so does each value of an
// indexer (an object whose label changes moves between values), a snapshot does not change
// when the cache does, and a scan resumes after any key, within a namespace or across all.
func TestOrderFollowsTheCacheAndSnapshotsStayPut(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 2)
	var res sync.Map
	check := &orderChecker{r: func() *Resource {
		if r, ok := res.Load("r"); ok {
			return r.(*Resource)
		}
		return nil
	}}
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%s, %s]
    indexers: [{name: byTouched, type: label, key: touched}]
`, ns[1], ns[0]), check)
	r := resource(t, m, "configmaps.v1")
	res.Store("r", r)
	waitReady(t, m)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for i := range 20 {
		create(t, configMap(ns[i%2], fmt.Sprintf("cm-%02d", 19-i), nil))
	}
	for i := 0; i < 20; i += 3 {
		cm := configMap(ns[(19-i)%2], fmt.Sprintf("cm-%02d", i), map[string]string{"touched": "yes"})
		if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	moved := configMap(ns[(19-3)%2], "cm-03", map[string]string{"touched": "no"}) // from "yes" to "no"
	if _, err := cs.CoreV1().ConfigMaps(moved.Namespace).Update(t.Context(), moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var want, touched []string
	for i := range 20 {
		if i%3 == 0 && i%4 != 0 && i != 3 {
			touched = append(touched, fmt.Sprintf("%s/cm-%02d", ns[(19-i)%2], i))
		}
		if i%4 == 0 {
			if err := cs.CoreV1().ConfigMaps(ns[(19-i)%2]).Delete(t.Context(), fmt.Sprintf("cm-%02d", i), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want = append(want, fmt.Sprintf("%s/cm-%02d", ns[(19-i)%2], i))
	}
	byKey := func(a, b string) int {
		an, aname, _ := strings.Cut(a, "/")
		bn, bname, _ := strings.Cut(b, "/")
		return strings.Compare(an, bn)*2 + strings.Compare(aname, bname)
	}
	slices.SortFunc(want, byKey)
	slices.SortFunc(touched, byKey)
	testbed.Eventually(t, 20*time.Second, func() error {
		if got := orderedKeys(r.Snapshot(), "", Key{}); !slices.Equal(got, want) {
			return fmt.Errorf("order holds %v, want %v", got, want)
		}
		yes, _ := r.Snapshot().ByIndex("byTouched", "yes")
		if got := orderedKeys(yes, "", Key{}); !slices.Equal(got, touched) {
			return fmt.Errorf("byTouched=yes holds %v, want %v", got, touched)
		}
		no, _ := r.Snapshot().ByIndex("byTouched", "no")
		if got := orderedKeys(no, "", Key{}); len(got) != 1 || got[0] != moved.Namespace+"/cm-03" {
			return fmt.Errorf("byTouched=no holds %v, want only cm-03", got)
		}
		return nil
	})
	check.mu.Lock()
	if len(check.errs) > 0 {
		t.Errorf("events seen before the order showed them:\n%s", strings.Join(check.errs, "\n"))
	}
	check.mu.Unlock()

	snap := r.Snapshot()
	if err := cs.CoreV1().ConfigMaps(ns[0]).DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 20*time.Second, func() error {
		if n, left := len(orderedKeys(r.Snapshot(), "", Key{})), len(orderedKeys(snap, ns[1], Key{})); n != left {
			return fmt.Errorf("order holds %d objects after %s was emptied, want %d", n, ns[0], left)
		}
		return nil
	})
	if got := orderedKeys(snap, "", Key{}); !slices.Equal(got, want) {
		t.Errorf("a snapshot changed with the cache: %v, want %v", got, want)
	}
	for i, k := range want {
		namespace, name, _ := strings.Cut(k, "/")
		if got := orderedKeys(snap, "", Key{namespace, name}); !slices.Equal(got, want[i+1:]) {
			t.Errorf("scan after %s = %v, want %v", k, got, want[i+1:])
		}
		var inNS []string
		for _, w := range want[i+1:] {
			if strings.HasPrefix(w, ns[1]+"/") {
				inNS = append(inNS, w)
			}
		}
		if got := orderedKeys(snap, ns[1], Key{namespace, name}); !slices.Equal(got, inNS) {
			t.Errorf("scan of %s after %s = %v, want %v", ns[1], k, got, inNS)
		}
	}
}

// TestASnapshotScansInListOrderAndResumesAfterAnyKey pages objects held outside a cache: list
// order is by namespace, then name, cluster-scoped objects first, whatever order they come in;
// a scan keeps to its namespace, resumes after a key whether or not an object has it, and stops
// when its function says so.
func TestASnapshotScansInListOrderAndResumesAfterAnyKey(t *testing.T) {
	obj := func(namespace, name string) *object.Object {
		u := &unstructured.Unstructured{}
		u.SetNamespace(namespace)
		u.SetName(name)
		return object.New(u)
	}
	s := NewSnapshot(obj("b", "y"), obj("a", "z"), obj("", "node-2"), obj("b", "x"), obj("a", "m"), obj("", "node-1"), obj("c", "a"))
	for _, tt := range []struct {
		name      string
		namespace string
		after     Key
		want      []string
	}{
		{"every namespace, from the start", "", Key{}, []string{"node-1", "node-2", "a/m", "a/z", "b/x", "b/y", "c/a"}},
		{"one namespace, from its start", "b", Key{}, []string{"b/x", "b/y"}},
		{"a namespace no object is in", "bb", Key{}, nil},
		{"every namespace, after a cluster-scoped key", "", Key{Name: "node-1"}, []string{"node-2", "a/m", "a/z", "b/x", "b/y", "c/a"}},
		{"every namespace, after the last key of a namespace", "", Key{"a", "z"}, []string{"b/x", "b/y", "c/a"}},
		{"every namespace, after a key no object has", "", Key{"a", "p"}, []string{"a/z", "b/x", "b/y", "c/a"}},
		{"one namespace, after one of its keys", "b", Key{"b", "x"}, []string{"b/y"}},
		{"one namespace, after a key of an earlier namespace", "b", Key{"a", "z"}, []string{"b/x", "b/y"}},
		{"one namespace, after a key of a later namespace", "b", Key{"c", "a"}, nil},
		{"one namespace, after its last key", "b", Key{"b", "y"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := orderedKeys(s, tt.namespace, tt.after); !slices.Equal(got, tt.want) {
				t.Errorf("Scan(%q, %v) = %v, want %v", tt.namespace, tt.after, got, tt.want)
			}
		})
	}
	var read []string
	s.Scan("", Key{}, func(u *object.Object) bool {
		read = append(read, object.KeyOf(u))
		return len(read) < 3
	})
	if want := []string{"node-1", "node-2", "a/m"}; !slices.Equal(read, want) {
		t.Errorf("a scan whose function returns false at the third object read %v, want %v", read, want)
	}
	if got := orderedKeys(Snapshot{}, "", Key{}); got != nil {
		t.Errorf("the zero Snapshot holds %v, want nothing", got)
	}
}

func cached(namespace, name string, rv int) *object.Object {
	u := &unstructured.Unstructured{}
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetResourceVersion(fmt.Sprint(rv))
	return object.New(u)
}

// keysAt is a snapshot's objects as namespace/name@resourceVersion, in order.
func keysAt(s Snapshot) []string {
	var keys []string
	for _, o := range scanned(s, "") {
		keys = append(keys, object.KeyOf(o)+"@"+o.GetResourceVersion())
	}
	return keys
}

// TestAStoreShowsEachChangeWithItsRevision: a snapshot shows every change through its revision
// and none after. A list is applied in one step at its revision, deleting what it no longer
// holds; a change with no revision of its own (an object that came in with its namespace) is
// not shown until the revision that follows it.
func TestAStoreShowsEachChangeWithItsRevision(t *testing.T) {
	s := newStore(nil)
	check := func(step string, wantRV uint64, want ...string) {
		t.Helper()
		snap := s.snapshot()
		if got := keysAt(snap); snap.Revision("") != wantRV || !slices.Equal(got, want) {
			t.Errorf("%s: snapshot at %d holds %v; want %d and %v", step, snap.Revision(""), got, wantRV, want)
		}
	}
	gone, changes := s.replace("", []*object.Object{cached("ns", "a", 5), cached("ns", "b", 6)}, 10)
	if len(gone) != 0 || len(changes) != 2 || changes[0].old != nil {
		t.Fatalf("the first list: %d gone, %d changes; want 0 and 2 additions", len(gone), len(changes))
	}
	check("after the list", 10, "ns/a@5", "ns/b@6")
	if old := s.set("", cached("ns", "a", 11), 11); old == nil || old.GetResourceVersion() != "5" {
		t.Errorf("an update replaced %v; want a@5", old)
	}
	check("after an update", 11, "ns/a@11", "ns/b@6")
	s.set("", cached("joined", "c", 3), 0)
	check("while an object comes in with its namespace", 11, "ns/a@11", "ns/b@6")
	s.bookmark("", 12)
	check("after the bookmark that follows it", 12, "joined/c@3", "ns/a@11", "ns/b@6")
	gone, _ = s.replace("", []*object.Object{cached("ns", "a", 11), cached("ns", "d", 13)}, 14)
	if got := keysAt(NewSnapshot(gone...)); !slices.Equal(got, []string{"joined/c@3", "ns/b@6"}) {
		t.Errorf("a relist deleted %v; want c and b", got)
	}
	check("after a relist", 14, "ns/a@11", "ns/d@13")
}

// TestAStoreKeepsARevisionPerStream: with a stream per namespace, each list replaces its own
// namespace's objects only; a namespace's revision is its stream's, and every namespace's is
// the oldest of them.
func TestAStoreKeepsARevisionPerStream(t *testing.T) {
	s := newStore(nil)
	s.replace("ns1", []*object.Object{cached("ns1", "x", 4)}, 5)
	s.replace("ns2", []*object.Object{cached("ns2", "y", 7)}, 8)
	s.set("ns2", cached("ns2", "y", 9), 9)
	snap := s.snapshot()
	if got := []uint64{snap.Revision("ns1"), snap.Revision("ns2"), snap.Revision("")}; !slices.Equal(got, []uint64{5, 9, 5}) {
		t.Errorf("revisions of ns1, ns2 and every namespace: %v; want [5 9 5]", got)
	}
	gone, _ := s.replace("ns1", nil, 10)
	if got := keysAt(s.snapshot()); len(gone) != 1 || !slices.Equal(got, []string{"ns2/y@9"}) {
		t.Errorf("ns1's empty relist deleted %d objects and left %v; want 1 and ns2/y@9", len(gone), got)
	}
}

// TestAnUpdateMovesAnObjectBetweenItsIndexValues: an object changed from the values a, b to b,
// c is found under b and c, as its new version, and no longer under a; deleted, under none.
func TestAnUpdateMovesAnObjectBetweenItsIndexValues(t *testing.T) {
	s := newStore([]object.Indexer{{Name: "byTag"}})
	tagged := func(rv int, tags ...string) *object.Object {
		return withValues(cached("ns", "a", rv), tags)
	}
	lookup := func(value string) []string {
		snap, ok := s.snapshot().ByIndex("byTag", value)
		if !ok {
			t.Fatalf("no index byTag")
		}
		return keysAt(snap)
	}
	check := func(step string, want map[string][]string) {
		t.Helper()
		for value, keys := range want {
			if got := lookup(value); !slices.Equal(got, keys) {
				t.Errorf("%s: byTag=%s holds %v, want %v", step, value, got, keys)
			}
		}
	}
	s.set("", tagged(1, "a", "b"), 1)
	check("added", map[string][]string{"a": {"ns/a@1"}, "b": {"ns/a@1"}, "c": nil})
	before := s.snapshot()
	s.set("", tagged(2, "b", "c"), 2)
	check("updated", map[string][]string{"a": nil, "b": {"ns/a@2"}, "c": {"ns/a@2"}})
	// An index holds keys: under b, which both versions have, a snapshot taken before the
	// change still finds the version it holds.
	if snap, _ := before.ByIndex("byTag", "b"); !slices.Equal(keysAt(snap), []string{"ns/a@1"}) {
		t.Errorf("a snapshot taken before the update finds %v under b; want [ns/a@1]", keysAt(snap))
	}
	s.set("", tagged(3), 3)
	check("updated to no values", map[string][]string{"a": nil, "b": nil, "c": nil})
	s.set("", tagged(4, "a", "c", "d"), 4)
	check("updated to three", map[string][]string{"a": {"ns/a@4"}, "b": nil, "c": {"ns/a@4"}, "d": {"ns/a@4"}})
	s.remove("", tagged(4, "a", "c", "d"), 5)
	check("deleted", map[string][]string{"a": nil, "c": nil, "d": nil})
}

// TestAnIndexDoesNotKeepAnUpdatedObjectsOldVersionAlive: an update that keeps an object's index
// values leaves its index entries as they are, so they must not hold anything of the version
// that made them. They held its namespace, name and values as substrings of its JSON, and so
// kept every updated object's old JSON alive beside the new one.
func TestAnIndexDoesNotKeepAnUpdatedObjectsOldVersionAlive(t *testing.T) {
	s := newStore([]object.Indexer{{Name: "byTag"}})
	version := func(rv int) *object.Object {
		o, err := object.FromJSON(fmt.Appendf(nil, `{"metadata":{"namespace":"ns","name":"a","resourceVersion":"%d","labels":{"tag":"x"}}}`, rv))
		if err != nil {
			t.Fatal(err)
		}
		return withValues(o, []string{o.Labels().Get("tag")}) // the label's value, read in place as an indexer's is
	}
	first := version(1)
	firstJSON := weak.Make(&first.JSON()[0])
	s.set("", first, 1)
	s.set("", version(2), 2)
	first = nil
	runtime.GC()
	if firstJSON.Value() != nil {
		t.Error("the first version's JSON is still alive after the update replaced it")
	}
	if snap, _ := s.snapshot().ByIndex("byTag", "x"); !slices.Equal(keysAt(snap), []string{"ns/a@2"}) {
		t.Errorf("byTag=x holds %v; want [ns/a@2]", keysAt(snap))
	}
}

// TestAStoreKeyOrdersAsTheAPIServerLists: keys compare as object.Compare compares their
// objects, where a namespace is a prefix of another, where one sorts below the other's
// separator, and for cluster-scoped objects.
func TestAStoreKeyOrdersAsTheAPIServerLists(t *testing.T) {
	keys := []Key{{"", "a"}, {"", "a-b"}, {"", "ab"}, {"a", "z"}, {"a-b", "a"}, {"a.b", ""}, {"ab", "a"}, {"b", "a"}, {"b", "a-"}, {"b", "a0"}}
	for _, a := range keys {
		for _, b := range keys {
			want := object.Compare(a.Namespace, a.Name, b.Namespace, b.Name)
			if got := strings.Compare(storeKey(a.Namespace, a.Name), storeKey(b.Namespace, b.Name)); got != want {
				t.Errorf("%v against %v: keys compare %d, objects %d", a, b, got, want)
			}
		}
	}
}

// TestAStoreKeepsLittlePerObject: what a store of three indexes keeps per object besides the
// objects, listed in order as an initial list comes: its key, its entry in the list order and
// one in each index (whose nodes a list in order leaves half full): 272 bytes. Entries of two
// strings and a pointer and index entries of three strings kept 384, and 408 once they kept
// copies of their own.
func TestAStoreKeepsLittlePerObject(t *testing.T) {
	s := newStore([]object.Indexer{{Name: "byApp"}, {Name: "byTeam"}, {Name: "byTier"}})
	const n = 10000
	objs := make([]*object.Object, n)
	for i := range objs {
		objs[i] = withValues(cached("shop", fmt.Sprintf("settings-%05d", i), i), []string{"web"}, []string{"storefront"}, []string{fmt.Sprint("tier-", i%3)})
	}
	perObject := keptPer(n, func() { s.replace("", objs, n) })
	t.Logf("a store keeps %d bytes per object besides the object", perObject)
	if perObject > 320 {
		t.Errorf("a store keeps %d bytes per object besides the object; want at most 320", perObject)
	}
	if snap, _ := s.snapshot().ByIndex("byTier", "tier-1"); snap.Len() != n || len(scanned(snap, "shop")) != n/3 {
		t.Errorf("byTier=tier-1 holds %d objects; want %d", len(scanned(snap, "shop")), n/3)
	}
	runtime.KeepAlive(s)
}
