package httpapi

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

func cm(name string, rv uint64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "resourceVersion": strconv.FormatUint(rv, 10)}}}
}

func event(typ dynamicinformer.EventType, name string, rv uint64) dynamicinformer.Event {
	return dynamicinformer.Event{Type: typ, Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Object: cm(name, rv)}
}

// TestAWatchOpeningHoldsUpNoPublisher: while a watch's snapshot is read, events are published
// without waiting for it; once read, the watch gets exactly the changes its snapshot does not
// show: not the ones it shows (at or below its resourceVersion, or the object's own newer
// state), not the deletion of an object it never showed, and every later change.
func TestAWatchOpeningHoldsUpNoPublisher(t *testing.T) {
	s := NewHub(10).stream(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	reading, published := make(chan struct{}), make(chan struct{})
	go func() {
		<-reading
		s.publish(event(dynamicinformer.Modified, "a", 10))  // in the snapshot: rv ≤ 11
		s.publish(event(dynamicinformer.Modified, "b", 12))  // in the snapshot, b's own newer state
		s.publish(event(dynamicinformer.Deleted, "gone", 9)) // deleted before the snapshot
		s.publish(event(dynamicinformer.Added, "c", 13))     // after the snapshot
		s.publish(event(dynamicinformer.Deleted, "c", 13))
		close(published)
	}()
	w, snapshot, rv, serr := s.subscribe(0, true, func() (uint64, []*unstructured.Unstructured) {
		close(reading)
		select {
		case <-published:
		case <-time.After(10 * time.Second):
			t.Error("publishing waited for the snapshot to be read")
		}
		return 11, []*unstructured.Unstructured{cm("a", 10), cm("b", 12)}
	})
	if serr != nil || rv != 11 || len(snapshot) != 2 {
		t.Fatalf("subscribe: %v, resourceVersion %d, %d objects", serr, rv, len(snapshot))
	}
	s.publish(event(dynamicinformer.Modified, "b", 14))
	batch, _ := s.take(w)
	var got []string
	for _, e := range batch {
		got = append(got, string(e.Type)+" "+e.Object.GetName())
	}
	if want := []string{"ADDED c", "DELETED c", "MODIFIED b"}; !slices.Equal(got, want) {
		t.Errorf("the watch got %q; want %q", got, want)
	}
}
