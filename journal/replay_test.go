package journal

import (
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/object"
)

// recorder is a sink that selects everything and keeps what it is handed.
type recorder struct {
	name    string
	initial bool
	entries []Entry
}

func (r *recorder) Name() string                     { return r.name }
func (*recorder) Selects(object.Event) (bool, error) { return true, nil }
func (r *recorder) Queue(e Entry)                    { r.entries = append(r.entries, e) }
func (r *recorder) InitialState() bool               { return r.initial }

// cluster is a resource's objects as an informer's cache holds them, changed through the
// journal as the informer's handlers would, and paged as Resource.Page pages them.
type cluster struct {
	t       *testing.T
	j       *Journal
	objects map[string]*unstructured.Unstructured // by cache key
	rev     uint64
	uids    int
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, objects: map[string]*unstructured.Unstructured{}, rev: 100}
}

// set creates or changes the configmap name, and records the event.
func (c *cluster) set(name string) {
	c.rev++
	old := c.objects["ns/"+name]
	uid := ""
	if old != nil {
		uid = string(old.GetUID())
	} else {
		c.uids++
		uid = fmt.Sprintf("uid-%d", c.uids)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "uid": uid, "resourceVersion": strconv.FormatUint(c.rev, 10)}}}
	c.objects["ns/"+name] = u
	e := object.Event{Type: object.Added, Resource: configmaps, Object: object.New(u), Revision: c.rev, InOrder: true}
	if old != nil {
		e.Type, e.OldObject = object.Modified, object.New(old)
	}
	c.j.OnEvent(e)
}

// del deletes the configmap name, and records the event.
func (c *cluster) del(name string) {
	c.rev++
	u := c.objects["ns/"+name].DeepCopy()
	u.SetResourceVersion(strconv.FormatUint(c.rev, 10))
	delete(c.objects, "ns/"+name)
	c.j.OnEvent(object.Event{Type: object.Deleted, Resource: configmaps, Object: object.New(u), Revision: c.rev, InOrder: true})
}

// list records a start's initial list: ListStarted, every object, ListSynced.
func (c *cluster) list(run uint64) {
	c.j.ListStarted(configmaps, run, []string{""})
	for _, k := range slices.Sorted(maps.Keys(c.objects)) {
		u := c.objects[k]
		c.j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: object.New(u), InitialList: true, Revision: object.Revision(u.GetResourceVersion())})
	}
	c.j.ListSynced(configmaps, run, c.rev)
	flush(c.t, c.j)
}

// status is where tg's replay stands, once the journal has seen tg.
func (c *cluster) status(tg Target) ReplayStatus {
	c.t.Helper()
	reply := make(chan ReplayStatus, 1)
	c.j.submit(op{kind: opReplayStatus, control: &control{target: tg, status: reply}})
	flush(c.t, c.j)
	return <-reply
}

// page hands tg the next n objects after st's cursor, as Page reads them, and returns where
// the replay stands then.
func (c *cluster) page(tg Target, st ReplayStatus, n int) ReplayStatus {
	c.t.Helper()
	var objs []*object.Object
	keys := slices.SortedFunc(maps.Keys(c.objects), object.CompareKeys)
	for _, k := range keys {
		if (st.After == "" || object.CompareKeys(k, st.After) > 0) && len(objs) < n+1 {
			objs = append(objs, object.New(c.objects[k]))
		}
	}
	more := len(objs) > n
	if more {
		objs = objs[:n]
	}
	done := c.j.ReplayPage(tg, st.Resource, objs, !more)
	flush(c.t, c.j)
	<-done
	return c.status(tg)
}

// checkOnceAddedThenChanges checks what a sink was handed against the cluster's objects: each
// object's entries begin with one ADDED and follow in increasing revisions, the last one
// being the object as it is now (or its DELETED, or nothing, for one gone).
func (c *cluster) checkOnceAddedThenChanges(entries []Entry) {
	c.t.Helper()
	byKey := map[string][]Entry{}
	for _, e := range entries {
		k := object.KeyOf(e.Event.Object)
		byKey[k] = append(byKey[k], e)
	}
	for k, es := range byKey {
		live := false
		for i, e := range es {
			switch {
			case e.Event.Type == object.Added && live:
				c.t.Errorf("%s: ADDED again at revision %d without a DELETED: %s", k, e.Revision, describe(es))
			case e.Event.Type != object.Added && !live:
				c.t.Errorf("%s: %s at revision %d before any ADDED: %s", k, e.Event.Type, e.Revision, describe(es))
			case i > 0 && e.Revision <= es[i-1].Revision:
				c.t.Errorf("%s: revisions out of order: %s", k, describe(es))
			}
			live = e.Event.Type != object.Deleted
		}
	}
	for k, u := range c.objects {
		es := byKey[k]
		if len(es) == 0 {
			c.t.Errorf("%s (revision %s) was never handed to the sink", k, u.GetResourceVersion())
			continue
		}
		if last := es[len(es)-1]; last.Event.Type == object.Deleted || last.Event.Object.GetResourceVersion() != u.GetResourceVersion() {
			c.t.Errorf("%s is at revision %s; the sink's last entry is %s", k, u.GetResourceVersion(), describe(es[len(es)-1:]))
		}
	}
}

func describe(es []Entry) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%s@%d", e.Event.Type, e.Revision))
	}
	return fmt.Sprint(s)
}

func openJournal(t *testing.T, path string, targets *[]Target) *Journal {
	t.Helper()
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Path: path,
		Targets: func() []Target { return *targets }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// TestASinkAddedLaterGetsEachObjectOnceAsAddedThenItsChanges replays 30 objects to a sink
// added by a reload, three at a time, while objects before the cursor, at it and after it are
// created, changed and deleted between the pages: the new sink is handed each object once as
// ADDED, then its later changes in order, and ends with every object as it is; the sink
// configured before it is handed nothing old.
func TestASinkAddedLaterGetsEachObjectOnceAsAddedThenItsChanges(t *testing.T) {
	for _, store := range []bool{true, false} {
		t.Run(fmt.Sprintf("store %v", store), func(t *testing.T) {
			path := ""
			if store {
				path = filepath.Join(t.TempDir(), "state.db")
			}
			old := &recorder{name: "old"}
			targets := []Target{old}
			c := newCluster(t)
			c.j = openJournal(t, path, &targets)
			for i := range 30 {
				c.set(fmt.Sprintf("obj-%02d", i))
			}
			c.list(1)
			before := len(old.entries)

			late := &recorder{name: "late", initial: true}
			targets = append(targets, late)
			st := c.status(late)
			if st.Done || st.Resource != configmaps || st.After != "" {
				t.Fatalf("a sink added with initialState: replay %+v; want configmaps from the start", st)
			}
			if _, ok := c.j.Checkpoints()["late"][configmaps]; ok {
				t.Errorf("a checkpoint for configmaps before the sink's replay of it is done: %v", c.j.Checkpoints())
			}
			step := 0
			for !st.Done {
				st = c.page(late, st, 3)
				step++
				cursor := st.After
				if cursor == "" {
					continue
				}
				_, name := object.SplitKey(cursor)
				c.set(name)                            // at the cursor: replayed, so delivered
				c.set("obj-00")                        // before it
				c.set("obj-29")                        // after it: not yet replayed
				c.set(fmt.Sprintf("new-%02d", step))   // created after it (n > o)
				c.set(fmt.Sprintf("a-new-%02d", step)) // created before it
				if k := fmt.Sprintf("obj-%02d", 10+step); c.objects["ns/"+k] != nil && step%2 == 0 {
					c.del(k) // ahead of the cursor, or behind it
				}
				flush(t, c.j)
			}
			c.set("obj-05")
			c.del("obj-06")
			flush(t, c.j)
			c.checkOnceAddedThenChanges(late.entries)
			if _, ok := c.j.Checkpoints()["late"][configmaps]; !ok && store {
				t.Errorf("no checkpoint for configmaps once the replay is done: %v", c.j.Checkpoints())
			}
			for _, e := range old.entries[before:] {
				if e.Event.Type == object.Added && object.Revision(e.Event.Object.GetResourceVersion()) <= 130 {
					t.Errorf("the sink configured before was handed an old object: %s", e.Key)
				}
			}
		})
	}
}

// TestAReplayCutShortByARestartResumesAtItsCursor: the store keeps where a sink's replay
// stands; after a restart, with objects changed while dynwatch was down, the replay goes on
// from the cursor and the sink ends with each object once as ADDED, then its changes.
func TestAReplayCutShortByARestartResumesAtItsCursor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	old := &recorder{name: "old"}
	targets := []Target{old}
	c := newCluster(t)
	c.j = openJournal(t, path, &targets)
	for i := range 20 {
		c.set(fmt.Sprintf("obj-%02d", i))
	}
	c.list(1)
	late := &recorder{name: "late", initial: true}
	targets = append(targets, late)
	st := c.status(late)
	for range 3 {
		st = c.page(late, st, 4)
	}
	if err := c.j.Close(); err != nil {
		t.Fatal(err)
	}

	// Down: one replayed object and one not yet replayed change, one of each is deleted.
	c.rev++
	for _, name := range []string{"obj-02", "obj-15"} {
		u := c.objects["ns/"+name].DeepCopy()
		c.rev++
		u.SetResourceVersion(strconv.FormatUint(c.rev, 10))
		c.objects["ns/"+name] = u
	}
	delete(c.objects, "ns/obj-03")
	delete(c.objects, "ns/obj-16")

	handed := late.entries
	late = &recorder{name: "late", initial: true}
	targets = []Target{old, late}
	c.j = openJournal(t, path, &targets)
	c.list(2)
	st = c.status(late)
	if st.Done || st.After != "ns/obj-11" {
		t.Fatalf("after the restart the replay is at %+v; want after ns/obj-11", st)
	}
	for !st.Done {
		st = c.page(late, st, 4)
	}
	c.checkOnceAddedThenChanges(append(handed, late.entries...))
}

// TestWhichSinksReplay: a sink replays when it is new to a store that has seen sinks before
// (a restart with a new sink, or a reload); not the sinks of a first start, whose initial
// lists hand them everything, nor a sink seen before that turns initialState on.
func TestWhichSinksReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	a := &recorder{name: "a", initial: true}
	targets := []Target{a}
	c := newCluster(t)
	c.j = openJournal(t, path, &targets)
	c.set("x")
	c.list(1)
	if st := c.status(a); !st.Done {
		t.Errorf("a sink of the first start replays: %+v", st)
	}
	b := &recorder{name: "b"}
	targets = append(targets, b)
	if st := c.status(b); !st.Done {
		t.Errorf("a sink without initialState replays: %+v", st)
	}
	if err := c.j.Close(); err != nil {
		t.Fatal(err)
	}

	b = &recorder{name: "b", initial: true}
	n := &recorder{name: "n", initial: true}
	targets = []Target{a, b, n}
	c.j = openJournal(t, path, &targets)
	c.list(2)
	if st := c.status(b); !st.Done {
		t.Errorf("a sink seen before that turns initialState on replays: %+v", st)
	}
	if st := c.status(n); st.Done {
		t.Errorf("a sink new to a store that has seen others does not replay")
	}
	// Removed, then configured again: it is new.
	c.j.RemoveTarget(a)
	targets = []Target{b, n}
	c.j.retired = func(Target) {}
	flush(t, c.j)
	a = &recorder{name: "a", initial: true}
	targets = append(targets, a)
	if st := c.status(a); st.Done {
		t.Errorf("a sink removed and configured again does not replay")
	}
}
