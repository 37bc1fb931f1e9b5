package journal

import (
	"strconv"
	"testing"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTheRestartDecisionCoversEveryCase: what an event means given its object's stored state,
// one row a case, without a store. outRederived, a stored state that does not decode, is
// decided on reading it (TestACorruptStoredObjectAffectsOnlyItself).
func TestTheRestartDecisionCoversEveryCase(t *testing.T) {
	obj := func(uid string, rv uint64) *object.Object {
		return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": "ns", "name": "x", "uid": uid, "resourceVersion": strconv.FormatUint(rv, 10)}}})
	}
	// watched is a watch's event (in order, with its revision), listed an initial list's.
	watched := func(typ object.EventType, o, old *object.Object) object.Event {
		rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
		return object.Event{Type: typ, Resource: configmaps, Object: o, OldObject: old, Revision: rv, InOrder: true}
	}
	listed := func(o *object.Object) object.Event {
		return object.Event{Type: object.Added, Resource: configmaps, Object: o, InitialList: true}
	}
	at := func(uid string, rv uint64) *stored { return &stored{uid: uid, rv: strconv.FormatUint(rv, 10)} }
	for _, c := range []struct {
		name string
		e    object.Event
		prev *stored
		want outcome
	}{
		{"a watch's version older than the stored one is stale", watched(object.Modified, obj("u1", 5), obj("u1", 4)), at("u1", 7), outStale},
		{"a watch's deletion of an earlier incarnation is stale", watched(object.Deleted, obj("u0", 9), nil), at("u1", 7), outStale},
		{"a listed version older than the stored one is not stale: lists are not in order", listed(obj("u1", 5)), at("u1", 7), outFromStored},
		{"a deletion removes the state and is handed on", watched(object.Deleted, obj("u1", 9), nil), at("u1", 7), outDeleted},
		{"a deletion of an object never stored is handed on", watched(object.Deleted, obj("u1", 9), nil), nil, outDeleted},
		{"an object with nothing stored is new", listed(obj("u1", 7)), nil, outNew},
		{"a watch's ADDED with nothing stored is new", watched(object.Added, obj("u1", 7), nil), nil, outNew},
		{"another uid under the name was deleted and created again", listed(obj("u2", 9)), at("u1", 7), outRecreated},
		{"the stored version again is unchanged", listed(obj("u1", 7)), at("u1", 7), outUnchanged},
		{"a watch's event of the stored version is unchanged", watched(object.Modified, obj("u1", 7), obj("u1", 6)), at("u1", 7), outUnchanged},
		{"a listed newer version is modified from the stored one", listed(obj("u1", 9)), at("u1", 7), outFromStored},
		{"a watch's newer version whose old object is not the stored one is modified from the stored one", watched(object.Modified, obj("u1", 9), obj("u1", 8)), at("u1", 7), outFromStored},
		{"a watch's newer version whose old object is the stored one is handed on as it came", watched(object.Modified, obj("u1", 9), obj("u1", 7)), at("u1", 7), outAsCame},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decide(c.e, c.prev); got != c.want {
				t.Errorf("decide = %d, want %d", got, c.want)
			}
		})
	}
}
