package dynamicinformer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/object"
)

// namespacesGVR is what a namespaceSelector selects among.
var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// members is a set of namespace names.
type members map[string]struct{}

// selection is the set of namespaces a resource's namespaceSelector selects, followed by a
// reflector over the Namespaces the selector matches: the apiserver adds a namespace when it
// starts matching and deletes it when it stops matching or is deleted. It is the reflector's
// store; it keeps names only.
type selection struct {
	health *health

	mu      sync.Mutex
	names   members
	rev     uint64 // the resourceVersion of the last change to names: when it happened
	synced  bool
	changed chan struct{} // closed when names change, then replaced
}

func newSelection() *selection {
	return &selection{health: &health{}, names: members{}, changed: make(chan struct{})}
}

// run follows the namespaces sel selects until ctx ends.
func (s *selection) run(ctx context.Context, client dynamic.Interface, sel string) {
	ns := client.Resource(namespacesGVR)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			list, err := ns.List(ctx, o)
			if ctx.Err() == nil {
				s.health.observe(err)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			w, err := ns.Watch(ctx, o)
			if ctx.Err() == nil {
				s.health.observe(err)
			}
			return w, err
		},
	}
	cache.NewReflectorWithOptions(lw, &unstructured.Unstructured{}, s, cache.ReflectorOptions{Name: "namespaces selected by " + sel}).RunWithContext(ctx)
}

// snapshot returns the selected namespaces, whether they have been listed yet, and a channel
// closed at their next change.
func (s *selection) snapshot() (members, bool, <-chan struct{}) {
	v := s.view()
	return v.names, v.synced, v.changed
}

// selected is the selection at one moment: the namespaces, the resourceVersion of their last
// change, whether they have been listed yet, and a channel closed at their next change.
type selected struct {
	names   members
	rev     uint64
	synced  bool
	changed <-chan struct{}
}

func (s *selection) view() selected {
	s.mu.Lock()
	defer s.mu.Unlock()
	return selected{names: s.names, rev: s.rev, synced: s.synced, changed: s.changed}
}

// wait returns the selection once it has been listed, or an error naming why it has not been
// within timeout.
func (s *selection) wait(ctx context.Context, timeout time.Duration) (selected, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		v := s.view()
		if v.synced {
			return v, nil
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return selected{}, ctx.Err()
		case <-deadline.C:
			_, why := s.health.failing(time.Now())
			if why == "" {
				why = "not listed yet"
			}
			return selected{}, fmt.Errorf("namespaces of namespaceSelector: %s", why)
		}
	}
}

// set replaces the selected namespaces, as they are at resourceVersion rv, and wakes whoever
// waits for a change.
func (s *selection) set(rv string, update func(members) members) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := update(maps.Clone(s.names))
	if s.synced && maps.Equal(next, s.names) {
		return
	}
	s.names, s.synced, s.rev = next, true, max(s.rev, object.Revision(rv))
	close(s.changed)
	s.changed = make(chan struct{})
}

// nameOf is a namespace's name and resourceVersion.
func nameOf(obj any) (string, string) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		return m.GetName(), m.GetResourceVersion()
	}
	return "", ""
}

// The cache.Store the reflector fills: only what the reflector calls does anything.

func (s *selection) Add(obj any) error {
	name, rv := nameOf(obj)
	s.set(rv, func(m members) members { m[name] = struct{}{}; return m })
	return nil
}

func (s *selection) Update(obj any) error { return s.Add(obj) }

func (s *selection) Delete(obj any) error {
	name, rv := nameOf(obj)
	s.set(rv, func(m members) members { delete(m, name); return m })
	return nil
}

func (s *selection) Replace(items []any, rv string) error {
	s.set(rv, func(members) members {
		m := members{}
		for _, obj := range items {
			name, _ := nameOf(obj)
			m[name] = struct{}{}
		}
		return m
	})
	return nil
}

func (s *selection) List() []any { return nil }

func (s *selection) ListKeys() []string {
	names, _, _ := s.snapshot()
	return slices.Sorted(maps.Keys(names))
}

func (s *selection) Get(obj any) (any, bool, error) {
	name, _ := nameOf(obj)
	return s.GetByKey(name)
}

func (s *selection) GetByKey(key string) (any, bool, error) {
	names, _, _ := s.snapshot()
	_, ok := names[key]
	return nil, ok, nil
}

func (s *selection) Resync() error { return nil }

// applied is the selection the objects in an informer's cache reflect: the one its last list
// was filtered by, then each change its watches brought in.
type applied struct {
	mu  sync.Mutex
	cur selected
}

func (a *applied) get() selected {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

func (a *applied) put(cur selected) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cur = cur
}

// selectWatch passes on the events of the watch under it for the objects of the namespaces in
// its selection, and brings the cache along when the selection changes: it lists the objects
// of each namespace that joined (passed on as ADDED) and of each that left (passed on as
// DELETED), then a bookmark of the revision the watch has reached. If it cannot (the revision
// is not known yet, a list fails) it ends with an Expired error, and the reflector lists again.
//
// Where a change is placed in the watch depends on when the selection's own watch reported it,
// which differs between replicas; what each replica makes of it must not lose anything. A
// namespace changed at some revision t after the selection's last applied revision and by its
// current one, cur. One that joined has its objects listed as they were at the later of the
// watch's revision and cur, and its watch events up to that revision dropped, so nothing of it
// from before t is passed on; one that left has its objects listed at the watch's revision, as
// the cache holds them. Their events carry the range from just after the last applied revision
// to that later one (object.Event.Since and Revision), which holds t on every replica.
type selectWatch struct {
	*relay
	r       *Resource
	client  source
	opts    metav1.ListOptions // the informer's selectors
	sel     *selection
	state   *applied
	moves   *moves            // notes what a transition moves, for the processing
	listed  map[string]uint64 // namespaces that joined → the revision their objects were listed at
	initial bool              // a watch-list stream's initial events are still coming
}

// selectionDebounce is how often, at most, a watch brings in the changes of its selection: a
// namespace relabelled in and out many times a second costs one transition a second, and one
// that leaves and comes back within it none. It bounds what a tenant allowed to label its own
// namespace can make every sink receive.
const selectionDebounce = time.Second

// run passes events on until the watch under it ends or Stop. rv is the revision the watch
// starts from. The selection's changes are brought in at most once every selectionDebounce:
// one that comes sooner waits, and what has changed by then is brought in at once.
func (w *selectWatch) run(ctx context.Context, rv string) {
	defer close(w.out)
	defer w.in.Stop()
	cur := w.state.get()
	debounce := time.NewTimer(selectionDebounce)
	debounce.Stop()
	defer debounce.Stop()
	var due <-chan time.Time // a change waits out the debounce
	var last time.Time       // when the last change was brought in
	for {
		var changed <-chan struct{}
		if !w.initial && due == nil {
			changed = cur.changed
		}
		select {
		case <-w.stop:
			return
		case <-changed:
			if wait := selectionDebounce - time.Since(last); wait > 0 {
				w.r.transitions.deferred.Inc()
				debounce.Reset(wait)
				due = debounce.C
				continue
			}
			if !w.bringIn(ctx, rv, &cur) {
				return
			}
			last = time.Now()
		case <-due:
			due = nil
			if !w.bringIn(ctx, rv, &cur) {
				return
			}
			last = time.Now()
		case e, ok := <-w.in.ResultChan():
			if !ok {
				return
			}
			u, isObject := e.Object.(*unstructured.Unstructured)
			if isObject && e.Type != watch.Error {
				rv = u.GetResourceVersion()
			}
			if e.Type == watch.Bookmark && u != nil && u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				w.initial = false
			}
			if isObject && (e.Type == watch.Added || e.Type == watch.Modified || e.Type == watch.Deleted) && !w.passes(cur.names, u) {
				continue
			}
			if !w.send(e) {
				return
			}
		}
	}
}

// bringIn brings the selection as it is now into the watch, from cur, which it then sets to
// it; false when the watch is to end: stopped, or unable to (it has then sent an Expired
// error, and the reflector lists again).
func (w *selectWatch) bringIn(ctx context.Context, rv string, cur *selected) bool {
	next := w.sel.view()
	if err := w.transition(ctx, rv, *cur, next); errors.Is(err, errStopped) {
		return false
	} else if err != nil {
		w.r.m.logger().Info("namespace selection changed: listing again", "resource", w.r.name, "err", err)
		status := apierrors.NewResourceExpired(fmt.Sprintf("namespace selection changed, and %v", err)).ErrStatus
		w.send(watch.Event{Type: watch.Error, Object: &status})
		return false
	}
	w.r.transitions.applied.Inc()
	*cur = next
	w.state.put(next)
	w.moves.selectionApplied(next.rev, false)
	return true
}

// passes reports whether an event of u goes on: its namespace is selected, not excluded, and
// the event is not one its listing as it joined already holds.
func (w *selectWatch) passes(names members, u *unstructured.Unstructured) bool {
	ns := u.GetNamespace()
	if _, ok := names[ns]; !ok || w.r.cfg.Excludes(ns) {
		return false
	}
	if at, ok := w.listed[ns]; ok {
		if object.Revision(u.GetResourceVersion()) <= at {
			return false
		}
		delete(w.listed, ns) // the watch is past the listing
	}
	return true
}

var errStopped = errors.New("watch stopped")

// transition brings the namespaces that joined (in next, not in was) in as ADDED and takes
// those that left out as DELETED, then passes on a bookmark of rv, the revision the watch has
// reached: it goes on from there. The selection changed after was.rev, by next.rev; the objects
// that joined are listed at the later of rv and next.rev, those that left at rv (as the cache
// holds them), and both carry the range from just after was.rev to that later revision.
func (w *selectWatch) transition(ctx context.Context, rv string, was, next selected) error {
	pos := object.Revision(rv)
	if pos == 0 {
		return errors.New("the watch has no revision yet")
	}
	since, at := object.After(was.rev), max(pos, next.rev)
	for ns := range w.listed {
		if _, ok := next.names[ns]; !ok {
			delete(w.listed, ns)
		}
	}
	for _, step := range []struct {
		from, to members
		typ      watch.EventType
		rv       uint64
	}{{next.names, was.names, watch.Added, at}, {was.names, next.names, watch.Deleted, pos}} {
		for _, ns := range slices.Sorted(maps.Keys(step.from)) {
			if _, ok := step.to[ns]; ok || w.r.cfg.Excludes(ns) {
				continue
			}
			if err := w.listAt(ctx, ns, step.rv, since, at, step.typ); err != nil {
				return err
			}
			if step.typ == watch.Added && at > pos {
				if w.listed == nil {
					w.listed = map[string]uint64{}
				}
				w.listed[ns] = at
			}
		}
	}
	bookmark := &unstructured.Unstructured{}
	bookmark.SetResourceVersion(rv)
	if !w.send(watch.Event{Type: watch.Bookmark, Object: bookmark}) {
		return errStopped
	}
	return nil
}

// listPage bounds what a transition holds at once.
const listPage = 500

// listAt passes on every object of namespace ns, as it was at exactly revision rv, as an
// event of typ, each noted as moved between since and at.
func (w *selectWatch) listAt(ctx context.Context, ns string, rv, since, at uint64, typ watch.EventType) error {
	o := w.opts
	o.ResourceVersion, o.ResourceVersionMatch, o.Limit = strconv.FormatUint(rv, 10), metav1.ResourceVersionMatchExact, listPage
	for {
		list, err := w.client.Namespace(ns).List(ctx, o)
		if err != nil {
			return fmt.Errorf("list namespace %s at resourceVersion %d: %w", ns, rv, err)
		}
		for i := range list.Items {
			w.moves.move(&list.Items[i], since, at)
			if !w.send(watch.Event{Type: typ, Object: &list.Items[i]}) {
				return errStopped
			}
		}
		if list.GetContinue() == "" {
			return nil
		}
		o.Continue, o.ResourceVersion, o.ResourceVersionMatch = list.GetContinue(), "", ""
	}
}
