package dynamicinformer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
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

// host is what a Resource needs of the Manager that runs it: its logger and clock, the
// subscribers its events go to and a number for each start of its informers, where its
// informers read from, and the gate that holds their reading back.
type host interface {
	logger() *slog.Logger
	clock() time.Time
	subscribed() []Subscriber
	nextRun() uint64
	sourceOf(gvr schema.GroupVersionResource, metadataOnly bool) source
	jsonClient() rest.Interface
	metadataClient() metadata.Interface
	checkPeriod() time.Duration
	checkPageSize() int64
	waitRoom(ctx context.Context) error
	gated(w watch.Interface, x *expiry) watch.Interface
	Nudge()
}

// Resource is one configured resource and, while the apiserver serves it, its informers.
type Resource struct {
	cfg  *config.Resource
	name string
	m    host
	// parent is the whole group this resource is a member of; nil for a configured one.
	parent *Resource
	// members are a whole group's resources, in name order; guarded by the Manager's mu.
	members []*Resource

	objects      atomic.Int64 // objects in the cache, counted as changes are applied
	lastEvent    atomic.Int64 // unix nanoseconds of the last event, 0 if none
	events       map[object.EventType]counter
	relistEvents map[object.EventType]counter
	watchErrs    counter
	checks       map[string]counter // consistency checks, by result
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
	// consistency is the last consistency check's outcome; nil before the first.
	consistency *Consistency
	stop        context.CancelFunc
	done        sync.WaitGroup
}

type namespaceInformer struct {
	namespace  string
	controller cache.Controller
	health     *health
	moves      *moves
	expiry     *expiry // nil without a consistency check
}

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
		r.m.logger().Info("resource state changed", "resource", r.name, "state", s, "reason", reason)
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
	// A namespaceSelector's cache follows a selection of its own, which the apiserver's list
	// at the cache's resourceVersion knows nothing of: such a cache is not checked.
	checked := r.m.checkPeriod() > 0 && sel == nil
	unstructuredOnly := sel != nil
	var objectType runtime.Object = &wire{}
	if unstructuredOnly {
		objectType = &unstructured.Unstructured{}
	}
	for _, ns := range namespaces {
		ni := namespaceInformer{namespace: ns, health: &health{}, moves: &moves{}}
		if checked {
			ni.expiry = newExpiry()
		}
		ni.controller = cache.New(&cache.Config{
			Queue: cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
				Transformer:           ingest(r.cfg, ix, gvk),
				AtomicEvents:          true,
				UnlockWhileProcessing: true,
				EmitDeltaTypeBookmark: true,
			}),
			ListerWatcher:                r.listWatch(r.objectsOf(gvr, gvk, src, ns, unstructuredOnly), src, tweak, ni, sel),
			ObjectType:                   objectType,
			FullResyncPeriod:             r.cfg.Resync,
			WatchErrorHandlerWithContext: r.onWatchError,
			Process:                      r.process(gvr, ns, ni.moves, st),
		})
		informers = append(informers, ni)
	}
	ctx, cancel := context.WithCancel(ctx)
	run := r.m.nextRun()
	for _, s := range r.m.subscribed() {
		if o, ok := s.(ListObserver); ok {
			o.ListStarted(gvr, run, slices.Clone(namespaces))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gvr, r.api = gvr, api
	r.informers, r.selection, r.store, r.stop, r.lastError = informers, sel, st, cancel, ""
	r.state, r.reason, r.consistency = StateSyncing, "", nil
	if checked {
		r.done.Go(func() { r.checkConsistency(ctx, gvr, st, informers) })
	}
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
		for _, s := range r.m.subscribed() {
			if o, ok := s.(ListObserver); ok {
				o.ListSynced(gvr, run, revision)
			}
		}
	})
	r.m.logger().Info("resource informers started", "resource", r.name, "gvr", object.ResourceName(gvr), "namespaces", r.cfg.Namespaces)
	return nil
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
	r.m.logger().Info("resource informers stopped", "resource", r.name)
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
	// Consistency is the outcome of the last consistency check, until the informers stop.
	Consistency *Consistency `json:"consistency,omitempty"`
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
	if c := r.consistency; c != nil {
		cc := *c
		s.Consistency = &cc
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
