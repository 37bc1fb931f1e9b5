package dynamicinformer

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// ListObserver is implemented by subscribers that compare an informer run's initial list with
// state of their own: what was stored and is not in the list was deleted meanwhile.
type ListObserver interface {
	// ListStarted is called before a resource's informers start, one per stream; their initial
	// lists follow as object.Added events with InitialList set. run numbers the start.
	ListStarted(gvr schema.GroupVersionResource, run uint64, streams []string)
	// ListSynced is called once every object of run's initial lists has been passed to
	// OnEvent, with a revision at or after which each of those lists was taken: an object
	// missing from them was deleted no later than that. It is not called for a run stopped
	// before that.
	ListSynced(gvr schema.GroupVersionResource, run uint64, revision uint64)
}

// Subscriber receives every object.Event. OnEvent is called from the informers' processing
// goroutines and must return quickly without doing I/O: it should enqueue the event and return.
type Subscriber interface {
	OnEvent(object.Event)
}
