package httpapi

import (
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func cm(name string, rv uint64) *object.Object {
	return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "resourceVersion": strconv.FormatUint(rv, 10)}}})
}

// event is a change a watch brought, in order.
func event(typ object.EventType, name string, rv uint64) object.Event {
	return object.Event{Type: typ, Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Object: cm(name, rv), InOrder: true}
}

// relistEvent is a change a relist at listed found: a deletion carries the object as last known.
func relistEvent(typ object.EventType, name string, rv, listed uint64) object.Event {
	e := event(typ, name, rv)
	e.InOrder = false
	if typ == object.Deleted {
		e.Since, e.Revision = rv+1, listed
	}
	return e
}

func typesAndNames(batch []object.Event) []string {
	var got []string
	for _, e := range batch {
		got = append(got, string(e.Type)+" "+e.Object.GetName())
	}
	return got
}

// TestAWatchResumesAfterItsResourceVersionOnly: a watch from a resourceVersion gets the history's
// changes after it and every later one, and none at or before it: neither one the history holds
// out of the order of resourceVersions (a relist's change to an object last changed long ago,
// before it) nor one published after the watch opened.
func TestAWatchResumesAfterItsResourceVersionOnly(t *testing.T) {
	s := NewHub(10).stream(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	s.publish(event(object.Modified, "a", 10))
	s.publish(event(object.Added, "b", 12))
	s.publish(relistEvent(object.Modified, "old", 9, 12)) // out of order, at or before 11
	w, serr := s.resume(11)
	if serr != nil {
		t.Fatal(serr)
	}
	s.publish(event(object.Modified, "a", 11)) // published late, at or before 11
	s.publish(event(object.Deleted, "b", 13))
	batch, _ := s.take(w)
	if got, want := typesAndNames(batch), []string{"ADDED b", "DELETED b"}; !slices.Equal(got, want) {
		t.Errorf("the watch from 11 got %q; want %q", got, want)
	}
}

// TestARelistEndsEveryWatchAndAWatchFromBeforeItIsGone: the changes a relist found reach no
// watch: a watch open then ends once it has written what came before, and a watch resumed from
// before the relist is refused with 410 Gone (its client lists again), as the apiserver's are
// when its watch cache lists again; a watch from the relist's resourceVersion gets what follows.
func TestARelistEndsEveryWatchAndAWatchFromBeforeItIsGone(t *testing.T) {
	s := NewHub(10).stream(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	open := s.follow()
	s.publish(event(object.Modified, "a", 10))
	s.publish(relistEvent(object.Deleted, "gone", 7, 20))
	s.publish(relistEvent(object.Modified, "b", 15, 20))
	batch, done := s.take(open)
	if got, want := typesAndNames(batch), []string{"MODIFIED a"}; !slices.Equal(got, want) || !done {
		t.Errorf("the open watch got %q and ends: %t; want %q and to end", got, done, want)
	}
	if _, serr := s.resume(10); serr == nil || serr.ErrStatus.Code != 410 {
		t.Errorf("a watch from 10, before the relist at 20: %v, want 410 Gone", serr)
	}
	w, serr := s.resume(20)
	if serr != nil {
		t.Fatal(serr)
	}
	s.publish(event(object.Modified, "b", 21))
	if batch, _ := s.take(w); !slices.Equal(typesAndNames(batch), []string{"MODIFIED b"}) {
		t.Errorf("the watch from 20 got %q; want the change after it", typesAndNames(batch))
	}
}

// TestAWatchFromBeforeTheHistoryIsGone: once the history no longer holds every change after a
// resourceVersion, a watch from it fails with 410 Gone, as with the apiserver.
func TestAWatchFromBeforeTheHistoryIsGone(t *testing.T) {
	s := NewHub(2).stream(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	for rv := uint64(10); rv < 14; rv++ {
		s.publish(event(object.Modified, "a", rv))
	}
	if _, serr := s.resume(10); serr == nil || serr.ErrStatus.Code != 410 {
		t.Errorf("a watch from 10 after the history dropped 11: %v, want 410 Gone", serr)
	}
	w, serr := s.resume(11)
	if serr != nil {
		t.Fatalf("a watch from 11, which the history still follows: %v", serr)
	}
	batch, _ := s.take(w)
	if got, want := typesAndNames(batch), []string{"MODIFIED a", "MODIFIED a"}; !slices.Equal(got, want) {
		t.Errorf("the watch from 11 got %q; want %q", got, want)
	}
}

// TestAWatchsResourceVersionsNeverGoBackAcrossASelectionsChange: objects that come in (or go
// out) with their namespace carry their own, older resourceVersions; a watch serves them at
// the selection's revision, so what it sends never goes back, and a client that resumes from
// that revision having been sent only some of them gets them all again, then what followed.
func TestAWatchsResourceVersionsNeverGoBackAcrossASelectionsChange(t *testing.T) {
	s := NewHub(10).stream(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	moved := func(typ object.EventType, name string, own, at uint64) object.Event {
		e := event(typ, name, own)
		e.Revision, e.Moved = at, true
		return e
	}
	live := s.follow()
	s.publish(event(object.Modified, "a", 20))
	s.publish(moved(object.Added, "x", 5, 30))
	s.publish(moved(object.Added, "y", 7, 30))
	s.publish(event(object.Modified, "a", 31))
	s.publish(moved(object.Deleted, "x", 5, 40))
	batch, _ := s.take(live)
	var rvs []string
	for _, e := range batch {
		rvs = append(rvs, served(e).GetResourceVersion())
	}
	if want := []string{"20", "30", "30", "31", "40"}; !slices.Equal(rvs, want) {
		t.Errorf("the watch served resourceVersions %q; want %q", rvs, want)
	}
	if got := batch[1].Object.GetResourceVersion(); got != "5" {
		t.Errorf("the cache's object was changed to resourceVersion %s; want its own, 5", got)
	}

	w, serr := s.resume(30)
	if serr != nil {
		t.Fatal(serr)
	}
	s.publish(moved(object.Added, "z", 8, 50))
	batch, _ = s.take(w)
	if got, want := typesAndNames(batch), []string{"ADDED x", "ADDED y", "MODIFIED a", "DELETED x", "ADDED z"}; !slices.Equal(got, want) {
		t.Errorf("the watch from 30 got %q; want %q", got, want)
	}
}

// TestAnObjectUpdatedOutOfAWatchsSelectorIsDeletedAsItWas: an update that takes an object out
// of a label-selected watch is DELETED carrying the object as the watch last selected it, at the
// update's resourceVersion, as the apiserver sends it; back in, it is ADDED as it is now.
func TestAnObjectUpdatedOutOfAWatchsSelectorIsDeletedAsItWas(t *testing.T) {
	q, serr := parseQuery(url.Values{"labelSelector": {"team=a"}}, 500)
	if serr != nil {
		t.Fatal(serr)
	}
	labelled := func(team string, rv uint64) *object.Object {
		return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": "ns", "name": "x", "resourceVersion": strconv.FormatUint(rv, 10), "labels": map[string]any{"team": team}}}})
	}
	out := object.Event{Type: object.Modified, OldObject: labelled("a", 5), Object: labelled("b", 9)}
	if typ := q.transition(out, ""); typ != string(object.Deleted) {
		t.Fatalf("relabelled out of the selector: %q; want DELETED", typ)
	}
	sent := servedAs(string(object.Deleted), out)
	if got := sent.Labels().Get("team"); got != "a" || sent.GetResourceVersion() != "9" {
		t.Errorf("DELETED carried team=%s at resourceVersion %s; want the object as it was (team=a) at the update's, 9", got, sent.GetResourceVersion())
	}
	if got := out.OldObject.GetResourceVersion(); got != "5" {
		t.Errorf("the cache's old object was changed to resourceVersion %s; want its own, 5", got)
	}
	in := object.Event{Type: object.Modified, OldObject: labelled("b", 9), Object: labelled("a", 12)}
	if typ := q.transition(in, ""); typ != string(object.Added) {
		t.Fatalf("relabelled back into the selector: %q; want ADDED", typ)
	}
	if sent := servedAs(string(object.Added), in); sent.Labels().Get("team") != "a" || sent.GetResourceVersion() != "12" {
		t.Errorf("ADDED carried %v at %s; want the object as it is now", sent.Labels(), sent.GetResourceVersion())
	}
}
