package dynamicinformer

import (
	"github.com/dynwatch/dynwatch/object"
)

// Read calls fn with a snapshot of the cache taken in step with the resource's events, for a
// subscriber that starts from the current objects and follows their changes: while fn runs,
// the informers apply no change and emit no event. So every event emitted before fn was called
// has been handed to the subscribers already, and every event emitted after it is a change to
// the snapshot fn was given. Read reports false, without calling fn, while the informers do not
// run. fn must return quickly: the resource's informers wait for it.
func (r *Resource) Read(fn func(Snapshot)) bool {
	r.emitting.Lock()
	defer r.emitting.Unlock()
	r.mu.RLock()
	st := r.store
	r.mu.RUnlock()
	if st == nil {
		return false
	}
	fn(st.snapshot())
	return true
}

// Page reads the cache in list order in step with the resource's events, as Read does, for a
// subscriber that replays the current objects to someone who has not seen them. fn is called
// with up to limit cached objects that come after the object whose cache key (object.KeyOf) is
// after ("" for the first), in list order, and with more set when others follow them. Page
// reports false, without calling fn, while the informers do not run. Its objects are shared
// with the cache: fn must not modify them.
func (r *Resource) Page(after string, limit int, fn func(objs []*object.Object, more bool)) bool {
	var from Key
	if after != "" {
		from.Namespace, from.Name = object.SplitKey(after)
	}
	return r.Read(func(s Snapshot) {
		objs := make([]*object.Object, 0, limit)
		more := false
		s.Scan("", from, func(u *object.Object) bool {
			if len(objs) == limit {
				more = true
				return false
			}
			objs = append(objs, u)
			return true
		})
		fn(objs, more)
	})
}
