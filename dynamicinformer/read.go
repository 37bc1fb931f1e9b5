package dynamicinformer

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// API returns the resource's GroupVersionResource and its discovery entry (kind, scope,
// short names), and false while its informers do not run.
func (r *Resource) API() (schema.GroupVersionResource, metav1.APIResource, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gvr, r.api, r.stop != nil
}

// SelectionRevision is, for a resource with a namespaceSelector, the revision of the namespace
// selection through which the events of its changes have been emitted: every namespace that
// joined or left by then has had its objects' ADDED or DELETED handed to the subscribers.
// False without a namespaceSelector, or while the informers do not run.
func (r *Resource) SelectionRevision() (uint64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.selection == nil || len(r.informers) != 1 {
		return 0, false
	}
	return r.informers[0].relist.selectionEmitted(), true
}

// ResourceVersion returns the oldest of the informers' last synced resourceVersions: every
// change up to it is in the cache. It is 0 before the first list.
func (r *Resource) ResourceVersion() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var oldest uint64
	for i, ni := range r.informers {
		rv := object.Revision(ni.informer.LastSyncResourceVersion())
		if i == 0 || rv < oldest {
			oldest = rv
		}
	}
	return oldest
}

// The objects these methods return are shared with the cache: callers must not modify them.

// Get returns the cached object namespace/name ("" namespace for cluster-scoped objects).
func (r *Resource) Get(namespace, name string) (*unstructured.Unstructured, bool) {
	key := object.Key(namespace, name)
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, ni := range r.informers {
		if ni.namespace != "" && ni.namespace != namespace {
			continue
		}
		if obj, ok, _ := ni.informer.GetIndexer().GetByKey(key); ok {
			return obj.(*unstructured.Unstructured), true
		}
	}
	return nil, false
}

// List returns every cached object, in no particular order.
func (r *Resource) List() []*unstructured.Unstructured {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*unstructured.Unstructured
	for _, ni := range r.informers {
		for _, obj := range ni.informer.GetIndexer().List() {
			out = append(out, obj.(*unstructured.Unstructured))
		}
	}
	return out
}

// Ordered returns a snapshot of the cached objects in list order, taken in O(1). It is empty
// while the informers do not run.
func (r *Resource) Ordered() Ordered {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.order == nil {
		return Ordered{}
	}
	return r.order.snapshot()
}

// OrderedByIndex returns, in O(1), a snapshot of the cached objects whose configured indexer
// index has value, in list order; false for the namespace index, which Ordered's Scan serves.
func (r *Resource) OrderedByIndex(index, value string) (Ordered, bool) {
	if index == config.NamespaceIndex {
		return Ordered{}, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.order == nil {
		return Ordered{}, true
	}
	return r.order.snapshotIndex(index, value), true
}

// ByIndex returns the cached objects whose index named index has value, in no particular
// order. The "namespace" index always exists.
func (r *Resource) ByIndex(index, value string) ([]*unstructured.Unstructured, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*unstructured.Unstructured
	for _, ni := range r.informers {
		objs, err := ni.informer.GetIndexer().ByIndex(index, value)
		if err != nil {
			return nil, fmt.Errorf("index %q of %s: %w", index, r.name, err)
		}
		for _, obj := range objs {
			out = append(out, obj.(*unstructured.Unstructured))
		}
	}
	return out, nil
}

// ObjectLabels returns obj's labels as labels.Labels, read in place: GetLabels would copy them,
// which matters on the paths that match selectors against every event or cached object.
func ObjectLabels(obj *unstructured.Unstructured) labels.Labels {
	m, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "metadata", "labels")
	l, _ := m.(map[string]any)
	return objectLabels(l)
}

type objectLabels map[string]any

func (l objectLabels) Has(k string) bool { _, ok := l[k]; return ok }

func (l objectLabels) Get(k string) string { v, _ := l.Lookup(k); return v }

func (l objectLabels) Lookup(k string) (string, bool) {
	v, ok := l[k].(string)
	return v, ok
}
