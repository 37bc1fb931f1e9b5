package dynamicinformer

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The objects these methods return are shared with the cache: callers must not modify them.

// Get returns the cached object namespace/name ("" namespace for cluster-scoped objects).
func (r *Resource) Get(namespace, name string) (*unstructured.Unstructured, bool) {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
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
