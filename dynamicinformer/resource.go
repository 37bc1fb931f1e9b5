package dynamicinformer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// State is where a configured resource is in its life.
type State string

// The states of a Resource.
const (
	// StatePending: discovery has not run yet.
	StatePending State = "Pending"
	// StateNotServed: the apiserver does not serve the resource (its CRD is not installed, or
	// was deleted). Discovery keeps looking for it.
	StateNotServed State = "NotServed"
	// StateInvalid: the apiserver serves the resource, but the configuration cannot apply to
	// it (namespaces on a cluster-scoped resource, no list/watch verbs, a duplicate).
	StateInvalid State = "Invalid"
	// StateSyncing: informers run and have not yet delivered their initial list.
	StateSyncing State = "Syncing"
	// StateSynced: informers run and every handler has seen the initial list.
	StateSynced State = "Synced"
	// StateStale: informers have synced, but their list and watch have kept failing
	// (forbidden, not found, unreachable) for longer than the resource's staleAfter. The cache
	// holds the last data seen; queries are answered from it with a Warning. A member of a
	// whole group is Stale too when its initial list has failed that long.
	StateStale State = "Stale"
	// StateExpanded: a whole group (resource: "*") whose group discovery serves: each of its
	// members is a resource of its own.
	StateExpanded State = "Expanded"
)

// Resource is one configured resource and, while the apiserver serves it, its informers.
type Resource struct {
	cfg  *config.Resource
	name string
	m    *Manager
	// parent is the whole group this resource is a member of; nil for a configured one.
	parent *Resource
	// members are a whole group's resources, in name order; guarded by the Manager's mu.
	members []*Resource

	objects      atomic.Int64 // objects in the cache, counted by the handlers
	lastEvent    atomic.Int64 // unix nanoseconds of the last event, 0 if none
	events       map[EventType]counter
	relistEvents map[EventType]counter
	watchErrs    counter

	// emitting is read-held by the handlers around each update of the order and its event,
	// and held by Page: see snapshot.go.
	emitting sync.RWMutex

	mu        sync.RWMutex
	state     State
	reason    string
	lastError string
	gvr       schema.GroupVersionResource
	api       metav1.APIResource // as discovery serves it
	informers []namespaceInformer
	selection *selection // the namespaces namespaceSelector selects; nil without one
	order     *order     // the informers' objects in list order, kept by their handlers
	stop      context.CancelFunc
	done      sync.WaitGroup
}

type namespaceInformer struct {
	namespace    string
	informer     cache.SharedIndexInformer
	registration cache.ResourceEventHandlerRegistration
	health       *health
	relist       *relisted
}

// health is whether an informer's calls to the apiserver succeed: since when they have failed,
// and with what, or zero since the last success.
type health struct {
	mu      sync.Mutex
	since   time.Time
	lastErr string
}

func (h *health) observe(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.since, h.lastErr = time.Time{}, ""
	case h.since.IsZero():
		h.since, h.lastErr = time.Now(), err.Error()
	default:
		h.lastErr = err.Error()
	}
}

// failing returns how long calls have failed and the last error, or zero.
func (h *health) failing(now time.Time) (time.Duration, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		return 0, ""
	}
	return now.Sub(h.since), h.lastErr
}

type counter interface{ Inc() }

// Name is the resource as configured, in resource.version.group form.
func (r *Resource) Name() string { return r.name }

// Config is the resource's configuration.
func (r *Resource) Config() *config.Resource { return r.cfg }

// State returns the resource's current state.
func (r *Resource) State() State {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.stateLocked()
}

func (r *Resource) stateLocked() State {
	st, _ := r.stateReasonLocked()
	return st
}

// stateReasonLocked is the state, and the reason for it.
func (r *Resource) stateReasonLocked() (State, string) {
	if r.state != StateSyncing {
		return r.state, r.reason
	}
	for _, ni := range r.informers {
		if !ni.registration.HasSynced() {
			return r.syncingLocked()
		}
	}
	if r.selection != nil {
		if _, synced, _ := r.selection.snapshot(); !synced {
			return StateSyncing, r.reason
		}
	}
	if failing, why := r.failingLocked(); failing > r.cfg.StaleAfter {
		return StateStale, fmt.Sprintf("list and watch have failed for %s (staleAfter %s): %s", failing.Round(time.Second), r.cfg.StaleAfter, why)
	}
	return StateSynced, r.reason
}

// failingLocked is the longest time any of the informers has been failing, and its last error.
func (r *Resource) failingLocked() (time.Duration, string) {
	var longest time.Duration
	var why string
	now := time.Now()
	healths := make([]*health, 0, len(r.informers)+1)
	for _, ni := range r.informers {
		healths = append(healths, ni.health)
	}
	if r.selection != nil {
		healths = append(healths, r.selection.health)
	}
	for _, h := range healths {
		if d, err := h.failing(now); d > longest {
			longest, why = d, err
		}
	}
	return longest, why
}

func (r *Resource) running() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.stop != nil
}

func (r *Resource) setState(s State, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != s || r.reason != reason {
		r.m.log.Info("resource state changed", "resource", r.name, "state", s, "reason", reason)
	}
	r.state, r.reason = s, reason
}

// start runs the resource's informers for gvr until ctx ends or stopInformers is called.
func (r *Resource) start(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, api metav1.APIResource) error {
	namespaces := r.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	labelSelector, fieldSelector := r.cfg.Labels.String(), r.cfg.Exclusions().String()
	tweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labelSelector
		o.FieldSelector = fieldSelector
	}
	informers := make([]namespaceInformer, 0, len(namespaces))
	ord := newOrder(configuredIndexers(r.cfg))
	var sel *selection
	if r.cfg.Namespaced != nil {
		sel = newSelection()
	}
	for _, ns := range namespaces {
		h := &health{}
		inf, relist := r.newInformer(client.Resource(gvr), ns, tweak, h, sel)
		if err := inf.SetTransform(NewTransform(r.cfg)); err != nil {
			return fmt.Errorf("set transform: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(r.onWatchError); err != nil {
			return fmt.Errorf("set watch error handler: %w", err)
		}
		reg, err := inf.AddEventHandler(r.handler(gvr, ns, relist, ord))
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		informers = append(informers, namespaceInformer{namespace: ns, informer: inf, registration: reg, health: h, relist: relist})
	}
	ctx, cancel := context.WithCancel(ctx)
	run := r.m.runs.Add(1)
	for _, s := range r.m.subscribers {
		if o, ok := s.(ListObserver); ok {
			o.ListStarted(gvr, run, slices.Clone(namespaces))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gvr, r.api = gvr, api
	r.informers, r.selection, r.order, r.stop, r.lastError = informers, sel, ord, cancel, ""
	r.state, r.reason = StateSyncing, ""
	if sel != nil {
		r.done.Go(func() { sel.run(ctx, client, r.cfg.NamespaceSelector) })
	}
	synced := make([]cache.InformerSynced, 0, len(informers))
	for _, ni := range informers {
		r.done.Go(func() { ni.informer.RunWithContext(ctx) })
		synced = append(synced, ni.registration.HasSynced)
	}
	r.done.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		// Each informer's last synced resourceVersion is now that of its initial list or later.
		var revision uint64
		for _, ni := range informers {
			revision = max(revision, object.Revision(ni.informer.LastSyncResourceVersion()))
		}
		for _, s := range r.m.subscribers {
			if o, ok := s.(ListObserver); ok {
				o.ListSynced(gvr, run, revision)
			}
		}
	})
	r.m.log.Info("resource informers started", "resource", r.name, "gvr", object.ResourceName(gvr), "namespaces", r.cfg.Namespaces)
	return nil
}

// errRelistByList makes a reflector that relists fall back from a watch-list stream to a
// LIST, whose items newInformer compares with the cache.
var errRelistByList = errors.New("dynwatch relists with LIST")

// newInformer builds an informer as client-go's dynamic informer does, except that a relist
// (a list after the informer has synced: after a watch expired or the apiserver restarted)
// is a LIST whose changed objects it notes, so that the events it produces can be counted.
// Every list and watch call's outcome goes to h. With sel, only the objects of the namespaces
// it selects enter the cache, and its changes are brought in as they happen.
func (r *Resource) newInformer(resource dynamic.NamespaceableResourceInterface, namespace string, tweak func(*metav1.ListOptions), h *health, sel *selection) (cache.SharedIndexInformer, *relisted) {
	var inf cache.SharedIndexInformer
	client := resource.Namespace(namespace)
	relist := &relisted{}
	selected := &applied{}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			if sel != nil && o.Continue == "" {
				// Every page of the list is filtered by the selection as it is at its start.
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				relist.selectionApplied(cur.rev, true)
			}
			list, err := client.List(ctx, o)
			if ctx.Err() == nil {
				h.observe(err)
			}
			if err == nil {
				r.dropExcluded(list, sel, selected)
			}
			if err == nil && inf.HasSynced() {
				relist.note(o.Continue == "", list, inf.GetIndexer())
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			initial := o.SendInitialEvents != nil && *o.SendInitialEvents
			if initial && inf.HasSynced() {
				return nil, errRelistByList
			}
			if sel != nil && initial {
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				relist.selectionApplied(cur.rev, true)
			}
			w, err := client.Watch(ctx, o)
			if ctx.Err() == nil {
				h.observe(err)
			}
			if err == nil && sel != nil {
				opts := metav1.ListOptions{}
				tweak(&opts)
				sw := &selectWatch{in: w, out: make(chan watch.Event), stop: make(chan struct{}), r: r, client: resource, opts: opts, sel: sel, state: selected, relist: relist, initial: initial}
				go sw.run(ctx, o.ResourceVersion)
				return sw, nil
			}
			if err == nil && len(r.cfg.ExcludedGlobs) > 0 {
				w = watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
					u, ok := e.Object.(*unstructured.Unstructured)
					return e, !ok || !r.cfg.Excludes(u.GetNamespace())
				})
			}
			return w, err
		},
	}
	inf = cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{
		ResyncPeriod: r.cfg.Resync,
		Indexers:     NewIndexers(r.cfg),
	})
	return inf, relist
}

// selectionWait bounds how long a list waits for the namespaces a namespaceSelector selects
// to be listed; past it the list fails, naming why, and the reflector tries again.
const selectionWait = 10 * time.Second

// dropExcluded removes from a list the objects of the namespaces the resource's
// excludeNamespaces globs match (the apiserver has left out the named ones already) and, with
// sel, of the namespaces not in the selection the list started with.
func (r *Resource) dropExcluded(list *unstructured.UnstructuredList, sel *selection, selected *applied) {
	if len(r.cfg.ExcludedGlobs) == 0 && sel == nil {
		return
	}
	var names members
	if sel != nil {
		names = selected.get().names
	}
	list.Items = slices.DeleteFunc(list.Items, func(u unstructured.Unstructured) bool {
		if _, ok := names[u.GetNamespace()]; sel != nil && !ok {
			return true
		}
		return r.cfg.Excludes(u.GetNamespace())
	})
}

// relisted holds the objects a relist found changed, by cache key, until their events pass,
// and the relist's resourceVersion.
type relisted struct {
	mu       sync.Mutex
	changed  map[string]string // key → resourceVersion
	revision uint64
	moved    map[string]moved // objects that came in or went out with their namespace
	// applied is the namespace selection's revision the watch has brought the cache to, and
	// emitted the one through which the handler has emitted the events of doing so.
	applied, emitted uint64
}

// moved is an object, at resourceVersion rv, that came in or went out of the cache with its
// namespace, as a namespaceSelector changed somewhere from since to at (see Event.Since).
type moved struct {
	rv        string
	since, at uint64
}

// note records the objects of one page of a relist that differ from the cache.
func (x *relisted) note(first bool, list runtime.Object, cached cache.Indexer) {
	items, ok := list.(*unstructured.UnstructuredList)
	if !ok {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if first || x.changed == nil {
		x.changed = map[string]string{}
		x.revision = object.Revision(items.GetResourceVersion())
	}
	for i := range items.Items {
		u := &items.Items[i]
		key := object.KeyOf(u)
		if old, ok, _ := cached.GetByKey(key); ok {
			if o, ok := old.(*unstructured.Unstructured); ok && o.GetResourceVersion() == u.GetResourceVersion() {
				continue
			}
		}
		x.changed[key] = u.GetResourceVersion()
	}
}

// move notes that u comes in or goes out because its namespace joined or left the selection
// between revisions since and at.
func (x *relisted) move(u *unstructured.Unstructured, since, at uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.moved == nil {
		x.moved = map[string]moved{}
	}
	x.moved[object.KeyOf(u)] = moved{rv: u.GetResourceVersion(), since: since, at: at}
}

// movedWith reports whether u, as it is, came in or went out with its namespace, and when (see
// move), and forgets it.
func (x *relisted) movedWith(u *unstructured.Unstructured) (moved, bool) {
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
func (x *relisted) selectionApplied(rev uint64, restart bool) {
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

// selectionEmitted is the namespace selection's revision through which the handler has emitted
// every event of its changes.
func (x *relisted) selectionEmitted() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.emitted
}

// listRevision is the last relist's resourceVersion.
func (x *relisted) listRevision() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.revision
}

// take reports whether u, as it is, was found changed by a relist, and forgets it.
func (x *relisted) take(u *unstructured.Unstructured) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.changed) == 0 {
		return false
	}
	key := object.KeyOf(u)
	if rv, ok := x.changed[key]; ok && rv == u.GetResourceVersion() {
		delete(x.changed, key)
		return true
	}
	return false
}

// stopInformers stops the informers, waits for them, and drops their caches.
func (r *Resource) stopInformers() {
	r.mu.Lock()
	stop := r.stop
	r.stop = nil
	r.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	r.done.Wait()
	r.mu.Lock()
	r.informers, r.selection, r.order = nil, nil, nil
	r.mu.Unlock()
	r.objects.Store(0)
	r.m.log.Info("resource informers stopped", "resource", r.name)
}

func (r *Resource) onWatchError(ctx context.Context, reflector *cache.Reflector, err error) {
	r.watchErrs.Inc()
	r.mu.Lock()
	r.lastError = err.Error()
	r.mu.Unlock()
	cache.DefaultWatchErrorHandler(ctx, reflector, err)
	if apierrors.IsNotFound(err) {
		// The resource may have gone away (CRD deleted): let discovery decide, now.
		r.m.Nudge()
	}
}

// handler turns the notifications of stream's informer into Events, keeping ord up to date
// first. It never blocks on I/O. Events a relist produced (the object noted by relist, or a
// delete known only from a tombstone) are counted, and are not in order.
func (r *Resource) handler(gvr schema.GroupVersionResource, stream string, relist *relisted, ord *order) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			r.emitting.RLock()
			defer r.emitting.RUnlock()
			if u, ok := obj.(*unstructured.Unstructured); ok {
				ord.set(u)
				r.objects.Add(1)
				inOrder := !isInInitialList
				if inOrder && relist.take(u) {
					r.relistEvents[Added].Inc()
					inOrder = false
				}
				e := Event{Type: Added, Resource: gvr, Object: u, InitialList: isInInitialList, Stream: stream, Revision: object.Revision(u.GetResourceVersion()), InOrder: inOrder}
				movedIn(&e, relist)
				r.emit(e)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			r.emitting.RLock()
			defer r.emitting.RUnlock()
			o, ok1 := oldObj.(*unstructured.Unstructured)
			n, ok2 := newObj.(*unstructured.Unstructured)
			var m moved
			var movedWith bool
			if ok2 {
				ord.set(n) // also when unchanged: a relist's copy replaced the cached one
				m, movedWith = relist.movedWith(n)
			}
			if !ok1 || !ok2 || o.GetResourceVersion() == n.GetResourceVersion() {
				return // a resync, relist or transition of an unchanged object
			}
			inOrder := true
			if relist.take(n) {
				r.relistEvents[Modified].Inc()
				inOrder = false
			}
			e := Event{Type: Modified, Resource: gvr, Object: n, OldObject: o, Stream: stream, Revision: object.Revision(n.GetResourceVersion()), InOrder: inOrder}
			if movedWith {
				e.Since, e.Revision, e.InOrder = m.since, m.at, false
			}
			r.emit(e)
		},
		DeleteFunc: func(obj any) {
			r.emitting.RLock()
			defer r.emitting.RUnlock()
			tombstone, fromRelist := obj.(cache.DeletedFinalStateUnknown)
			if fromRelist {
				obj = tombstone.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				ord.delete(u)
				r.objects.Add(-1)
				// A watch's delete carries the deletion's resourceVersion; a tombstone the
				// object's last known one: the deletion happened after it, by the relist's.
				e := Event{Type: Deleted, Resource: gvr, Object: u, Stream: stream, Revision: object.Revision(u.GetResourceVersion()), InOrder: !fromRelist}
				if fromRelist {
					r.relistEvents[Deleted].Inc()
					e.Since, e.Revision = object.After(e.Revision), relist.listRevision()
				}
				movedIn(&e, relist)
				r.emit(e)
			}
		},
	}
}

// movedIn makes e, if its object came in or went out with its namespace (see selectWatch), a
// change between the selection's two revisions: it is not in the order of the watch.
func movedIn(e *Event, relist *relisted) {
	if m, ok := relist.movedWith(e.Object); ok {
		e.Since, e.Revision, e.InOrder = m.since, m.at, false
	}
}

func (r *Resource) emit(e Event) {
	e.Observed = r.m.now()
	r.lastEvent.Store(e.Observed.UnixNano())
	r.events[e.Type].Inc()
	for _, s := range r.m.subscribers {
		s.OnEvent(e)
	}
}

// Status is a resource's state as reported by /status.
type Status struct {
	Resource   string     `json:"resource"`
	Group      string     `json:"group"`
	Version    string     `json:"version"`
	Plural     string     `json:"plural,omitempty"`
	Kind       string     `json:"kind,omitempty"`
	Namespaced bool       `json:"namespaced"`
	Namespaces []string   `json:"namespaces"`
	State      State      `json:"state"`
	Synced     bool       `json:"synced"`
	Reason     string     `json:"reason,omitempty"`
	Objects    int64      `json:"objects"`
	Indexers   []string   `json:"indexers"`
	LastEvent  *time.Time `json:"lastEventTime,omitempty"`
	LastError  string     `json:"lastError,omitempty"`
	// Entry is, for a member of a whole group, that group's entry (*.version.group).
	Entry string `json:"entry,omitempty"`
	// Members are, for a whole group, the resources it watches now.
	Members []string `json:"members,omitempty"`
}

// Status reports the resource's state, object count, indexers, last event and last error.
func (r *Resource) Status() Status {
	r.mu.RLock()
	defer r.mu.RUnlock()
	st, reason := r.stateReasonLocked()
	s := Status{
		Resource:   r.name,
		Group:      r.cfg.Group,
		Version:    r.cfg.Version,
		Plural:     r.gvr.Resource,
		Kind:       r.api.Kind,
		Namespaced: r.api.Namespaced,
		Namespaces: append([]string{}, r.cfg.Namespaces...),
		State:      st,
		Synced:     st == StateSynced,
		Reason:     reason,
		Objects:    r.objects.Load(),
		Indexers:   []string{config.NamespaceIndex},
		LastError:  r.lastError,
	}
	if r.parent != nil {
		s.Entry = r.parent.name
	}
	for _, ix := range r.cfg.Indexers {
		s.Indexers = append(s.Indexers, ix.Name)
	}
	if ns := r.lastEvent.Load(); ns != 0 {
		t := time.Unix(0, ns).UTC()
		s.LastEvent = &t
	}
	return s
}
