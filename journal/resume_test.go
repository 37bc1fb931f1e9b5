package journal

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
	open := func() (*Journal, *target) { return openResumable(t, path, nil, 0) }
	resume := func(j *Journal, stream, selection string) ([]string, uint64, bool) {
		t.Helper()
		return resumeStream(t, j, stream, selection)
	}

	j, _ := open()
	if _, _, ok := resume(j, "a", "sel"); ok {
		t.Fatal("a fresh store resumed a stream")
	}
	j.ListStarted(configmapsGVR, 1, []string{"a"})
	j.OnEvent(object.Event{Type: object.Added, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 5), InitialList: true, Stream: "a", Revision: 5})
	j.OnEvent(object.Event{Type: object.Added, Resource: configmapsGVR, Object: resumedCM("a", "y", "u2", 6), InitialList: true, Stream: "a", Revision: 6})
	j.ListSynced(configmapsGVR, 1, 10)
	flush(t, j)
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 12), OldObject: resumedCM("a", "x", "u1", 5), Stream: "a", Revision: 12, InOrder: true})
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
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 8), OldObject: resumedCM("a", "x", "u1", 5), Stream: "a", Revision: 8, InOrder: true})
	j.OnEvent(object.Event{Type: object.Modified, Resource: configmapsGVR, Object: resumedCM("a", "y", "u2", 14), OldObject: resumedCM("a", "y", "u2", 6), Stream: "a", Revision: 14, InOrder: true})
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

// TestAnObjectIgnoredIsResumedWithItsStreamAndHandedToNoSink: an object Options.Ignore names
// (the leader election's checkpoint ConfigMap) is recorded as any other, so that a stream
// resumed after a restart holds it as the cache held it, and its next change is a MODIFIED of
// it, not an ADDED; but none of its changes is handed to a sink: not on a watch, nor when a list
// after a restart finds it gone. (Before, it was not recorded, and a resumed stream lacked it.)
func TestAnObjectIgnoredIsResumedWithItsStreamAndHandedToNoSink(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(fmt.Sprintf("%d workers", workers), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state")
			ignore := func(_ schema.GroupVersionResource, namespace, name string) bool {
				return namespace == "a" && name == "ck"
			}
			delivered := func(tg *target) []string {
				var got []string
				for _, e := range tg.entries {
					got = append(got, string(e.Event.Type)+" "+e.Event.Object.GetName()+"@"+e.Event.Object.GetResourceVersion())
				}
				return got
			}
			j, tg := openResumable(t, path, ignore, workers)
			resumeStream(t, j, "a", "sel")
			j.ListStarted(configmapsGVR, 1, []string{"a"})
			j.OnEvent(object.Event{Type: object.Added, Resource: configmapsGVR, Object: resumedCM("a", "ck", "u0", 4), InitialList: true, Stream: "a", Revision: 4})
			j.OnEvent(object.Event{Type: object.Added, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 5), InitialList: true, Stream: "a", Revision: 5})
			j.ListSynced(configmapsGVR, 1, 10)
			settle(t, j)
			j.OnEvent(object.Event{Type: object.Modified, Resource: configmapsGVR, Object: resumedCM("a", "ck", "u0", 12), OldObject: resumedCM("a", "ck", "u0", 4), Stream: "a", Revision: 12, InOrder: true})
			j.OnEvent(object.Event{Type: object.Modified, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 13), OldObject: resumedCM("a", "x", "u1", 5), Stream: "a", Revision: 13, InOrder: true})
			settle(t, j)
			if got := delivered(tg); !slices.Equal(got, []string{"ADDED x@5", "MODIFIED x@13"}) {
				t.Errorf("delivered %v, want x's ADDED and MODIFIED only", got)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}

			j, tg = openResumable(t, path, ignore, workers)
			if names, rev, ok := resumeStream(t, j, "a", "sel"); !ok || rev != 13 || !slices.Equal(names, []string{"ck@12", "x@13"}) {
				t.Errorf("Resume = %v at %d (%v), want ck@12 and x@13 at 13", names, rev, ok)
			}
			// A list that finds ck gone: its deletion is recorded, and handed to no sink.
			j.ListStarted(configmapsGVR, 2, []string{"a"})
			j.OnEvent(object.Event{Type: object.Added, Resource: configmapsGVR, Object: resumedCM("a", "x", "u1", 13), InitialList: true, Stream: "a", Revision: 13})
			j.ListSynced(configmapsGVR, 2, 20)
			settle(t, j)
			if got := delivered(tg); len(got) > 0 {
				t.Errorf("delivered %v after a list that found ck gone, want nothing", got)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j, _ = openResumable(t, path, ignore, workers)
			defer func() { _ = j.Close() }()
			if names, _, _ := resumeStream(t, j, "a", "sel"); !slices.Equal(names, []string{"x@13"}) {
				t.Errorf("Resume after the list = %v, want x@13 only", names)
			}
		})
	}
}

var configmapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// resumedCM is a configmap of a resumed stream's tests.
func resumedCM(ns, name, uid string, rv int) *object.Object {
	return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": ns, "name": name, "uid": uid, "resourceVersion": fmt.Sprint(rv)}}})
}

// openResumable opens the journal at path with one target, ignore as Options.Ignore and
// workers preselecting.
func openResumable(t *testing.T, path string, ignore func(schema.GroupVersionResource, string, string) bool, workers int) (*Journal, *target) {
	t.Helper()
	tg := &target{}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: path, Targets: func() []Target { return []Target{tg} }, Ignore: ignore, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	return j, tg
}

// resumeStream asks j to resume the configmaps' stream under selection, and returns the names
// and resourceVersions of the objects it answers, sorted, its revision and whether it resumes.
func resumeStream(t *testing.T, j *Journal, stream, selection string) ([]string, uint64, bool) {
	t.Helper()
	type answer struct {
		objs [][]byte
		rev  uint64
		ok   bool
		err  error
	}
	c := make(chan answer, 1)
	go func() {
		objs, rev, ok, err := j.Resume(t.Context(), configmapsGVR, stream, selection)
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

// settle flushes j until its preselector, if it has one, holds nothing: every event handed to it
// is committed. It fails the test if that takes 10 s.
func settle(t *testing.T, j *Journal) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		flush(t, j)
		if j.pre == nil || j.pre.empty() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("10 s on, the preselector still counts events it was handed as not committed")
		}
	}
}
