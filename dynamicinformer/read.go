package dynamicinformer

import (
	"github.com/dynwatch/dynwatch/object"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	return r.informers[0].moves.selectionEmitted(), true
}

// Get is the cached object namespace/name ("" namespace for a cluster-scoped object), as a
// snapshot would show it now; false while the informers do not run.
func (r *Resource) Get(namespace, name string) (*object.Object, bool) {
	r.mu.RLock()
	st := r.store
	r.mu.RUnlock()
	if st == nil {
		return nil, false
	}
	return st.get(namespace, name)
}

// Snapshot is, in O(1), the resource's cache as it is now (see Snapshot); empty while its
// informers do not run.
func (r *Resource) Snapshot() Snapshot {
	r.mu.RLock()
	st := r.store
	r.mu.RUnlock()
	if st == nil {
		return Snapshot{}
	}
	return st.snapshot()
}
