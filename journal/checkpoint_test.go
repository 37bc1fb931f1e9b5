package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

var configmaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// target selects everything and keeps what it is handed.
type target struct{ entries []Entry }

func (*target) Name() string                       { return "sink" }
func (*target) Selects(object.Event) (bool, error) { return true, nil }
func (t *target) Queue(e Entry)                    { t.entries = append(t.entries, e) }
func (*target) InitialState() bool                 { return false }

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
func addedAt(name string, rev uint64) object.Event {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": name, "uid": "uid-" + name, "resourceVersion": strconv.FormatUint(rev, 10)}}}
	return object.Event{Type: object.Added, Resource: configmaps, Object: object.New(u), Revision: rev, InOrder: true}
}

// addedWithData is addedAt with a data value of size bytes.
func addedWithData(name string, rev uint64, size int) object.Event {
	e := addedAt(name, rev)
	u, _ := e.Object.Decode()
	u.Object["data"] = map[string]any{"v": strings.Repeat("x", size)}
	e.Object = object.New(u)
	return e
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
		j.OnEvent(addedAt(name, uint64(11+i)))
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
		j.OnEvent(addedAt(name, uint64(11+i)))
	}
	flush(t, j)
	j.Trim(Checkpoints{"sink": {configmaps: 12}})
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 1 {
		t.Fatalf("outbox after a checkpoint at 12: %d entries; want 1 (13)", n)
	}
	j.OnEvent(addedAt("late", 12)) // a slow informer's view of something the leader acknowledged
	j.OnEvent(addedAt("new", 14))
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

// TestATrimWhoseCommitFailedIsMadeWhenTriedAgain: a Trim's removals are written by the commit
// that retries it after the first failed. The floor was set before the commit and not put
// back with the rest when it failed, so the retry found it equal and removed nothing: the
// entries it covered stayed, to be delivered again.
func TestATrimWhoseCommitFailedIsMadeWhenTriedAgain(t *testing.T) {
	var failing atomic.Bool
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{&target{}} },
		datasync: func(f *os.File) error {
			if failing.Load() {
				return errors.New("input/output error")
			}
			return f.Sync()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	// Fill the log's segment, its last commit unsynced: the next commit begins a new segment,
	// and syncs this one first.
	segments := func() int64 { _, n := j.store.log.Sizes(); return n }
	rev := uint64(10)
	record := func(sync func() error) int64 {
		before := segments()
		rev++
		j.OnEvent(addedWithData(fmt.Sprint("o-", rev), rev, 1<<20))
		if err := sync(); err != nil {
			t.Fatal(err)
		}
		return segments() - before
	}
	step := record(j.Flush)
	for segments()+step < wal.SegmentSize {
		record(j.Flush)
	}
	record(j.flush)
	if segments() < wal.SegmentSize || !j.store.log.Unsynced() {
		t.Fatalf("the log holds %d bytes, unsynced: %v; want a full segment, its last commit unsynced", segments(), j.store.log.Unsynced())
	}
	entries := j.OutboxLen("sink")
	failing.Store(true)
	j.Trim(Checkpoints{"sink": {configmaps: rev}})
	if err := j.flush(); err == nil {
		t.Fatal("the Trim's commit succeeded with every sync failing")
	}
	failing.Store(false)
	if err := j.flush(); err != nil {
		t.Fatal(err)
	}
	if n := j.OutboxLen("sink"); n != 0 {
		t.Errorf("%d of %d entries left after the Trim covering them was committed on its second try; want none", n, entries)
	}
}

func TestALowerCheckpointLowersTheFloor(t *testing.T) {
	j, _ := newJournal(t)
	j.Trim(Checkpoints{"sink": {configmaps: 100}})
	j.OnEvent(addedAt("under-the-first", 50))
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 0 {
		t.Fatalf("%d entries recorded at 50 under a checkpoint at 100; want none", n)
	}
	j.Trim(Checkpoints{"sink": {configmaps: 20}}) // the ConfigMap repaired
	j.OnEvent(addedAt("over-the-second", 50))
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
	j.OnEvent(e)
	e = addedAt("y", 30)
	e.Stream = "a"
	j.OnEvent(e)
	flush(t, j)
	if rev, streams := j.Seen(configmaps); rev != 40 || !slices.Equal(streams, []string{"a", "b"}) {
		t.Errorf("Seen = %d, %v; want 40 and [a b]", rev, streams)
	}
}

// TestAChangeKnownAsARangeIsNotLostAtAHandover: a leader and a follower see the same change at
// different points of their watches, so give it different revisions, and only its range
// [Since, Revision] in common: a namespace that joined a namespaceSelector (the leader listed
// it at 300, the follower at 150), a deletion one found by a relist at 400 and the other on
// its watch at 200. While the leader has not delivered its event, its checkpoint stays below
// the range, and the follower, trimmed to it, keeps its own; once delivered, the follower's
// goes.
func TestAChangeKnownAsARangeIsNotLostAtAHandover(t *testing.T) {
	joined := func(rev uint64) object.Event {
		e := addedAt("joined", 90)
		e.Since, e.Revision, e.InOrder = 101, rev, false
		return e
	}
	deleted := func(since, rev uint64, inOrder bool) object.Event {
		e := addedAt("deleted", 50)
		e.Type, e.Since, e.Revision, e.InOrder = object.Deleted, since, rev, inOrder
		return e
	}
	for _, c := range []struct {
		name             string
		leader, follower object.Event
		below            uint64 // the leader's checkpoint while its event is undelivered
	}{
		{"a namespace that joined", joined(300), joined(150), 100},
		{"a deletion a relist found", deleted(51, 400, false), deleted(0, 200, true), 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			leader, delivered := newJournal(t)
			follower, _ := newJournal(t)
			for _, j := range []*Journal{leader, follower} {
				j.ListStarted(configmaps, 1, []string{""})
				j.ListSynced(configmaps, 1, 10)
			}
			leader.OnEvent(c.leader)
			follower.OnEvent(c.follower)
			for _, j := range []*Journal{leader, follower} {
				j.OnEvent(addedAt("later", 500)) // the watch goes on past both
			}
			flush(t, leader)
			flush(t, follower)
			later := delivered.entries[1]
			leader.Ack("sink", later.Seq)
			flush(t, leader)
			cp := leader.Checkpoints()
			if got := cp["sink"][configmaps]; got != c.below {
				t.Fatalf("leader's checkpoint with its event undelivered = %d; want %d", got, c.below)
			}
			follower.Trim(cp)
			flush(t, follower)
			if n := follower.OutboxLen("sink"); n != 2 {
				t.Fatalf("follower's outbox after the leader's checkpoint: %d entries; want 2 (its own event and the later one)", n)
			}
			leader.Ack("sink", delivered.entries[0].Seq)
			flush(t, leader)
			cp = leader.Checkpoints()
			if got := cp["sink"][configmaps]; got != 500 {
				t.Fatalf("leader's checkpoint with everything delivered = %d; want 500", got)
			}
			follower.Trim(cp)
			flush(t, follower)
			if n := follower.OutboxLen("sink"); n != 0 {
				t.Errorf("follower's outbox once the leader delivered everything: %d entries; want none", n)
			}
		})
	}
}

// TestABoundCapsTheCheckpoint: a resource whose informers have not yet handed over a change
// they make on their own (a namespace selection's) has no checkpoint past it.
func TestABoundCapsTheCheckpoint(t *testing.T) {
	tg := &target{}
	bound := uint64(120)
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} },
		Bound: func(gvr schema.GroupVersionResource) (uint64, bool) { return bound, gvr == configmaps }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	j.ListStarted(configmaps, 1, []string{""})
	j.ListSynced(configmaps, 1, 10)
	j.OnEvent(addedAt("a", 200))
	flush(t, j)
	j.Ack("sink", tg.entries[0].Seq)
	flush(t, j)
	if got := j.Checkpoints()["sink"][configmaps]; got != 120 {
		t.Errorf("checkpoint under a bound of 120 = %d; want 120", got)
	}
	bound = 300
	if got := j.Checkpoints()["sink"][configmaps]; got != 200 {
		t.Errorf("checkpoint under a bound of 300 = %d; want 200", got)
	}
}

// TestTheBacklogCountsWhatWaitsToBeCommittedAndAcknowledged: events recorded count until they
// are committed, then as outbox entries until they are acknowledged.
func TestTheBacklogCountsWhatWaitsToBeCommittedAndAcknowledged(t *testing.T) {
	j, tg := newJournal(t)
	for i, name := range []string{"a", "b", "c"} {
		j.OnEvent(addedAt(name, uint64(11+i)))
	}
	check := func(when string, want int) {
		t.Helper()
		if n := j.Backlog(); n != want {
			t.Errorf("%s: a backlog of %d; want %d", when, n, want)
		}
	}
	check("three events recorded", 3)
	flush(t, j)
	check("three events committed", 3)
	j.Ack("sink", tg.entries[0].Seq)
	j.Ack("sink", tg.entries[2].Seq)
	flush(t, j)
	check("two of them acknowledged", 1)
	j.Ack("sink", tg.entries[1].Seq)
	flush(t, j)
	check("all three acknowledged", 0)
}
