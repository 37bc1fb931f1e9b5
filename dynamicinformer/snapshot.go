package dynamicinformer

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/object"
)

// Page reads the cache in list order with respect to the resource's events, for a subscriber
// that replays the current objects to someone who has not seen them: while fn runs, no
// handler of the resource updates the cache's order or emits an event. So every event
// emitted before the page was read has been handed to the subscribers already, and every
// event emitted after it changes the objects as fn saw them.
//
// fn is called with up to limit cached objects that come after the object whose cache key
// (object.KeyOf) is after ("" for the first), in list order, and with more set when others
// follow them. Page reports false, without calling fn, while the informers do not run. fn
// must return quickly: the resource's handlers wait for it. Its objects are shared with the
// cache: it must not modify them.
func (r *Resource) Page(after string, limit int, fn func(objs []*unstructured.Unstructured, more bool)) bool {
	r.emitting.Lock()
	defer r.emitting.Unlock()
	r.mu.RLock()
	ord := r.order
	r.mu.RUnlock()
	if ord == nil {
		return false
	}
	var from Key
	if after != "" {
		from.Namespace, from.Name = object.SplitKey(after)
	}
	objs := make([]*unstructured.Unstructured, 0, limit)
	more := false
	ord.snapshot().Scan("", from, func(u *unstructured.Unstructured) bool {
		if len(objs) == limit {
			more = true
			return false
		}
		objs = append(objs, u)
		return true
	})
	fn(objs, more)
	return true
}
