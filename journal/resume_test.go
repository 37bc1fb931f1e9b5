package journal

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dynwatch/dynwatch/object"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestAStreamResumesFromTheRevisionOfItsLastRecordedEvent: once an informer has asked to
// resume a stream under a selection, each commit records the revision of the stream's last
// event (or of its initial list); after a restart, Resume under the same selection answers the
// stream's objects as recorded with that revision, and under another selection, or for
// another stream, nothing. An event older than an object's recorded state, as a watch resumed
// from before a relist may send, is passed over.
func TestAStreamResumesFromTheRevisionOfItsLastRecordedEvent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	cm := func(ns, name, uid string, rv int) *object.Object {
		return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": ns, "name": name, "uid": uid, "resourceVersion": fmt.Sprint(rv)}}})
	}
	open := func() (*Journal, *target) {
		tg := &target{}
		j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
			Path: path, Targets: func() []Target { return []Target{tg} }})
		if err != nil {
			t.Fatal(err)
		}
		return j, tg
	}
	resume := func(j *Journal, stream, selection string) ([]string, uint64, bool) {
		t.Helper()
		type answer struct {
			objs [][]byte
			rev  uint64
			ok   bool
			err  error
		}
		c := make(chan answer, 1)
		go func() {
			objs, rev, ok, err := j.Resume(t.Context(), configmaps, stream, selection)
			c <- answer{objs, rev, ok, err}
		}()
		for {
			flush(t, j)
			select {
			case a := <-c:
				if a.err != nil {
					t.Fatal(a.err)
				}
				var names []string
				for _, b := range a.objs {
					o, err := object.FromJSON(b)
					if err != nil {
						t.Fatal(err)
					}
					names = append(names, o.GetName()+"@"+o.GetResourceVersion())
				}
				slices.Sort(names)
				return names, a.rev, a.ok
			default:
			}
		}
	}

	j, _ := open()
	if _, _, ok := resume(j, "a", "sel"); ok {
		t.Fatal("a fresh store resumed a stream")
	}
	j.ListStarted(configmaps, 1, []string{"a"})
	j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: cm("a", "x", "u1", 5), InitialList: true, Stream: "a", Revision: 5})
	j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: cm("a", "y", "u2", 6), InitialList: true, Stream: "a", Revision: 6})
	j.ListSynced(configmaps, 1, 10)
	flush(t, j)
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmaps, Object: cm("a", "x", "u1", 12), OldObject: cm("a", "x", "u1", 5), Stream: "a", Revision: 12, InOrder: true})
	flush(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	j, tg := open()
	defer func() { _ = j.Close() }()
	if names, rev, ok := resume(j, "a", "sel"); !ok || rev != 12 || !slices.Equal(names, []string{"x@12", "y@6"}) {
		t.Errorf("Resume = %v at %d (%v), want x@12 and y@6 at 12", names, rev, ok)
	}
	if _, _, ok := resume(j, "a", "other"); ok {
		t.Error("a stream recorded under another selection resumed")
	}
	if _, _, ok := resume(j, "b", "sel"); ok {
		t.Error("a stream never recorded resumed")
	}
	resume(j, "a", "sel")
	// A watch resumed from before x@12 sends x@8: it was recorded already, and is passed over.
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmaps, Object: cm("a", "x", "u1", 8), OldObject: cm("a", "x", "u1", 5), Stream: "a", Revision: 8, InOrder: true})
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmaps, Object: cm("a", "y", "u2", 14), OldObject: cm("a", "y", "u2", 6), Stream: "a", Revision: 14, InOrder: true})
	flush(t, j)
	var got []string
	for _, e := range tg.entries {
		got = append(got, e.Event.Object.GetName()+"@"+e.Event.Object.GetResourceVersion())
	}
	if !slices.Equal(got, []string{"y@14"}) {
		t.Errorf("delivered %v, want only y@14 (x@8 is older than the recorded x@12)", got)
	}
	if _, rev, _ := resume(j, "a", "sel"); rev != 14 {
		t.Errorf("revision after y@14 = %d, want 14", rev)
	}
}
