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
	"k8s.io/apimachinery/pkg/api/meta"
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
	// StateSynced: informers run and their initial lists are in the cache.
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

	objects      atomic.Int64 // objects in the cache, counted as changes are applied
	lastEvent    atomic.Int64 // unix nanoseconds of the last event, 0 if none
	events       map[object.EventType]counter
	relistEvents map[object.EventType]counter
	watchErrs    counter
	// transitions count a namespaceSelector's changes applied, and those that waited out
	// selectionDebounce (see selectWatch.run).
	transitions struct{ applied, deferred counter }

	// emitting is read-held by the informers' processing around each change to the store and
	// its events, and held by Read: see snapshot.go.
	emitting sync.RWMutex

	mu        sync.RWMutex
	state     State
	reason    string
	lastError string
	gvr       schema.GroupVersionResource
	api       metav1.APIResource // as discovery serves it
	informers []namespaceInformer
	selection *selection // the namespaces namespaceSelector selects; nil without one
	store     *store     // the informers' objects, kept by their processing
	stop      context.CancelFunc
	done      sync.WaitGroup
}

type namespaceInformer struct {
	namespace  string
	controller cache.Controller
	health     *health
	moves      *moves
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

// errListEnded is a watch-list stream that ended before its initial events did. client-go's
// Watch returns such a stream, empty and already closed, rather than an error, when the
// connection to the apiserver fails.
var errListEnded = errors.New("the list's stream ended before its initial events")

// observeList passes on the events of w, a watch-list stream, and reports its outcome to h: a
// success once its initial events have ended, else the error that ended it.
func observeList(ctx context.Context, w watch.Interface, h *health) watch.Interface {
	o := newRelay(w)
	go func() {
		defer close(o.out)
		defer w.Stop()
		listed, err := false, errListEnded
		for e := range w.ResultChan() {
			switch {
			case listed:
			case e.Type == watch.Error:
				err = apierrors.FromObject(e.Object)
			case e.Type == watch.Bookmark:
				if m, aerr := meta.Accessor(e.Object); aerr == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					listed = true
					h.observe(nil)
				}
			}
			if !o.send(e) {
				return
			}
		}
		if !listed && ctx.Err() == nil {
			h.observe(err)
		}
	}()
	return o
}

// relay is a watch that passes on, from its own goroutine, what it makes of the watch under
// it (in; nil when that goroutine opens and stops the watch itself): that goroutine sends to
// out until stop.
type relay struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newRelay(in watch.Interface) *relay {
	return &relay{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
}

func (o *relay) ResultChan() <-chan watch.Event { return o.out }

func (o *relay) Stop() {
	o.once.Do(func() {
		close(o.stop)
		if o.in != nil {
			o.in.Stop()
		}
	})
}

// send passes e on, and reports false once the watch is stopped.
func (o *relay) send(e watch.Event) bool {
	select {
	case o.out <- e:
		return true
	case <-o.stop:
		return false
	}
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
		if !ni.controller.HasSynced() {
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
	src := r.m.sourceOf(gvr, r.cfg.MetadataOnly())
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
	ix := indexersOf(r.cfg)
	st := newStore(ix)
	gvk := gvr.GroupVersion().WithKind(api.Kind)
	if r.cfg.MetadataOnly() {
		gvk = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata") // what the cache keeps
	}
	var sel *selection
	if r.cfg.Namespaced != nil {
		sel = newSelection()
	}
	unstructuredOnly := sel != nil
	var objectType runtime.Object = &wire{}
	if unstructuredOnly {
		objectType = &unstructured.Unstructured{}
	}
	for _, ns := range namespaces {
		ni := namespaceInformer{namespace: ns, health: &health{}, moves: &moves{}}
		ni.controller = cache.New(&cache.Config{
			Queue: cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
				Transformer:           ingest(r.cfg, ix, gvk),
				AtomicEvents:          true,
				UnlockWhileProcessing: true,
				EmitDeltaTypeBookmark: true,
			}),
			ListerWatcher:                r.listWatch(r.objectsOf(gvr, gvk, src, ns, unstructuredOnly), src, tweak, ni.health, sel, ni.moves),
			ObjectType:                   objectType,
			FullResyncPeriod:             r.cfg.Resync,
			WatchErrorHandlerWithContext: r.onWatchError,
			Process:                      r.process(gvr, ns, ni.moves, st),
		})
		informers = append(informers, ni)
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
	r.informers, r.selection, r.store, r.stop, r.lastError = informers, sel, st, cancel, ""
	r.state, r.reason = StateSyncing, ""
	if sel != nil {
		r.done.Go(func() { sel.run(ctx, client, r.cfg.NamespaceSelector) })
	}
	synced := make([]cache.InformerSynced, 0, len(informers))
	for _, ni := range informers {
		r.done.Go(func() { ni.controller.RunWithContext(ctx) })
		synced = append(synced, ni.controller.HasSynced)
	}
	r.done.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		// Each informer's last synced resourceVersion is now that of its initial list or later.
		var revision uint64
		for _, ni := range informers {
			revision = max(revision, object.Revision(ni.controller.LastSyncResourceVersion()))
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

// listWatch lists and watches the resource in one namespace through client, as client-go's
// dynamic informer does. Every list and watch call's outcome goes to h. With sel, only the
// objects of the namespaces it selects are passed on, and its changes are brought in as they
// happen, listed through src (see selectWatch).
func (r *Resource) listWatch(client objects, src source, tweak func(*metav1.ListOptions), h *health, sel *selection, mv *moves) *cache.ListWatch {
	selected := &applied{}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			if o.Continue == "" {
				if err := r.m.waitRoom(ctx); err != nil {
					return nil, err
				}
			}
			if sel != nil && o.Continue == "" {
				// Every page of the list is filtered by the selection as it is at its start.
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				mv.selectionApplied(cur.rev, true)
			}
			list, err := client.List(ctx, o)
			if ctx.Err() == nil {
				h.observe(err)
			}
			if err == nil {
				r.dropExcluded(list, sel, selected)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			if err := r.m.waitRoom(ctx); err != nil {
				return nil, err
			}
			initial := o.SendInitialEvents != nil && *o.SendInitialEvents
			if sel != nil && initial {
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				mv.selectionApplied(cur.rev, true)
			}
			w, err := client.Watch(ctx, o)
			switch {
			case err == nil && initial:
				w = observeList(ctx, w, h)
			case ctx.Err() == nil:
				h.observe(err)
			}
			if err == nil && sel != nil {
				opts := metav1.ListOptions{}
				tweak(&opts)
				sw := &selectWatch{relay: newRelay(w), r: r, client: src, opts: opts, sel: sel, state: selected, moves: mv, initial: initial}
				go sw.run(ctx, o.ResourceVersion)
				return r.m.gated(sw), nil
			}
			if err != nil {
				return nil, err
			}
			if len(r.cfg.ExcludedGlobs) > 0 {
				w = watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
					o, ok := e.Object.(interface{ GetNamespace() string })
					return e, !ok || e.Type == watch.Bookmark || !r.cfg.Excludes(o.GetNamespace())
				})
			}
			return r.m.gated(w), nil
		},
	}
}

// selectionWait bounds how long a list waits for the namespaces a namespaceSelector selects
// to be listed; past it the list fails, naming why, and the reflector tries again.
const selectionWait = 10 * time.Second

// dropExcluded removes from a list the objects of the namespaces the resource's
// excludeNamespaces globs match (the apiserver has left out the named ones already) and, with
// sel, of the namespaces not in the selection the list started with.
func (r *Resource) dropExcluded(list runtime.Object, sel *selection, selected *applied) {
	if len(r.cfg.ExcludedGlobs) == 0 && sel == nil {
		return
	}
	var names members
	if sel != nil {
		names = selected.get().names
	}
	drop := func(namespace string) bool {
		if _, ok := names[namespace]; sel != nil && !ok {
			return true
		}
		return r.cfg.Excludes(namespace)
	}
	switch list := list.(type) {
	case *unstructured.UnstructuredList:
		list.Items = slices.DeleteFunc(list.Items, func(u unstructured.Unstructured) bool { return drop(u.GetNamespace()) })
	case *wireList:
		list.Items = slices.DeleteFunc(list.Items, func(w *wire) bool { return drop(w.Namespace) })
	}
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
	r.informers, r.selection, r.store = nil, nil, nil
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
