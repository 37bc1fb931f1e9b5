package object

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// EventType is the kind of change an Event reports, named as in Kubernetes watch events.
type EventType string

// The event types.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
)

// Lower is the type in lower case ("added"), as event ids and CloudEvents types spell it.
func (t EventType) Lower() string {
	switch t {
	case Added:
		return "added"
	case Modified:
		return "modified"
	case Deleted:
		return "deleted"
	}
	return strings.ToLower(string(t))
}

// EventTypes lists every EventType, in a stable order.
var EventTypes = []EventType{Added, Modified, Deleted}

// Event is one change to one object of a watched resource. Object and OldObject are
// transformed and shared with the cache: subscribers must not modify them.
type Event struct {
	Type     EventType
	Resource schema.GroupVersionResource
	// Object is the new object, or for Deleted the last known one.
	Object *Object
	// OldObject is the object before the change, for Modified only.
	OldObject *Object
	// Last is, for Deleted, the object as the cache held it before the delete, at its last
	// resourceVersion (Object is the apiserver's last word, at the delete's); nil when not
	// known. The history keeps it: a list at a revision before the delete serves it.
	Last *Object
	// Managers is the JSON array of the field managers whose managedFields entries changed at
	// this version (object.ChangedManagers): for an object new to the cache, all of them; nil
	// when not known (an object that came in or went out with its namespace, a delete a relist
	// found, or objects without managedFields).
	Managers []byte
	// InitialList is true for Added events from an informer's initial list.
	InitialList bool
	// Observed is when the informer handed the change to dynwatch.
	Observed time.Time
	// Stream names the informer that saw the change: its namespace, or "" when one informer
	// watches every namespace. ListStarted names a resource's streams.
	Stream string
	// Revision is a resourceVersion, as an integer, at or after which the change happened
	// (one resource's resourceVersions compare as integers): the object's, or for a delete
	// that a relist found, the relist's. 0 when it is not an integer, or not known: the
	// deletion of an object still cached when its whole group's member was retired.
	Revision uint64
	// Since, when not 0, is the lowest resourceVersion at which the change may have happened,
	// for a change Revision only bounds from above: a delete a relist found (after the
	// object's last known resourceVersion, by the relist's), an object that came in or went
	// out with its namespace as a namespaceSelector changed. Replicas that see such a change
	// at different points agree on a range that holds it: a checkpoint stays below Since
	// while the change is undelivered, and acknowledges it only once it reaches Revision.
	Since uint64
	// Moved is set for an object that came in or went out of the cache with its namespace, as
	// a namespaceSelector's selection changed: Revision is then the selection's revision at
	// which it did, and each such coming and going is a change of its own (see Since), though
	// the object itself did not change.
	Moved bool
	// InOrder is set for changes seen on a watch: a stream's InOrder events come in increasing
	// Revision, and each marks the stream's progress. Initial lists and relists are not in
	// order.
	InOrder bool
}

// Lowest is the lowest resourceVersion at which e may have happened: Since when set, else
// Revision (0 when neither is known).
func (e Event) Lowest() uint64 {
	if e.Since != 0 {
		return e.Since
	}
	return e.Revision
}
