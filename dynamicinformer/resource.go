package dynamicinformer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	kdynamicinformer "k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
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
)

// Resource is one configured resource and, while the apiserver serves it, its informers.
type Resource struct {
	cfg  *config.Resource
	name string
	m    *Manager

	objects   atomic.Int64 // objects in the cache, counted by the handlers
	lastEvent atomic.Int64 // unix nanoseconds of the last event, 0 if none
	events    map[EventType]counter
	watchErrs counter

	mu        sync.RWMutex
	state     State
	reason    string
	lastError string
	gvr       schema.GroupVersionResource
	api       metav1.APIResource // as discovery serves it
	informers []namespaceInformer
	stop      context.CancelFunc
	done      sync.WaitGroup
}

type namespaceInformer struct {
	namespace    string
	informer     cache.SharedIndexInformer
	registration cache.ResourceEventHandlerRegistration
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
	if r.state != StateSyncing {
		return r.state
	}
	for _, ni := range r.informers {
		if !ni.registration.HasSynced() {
			return StateSyncing
		}
	}
	return StateSynced
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
	labelSelector, fieldSelector := r.cfg.Labels.String(), r.cfg.Fields.String()
	tweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labelSelector
		o.FieldSelector = fieldSelector
	}
	handler := r.handler(gvr)
	informers := make([]namespaceInformer, 0, len(namespaces))
	for _, ns := range namespaces {
		inf := kdynamicinformer.NewFilteredDynamicInformer(client, gvr, ns, r.cfg.Resync, NewIndexers(r.cfg), tweak).Informer()
		if err := inf.SetTransform(NewTransform(r.cfg)); err != nil {
			return fmt.Errorf("set transform: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(r.onWatchError); err != nil {
			return fmt.Errorf("set watch error handler: %w", err)
		}
		reg, err := inf.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		informers = append(informers, namespaceInformer{namespace: ns, informer: inf, registration: reg})
	}
	ctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gvr, r.api = gvr, api
	r.informers, r.stop, r.lastError = informers, cancel, ""
	r.state, r.reason = StateSyncing, ""
	for _, ni := range informers {
		r.done.Go(func() { ni.informer.RunWithContext(ctx) })
	}
	r.m.log.Info("resource informers started", "resource", r.name, "gvr", gvr.String(), "namespaces", r.cfg.Namespaces)
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
	r.informers = nil
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

// handler turns informer notifications into Events. It never blocks on I/O.
func (r *Resource) handler(gvr schema.GroupVersionResource) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				r.objects.Add(1)
				r.emit(Event{Type: Added, Resource: gvr, Object: u, InitialList: isInInitialList})
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*unstructured.Unstructured)
			n, ok2 := newObj.(*unstructured.Unstructured)
			if !ok1 || !ok2 || o.GetResourceVersion() == n.GetResourceVersion() {
				return // a resync or relist of an unchanged object
			}
			r.emit(Event{Type: Modified, Resource: gvr, Object: n, OldObject: o})
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				r.objects.Add(-1)
				r.emit(Event{Type: Deleted, Resource: gvr, Object: u})
			}
		},
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
}

// Status reports the resource's state, object count, indexers, last event and last error.
func (r *Resource) Status() Status {
	r.mu.RLock()
	defer r.mu.RUnlock()
	st := r.stateLocked()
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
		Reason:     r.reason,
		Objects:    r.objects.Load(),
		Indexers:   []string{config.NamespaceIndex},
		LastError:  r.lastError,
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
