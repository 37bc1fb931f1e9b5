package journal

import (
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

var configmaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// target selects everything and keeps what it is handed.
type target struct{ entries []Entry }

func (*target) Name() string                                { return "sink" }
func (*target) Selects(dynamicinformer.Event) (bool, error) { return true, nil }
func (t *target) Queue(e Entry)                             { t.entries = append(t.entries, e) }
func (*target) InitialState() bool                          { return false }

func newJournal(t *testing.T) (*Journal, *target) {
	t.Helper()
	tg := &target{}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j, tg
}

// addedAt is a watch's ADDED of configmap name at resourceVersion rev.
func addedAt(name string, rev uint64) dynamicinformer.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "uid": "uid-" + name, "resourceVersion": strconv.FormatUint(rev, 10)}}}
	return dynamicinformer.Event{Type: dynamicinformer.Added, Resource: configmaps, Object: u, Revision: rev, InOrder: true}
}

func flush(t *testing.T, j *Journal) {
	t.Helper()
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestACheckpointStopsBelowTheOldestUnacknowledgedEntry(t *testing.T) {
	j, tg := newJournal(t)
	if cp := j.Checkpoints()["sink"]; len(cp) != 0 {
		t.Fatalf("before any list synced: %v; want no checkpoint", cp)
	}
	j.ListStarted(configmaps, 1, []string{""})
	j.ListSynced(configmaps, 1, 10)
	for i, name := range []string{"a", "b", "c"} {
		j.Record(addedAt(name, uint64(11+i)))
	}
	flush(t, j)
	check := func(want uint64) {
		t.Helper()
		if got := j.Checkpoints()["sink"][configmaps]; got != want {
			t.Errorf("checkpoint = %d; want %d", got, want)
		}
	}
	check(10) // 11, 12 and 13 are in the outbox
	j.Ack("sink", tg.entries[1].Seq)
	flush(t, j)
	check(10) // 12 is acknowledged, 11 is not: nothing past 10 is certain
	j.Ack("sink", tg.entries[0].Seq)
	flush(t, j)
	check(12)
	j.Ack("sink", tg.entries[2].Seq)
	flush(t, j)
	check(13)
}

func TestTrimRemovesWhatACheckpointCoversAndRecordsNothingBelowIt(t *testing.T) {
	j, _ := newJournal(t)
	for i, name := range []string{"a", "b", "c"} {
		j.Record(addedAt(name, uint64(11+i)))
	}
	flush(t, j)
	j.Trim(Checkpoints{"sink": {configmaps: 12}})
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 1 {
		t.Fatalf("outbox after a checkpoint at 12: %d entries; want 1 (13)", n)
	}
	j.Record(addedAt("late", 12)) // a slow informer's view of something the leader acknowledged
	j.Record(addedAt("new", 14))
	flush(t, j)
	var revs []uint64
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool {
		revs = append(revs, e.Revision)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(revs) != 2 || revs[0] != 13 || revs[1] != 14 {
		t.Errorf("outbox revisions %v; want [13 14]", revs)
	}
}

func TestALowerCheckpointLowersTheFloor(t *testing.T) {
	j, _ := newJournal(t)
	j.Trim(Checkpoints{"sink": {configmaps: 100}})
	j.Record(addedAt("under-the-first", 50))
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 0 {
		t.Fatalf("%d entries recorded at 50 under a checkpoint at 100; want none", n)
	}
	j.Trim(Checkpoints{"sink": {configmaps: 20}}) // the ConfigMap repaired
	j.Record(addedAt("over-the-second", 50))
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 1 {
		t.Fatalf("%d entries recorded at 50 once the checkpoint is 20; want 1: the floor follows the checkpoints down", n)
	}
}

func TestSeenIsTheHighestRevisionOfAnyStream(t *testing.T) {
	j, _ := newJournal(t)
	if rev, streams := j.Seen(configmaps); rev != 0 || streams != nil {
		t.Fatalf("Seen of a resource never listed = %d, %v; want 0 and no streams", rev, streams)
	}
	j.ListStarted(configmaps, 1, []string{"b", "a"})
	e := addedAt("x", 40)
	e.Stream = "b"
	j.Record(e)
	e = addedAt("y", 30)
	e.Stream = "a"
	j.Record(e)
	flush(t, j)
	if rev, streams := j.Seen(configmaps); rev != 40 || !slices.Equal(streams, []string{"a", "b"}) {
		t.Errorf("Seen = %d, %v; want 40 and [a b]", rev, streams)
	}
}
