package journal

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// testdata/format2.db was written by the release before format 3 (commit 10dc13b): five
// ADDED events recorded for one sink and none acknowledged, of a configmap in team-a and one in
// team-b, a deployment, a namespace and a custom resource of example.com.

// TestAStoreOfFormatTwoIsUpgradedWithoutLosingAnything: every outbox entry is still there,
// keyed by the new resource names, and the stored objects are still compared with an initial
// list: an unchanged object is not delivered again, a vanished one is delivered as DELETED.
func TestAStoreOfFormatTwoIsUpgradedWithoutLosingAnything(t *testing.T) {
	path := oldStore(t, "testdata/format2.db")
	tg := &target{}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: path, Targets: func() []Target { return []Target{tg} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })

	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	deployments := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	want := []string{
		object.OrderingKey(configmaps, "team-a", "settings"),
		object.OrderingKey(configmaps, "team-b", "settings"),
		object.OrderingKey(deployments, "team-a", "web"),
		object.OrderingKey(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, "", "team-a"),
		object.OrderingKey(schema.GroupVersionResource{Group: "example.com", Version: "v1alpha1", Resource: "widgets"}, "team-a", "gizmo"),
	}
	var keys []string
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool {
		keys = append(keys, e.Key)
		if e.Since != 0 || e.Revision == 0 {
			t.Errorf("entry %d: since %d, revision %d; want an exact revision, as format 2 had", e.Seq, e.Since, e.Revision)
		}
		if r, err := object.OrderingKeyResource(e.Key); err != nil || r != e.Event.Resource {
			t.Errorf("entry %d: its key %q names %v (%v); its event is of %v", e.Seq, e.Key, r, err, e.Event.Resource)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("outbox keys after the upgrade:\n%q\nwant\n%q", keys, want)
	}
	if cp := j.Checkpoints(); len(cp["sink"]) != 0 {
		t.Errorf("checkpoints %v with every entry unacknowledged; want none", cp)
	}

	// The initial lists after the restart: configmaps lists both, unchanged; deployments lists
	// none, so web was deleted while nobody was looking.
	j.ListStarted(configmaps, 1, nil)
	j.ListStarted(deployments, 1, nil)
	for i, ns := range []string{"team-a", "team-b"} {
		u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": ns, "name": "settings", "uid": []string{"uid-0", "uid-1"}[i], "resourceVersion": []string{"100", "101"}[i]}, "data": map[string]any{"k": "v"}}}
		j.Record(dynamicinformer.Event{Type: dynamicinformer.Added, Resource: configmaps, Object: dynamicinformer.NewObject(u), InitialList: true, Revision: 100 + uint64(i)})
	}
	j.ListSynced(configmaps, 1, 200)
	j.ListSynced(deployments, 1, 200)
	flush(t, j)
	var got []string
	for _, e := range tg.entries {
		got = append(got, string(e.Event.Type)+" "+e.Key)
	}
	if w := []string{"DELETED " + want[2]}; !slices.Equal(got, w) {
		t.Errorf("after the initial lists the sink was handed %q; want %q", got, w)
	}
}

// TestAStoreOfALaterFormatIsRefused: a store written by a later release is not read as if it
// were this one's, nor set aside as damaged.
func TestAStoreOfALaterFormatIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	l, _, err := wal.Open(path, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(append([]byte{recFormat}, appendString(nil, "99")...)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(path, nil); err == nil || !strings.Contains(err.Error(), `format "99"`) {
		t.Fatalf("opening a store of format 99: %v; want an error naming the format", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the store of a later format was moved: %v", err)
	}
}

// undecided is a sink whose filter cannot decide on any event.
type undecided struct{ target }

func (*undecided) Selects(dynamicinformer.Event) (bool, error) {
	return true, errors.New("operation cancelled: actual cost limit exceeded")
}

// TestAFilterErrorIsKeptInTheOutbox: an entry recorded with its sink's filter error reads back
// with it, after the store is closed and opened again, so a restart acts on it as the sink's
// filterErrors says rather than delivering it as selected.
func TestAFilterErrorIsKeptInTheOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	open := func(tg Target) *Journal {
		j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
			Path: path, Targets: func() []Target { return []Target{tg} }})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	j := open(&undecided{})
	j.Record(addedAt("a", 11))
	flush(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j = open(&target{})
	t.Cleanup(func() { _ = j.Close() })
	var got []string
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool { got = append(got, e.FilterError); return true }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"operation cancelled: actual cost limit exceeded"}; !slices.Equal(got, want) {
		t.Errorf("the outbox read back after a restart has filter errors %q; want %q", got, want)
	}
}
