package journal

import (
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// TestTheRestartDecisionCoversEveryCase: what an event means given its object's stored state,
// one row a case, without a store. outRederived, a stored state that does not decode, is
// decided on reading it (TestACorruptStoredObjectAffectsOnlyItself).
func TestTheRestartDecisionCoversEveryCase(t *testing.T) {
	obj := func(uid string, rv uint64) *dynamicinformer.Object {
		return dynamicinformer.NewObject(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": "ns", "name": "x", "uid": uid, "resourceVersion": strconv.FormatUint(rv, 10)}}})
	}
	// watched is a watch's event (in order, with its revision), listed an initial list's.
	watched := func(typ dynamicinformer.EventType, o, old *dynamicinformer.Object) dynamicinformer.Event {
		rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
		return dynamicinformer.Event{Type: typ, Resource: configmaps, Object: o, OldObject: old, Revision: rv, InOrder: true}
	}
	listed := func(o *dynamicinformer.Object) dynamicinformer.Event {
		return dynamicinformer.Event{Type: dynamicinformer.Added, Resource: configmaps, Object: o, InitialList: true}
	}
	at := func(uid string, rv uint64) *stored { return &stored{uid: uid, rv: strconv.FormatUint(rv, 10)} }
	for _, c := range []struct {
		name string
		e    dynamicinformer.Event
		prev *stored
		want outcome
	}{
		{"a watch's version older than the stored one is stale", watched(dynamicinformer.Modified, obj("u1", 5), obj("u1", 4)), at("u1", 7), outStale},
		{"a watch's deletion of an earlier incarnation is stale", watched(dynamicinformer.Deleted, obj("u0", 9), nil), at("u1", 7), outStale},
		{"a listed version older than the stored one is not stale: lists are not in order", listed(obj("u1", 5)), at("u1", 7), outFromStored},
		{"a deletion removes the state and is handed on", watched(dynamicinformer.Deleted, obj("u1", 9), nil), at("u1", 7), outDeleted},
		{"a deletion of an object never stored is handed on", watched(dynamicinformer.Deleted, obj("u1", 9), nil), nil, outDeleted},
		{"an object with nothing stored is new", listed(obj("u1", 7)), nil, outNew},
		{"a watch's ADDED with nothing stored is new", watched(dynamicinformer.Added, obj("u1", 7), nil), nil, outNew},
		{"another uid under the name was deleted and created again", listed(obj("u2", 9)), at("u1", 7), outRecreated},
		{"the stored version again is unchanged", listed(obj("u1", 7)), at("u1", 7), outUnchanged},
		{"a watch's event of the stored version is unchanged", watched(dynamicinformer.Modified, obj("u1", 7), obj("u1", 6)), at("u1", 7), outUnchanged},
		{"a listed newer version is modified from the stored one", listed(obj("u1", 9)), at("u1", 7), outFromStored},
		{"a watch's newer version whose old object is not the stored one is modified from the stored one", watched(dynamicinformer.Modified, obj("u1", 9), obj("u1", 8)), at("u1", 7), outFromStored},
		{"a watch's newer version whose old object is the stored one is handed on as it came", watched(dynamicinformer.Modified, obj("u1", 9), obj("u1", 7)), at("u1", 7), outAsCame},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decide(c.e, c.prev); got != c.want {
				t.Errorf("decide = %d, want %d", got, c.want)
			}
		})
	}
}
