package journal

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/object"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestACompactedStoreReadsBackAsItWas: once the log has grown past twice the state it leads
// to (most of the outbox acknowledged) it is replaced by a snapshot, written while commits go on; the store then holds one snapshot and the segments
// after it, and opened again it has the same outbox entries (bodies and deadlines) and the same
// object states (an unchanged list hands nothing).
func TestACompactedStoreReadsBackAsItWas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	tg := &recorder{name: "sink"}
	targets := []Target{tg}
	j := openJournal(t, path, &targets)
	big := strings.Repeat("x", 2048)
	obj := func(i, rev int) *object.Object {
		return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": "ns", "name": fmt.Sprintf("cm-%04d", i), "uid": fmt.Sprintf("uid-%04d", i), "resourceVersion": strconv.Itoa(rev)}, "data": map[string]any{"v": big}}})
	}
	const n = 1500
	for i := range n {
		j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: obj(i, 10+i), Revision: uint64(10 + i), InOrder: true})
	}
	// Changed once each: an entry refers to its object's state, and the old states are what
	// the log holds beyond the state.
	for i := range n {
		j.OnEvent(object.Event{Type: object.Modified, Resource: configmaps, Object: obj(i, 5000+i), OldObject: obj(i, 10+i), Revision: uint64(5000 + i), InOrder: true})
	}
	flush(t, j)
	deadline := time.Unix(1700000600, 0)
	for _, e := range tg.entries[:2*n-10] {
		j.Ack("sink", e.Seq)
	}
	j.SetDeadline("sink", tg.entries[2*n-1].Seq, deadline)
	flush(t, j)
	if !j.compacting {
		t.Fatalf("no compaction began with %d bytes in the log", j.store.size.Load())
	}
	for i := range 10 { // while the snapshot is written
		j.OnEvent(object.Event{Type: object.Modified, Resource: configmaps, Object: obj(i, 10000+i), OldObject: obj(i, 10+i), Revision: uint64(10000 + i), InOrder: true})
	}
	flush(t, j)
	j.finishCompaction(<-j.compacted)
	if m := counterValue(j.m.compactions); m != 1 {
		t.Fatalf("%v compactions; want 1", m)
	}
	j.removing.Wait() // the files the snapshot replaced are removed off the writer's goroutine
	snaps, _ := filepath.Glob(filepath.Join(path, "snap-*.wal"))
	segs, _ := filepath.Glob(filepath.Join(path, "seg-*.wal"))
	if len(snaps) != 1 || len(segs) != 1 {
		t.Errorf("after the compaction: snapshots %v, segments %v; want one of each", snaps, segs)
	}
	read := func(j *Journal) []string {
		var got []string
		if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool {
			got = append(got, fmt.Sprintf("%d %s %d %v", e.Seq, e.ID, len(e.Body), e.Deadline.Unix()))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := read(j)
	if len(before) != 20 || !strings.HasSuffix(before[9], " 1700000600") {
		t.Fatalf("%d entries before the restart, the last old one %q; want 20, with its deadline", len(before), before[min(9, len(before)-1)])
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	tg.entries = nil
	j = openJournal(t, path, &targets)
	if after := read(j); !slices.Equal(after, before) {
		t.Errorf("the outbox opened again differs: %d entries, want %d", len(after), len(before))
	}
	j.ListStarted(configmaps, 1, nil)
	for i := range n {
		rev := 5000 + i
		if i < 10 {
			rev = 10000 + i
		}
		j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: obj(i, rev), InitialList: true, Revision: uint64(rev)})
	}
	j.ListSynced(configmaps, 1, 20000)
	flush(t, j)
	if len(tg.entries) != 0 {
		t.Errorf("an unchanged list after the restart handed the sink %d entries, the first %s; want none", len(tg.entries), tg.entries[0].ID)
	}
}

// TestNothingOfTheStoreIsMapped: the log is read and written with system calls, never through a
// memory map, so none of its pages count as the process's resident memory.
func TestNothingOfTheStoreIsMapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	tg := &recorder{name: "sink"}
	targets := []Target{tg}
	j := openJournal(t, path, &targets)
	for i := range 100 {
		j.OnEvent(addedAt(fmt.Sprintf("cm-%03d", i), uint64(10+i)))
	}
	flush(t, j)
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(Entry) bool { return true }); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), path) {
			t.Errorf("the store is mapped: %s", sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestAFailedCompactionIsNotRetriedOnEveryCommit: a snapshot that cannot be written (here its
// temporary files are directories; a volume too full for a snapshot is the same) is tried
// again only after a backoff, not at every commit: each try begins a segment and writes the
// whole state.
func TestAFailedCompactionIsNotRetriedOnEveryCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	tg := &recorder{name: "sink"}
	targets := []Target{tg}
	j := openJournal(t, path, &targets)
	for id := range 1000 { // every snapshot this test could begin
		if err := os.Mkdir(filepath.Join(path, fmt.Sprintf("snap-%016x.wal.tmp", id)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 2048)
	obj := func(i, rev int) *object.Object {
		return object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"namespace": "ns", "name": fmt.Sprintf("cm-%04d", i), "uid": fmt.Sprintf("uid-%04d", i), "resourceVersion": strconv.Itoa(rev)}, "data": map[string]any{"v": big}}})
	}
	rev := 10
	commit := func() {
		rev++
		j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: obj(rev%100, rev), Revision: uint64(rev), InOrder: true})
		flush(t, j)
		for _, e := range tg.entries {
			j.Ack("sink", e.Seq)
		}
		tg.entries = nil
		flush(t, j)
	}
	for !j.compacting {
		commit()
	}
	j.finishCompaction(<-j.compacted)
	if n := counterValue(j.m.compactionErrors); n != 1 {
		t.Fatalf("%v compaction errors; want 1", n)
	}
	for range 20 {
		commit()
		if j.compacting {
			t.Fatal("a compaction began again at the next commits, right after one failed")
		}
	}
}

// TestASnapshotCopiesOutboxEntriesWithoutABufferEach: a compaction reads every entry still in
// an outbox back from the log into the snapshot; read into a buffer of its own each, they were
// garbage as large as the outboxes (400 MB in one compaction at a million objects).
func TestASnapshotCopiesOutboxEntriesWithoutABufferEach(t *testing.T) {
	j, tg := newJournal(t)
	const n = 4000 // 32 MB of entries, against a frame buffer grown once to snapshotFrame
	for i := range n {
		j.OnEvent(addedWithData(fmt.Sprintf("cm-%04d", i), uint64(10+i), 8192))
	}
	flush(t, j)
	j.SetDeadline("sink", tg.entries[0].Seq, time.Unix(1700000600, 0))
	flush(t, j)
	c := rotated(t, j)
	var entries int64
	for _, e := range c.entries {
		entries += int64(e.x.whole) // what the snapshot writes: each body whole
	}
	// The frame buffer is allocated still.
	if allocated := snapshotAllocation(t, j, &c); allocated > entries/2 {
		t.Errorf("writing a snapshot of %d entries (%d MB) allocated %d MB; want well under the entries' size", len(c.entries), entries>>20, allocated>>20)
	}
}

// TestASnapshotCopiesStoredObjectsWithoutABufferEach: the state of an object read back at open
// lies in the log until the cache hands the object again; a compaction before that reads it
// into the snapshot, as it does outbox entries.
func TestASnapshotCopiesStoredObjectsWithoutABufferEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	var targets []Target
	j := openJournal(t, path, &targets)
	const n = 4000 // 32 MB of states
	for i := range n {
		j.OnEvent(addedWithData(fmt.Sprintf("cm-%04d", i), uint64(10+i), 8192))
	}
	flush(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j = openJournal(t, path, &targets)
	c := rotated(t, j)
	var states int64
	for _, o := range c.objects {
		if o.st.obj != nil {
			t.Fatalf("object %s was read back with the cache's object", o.key)
		}
		states += int64(o.st.n)
	}
	if allocated := snapshotAllocation(t, j, &c); allocated > states/2 {
		t.Errorf("writing a snapshot of %d objects' states (%d MB) allocated %d MB; want well under the states' size", len(c.objects), states>>20, allocated>>20)
	}
}

// rotated begins a new segment and returns the compaction that would replace those before it.
func rotated(t *testing.T, j *Journal) compaction {
	t.Helper()
	id, err := j.store.log.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	return j.compaction(id)
}

// snapshotAllocation writes c's snapshot and returns the bytes that allocated.
func snapshotAllocation(t *testing.T, j *Journal, c *compaction) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := j.store.writeSnapshot(c); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc)
}

// TestAnEventForTwoSinksWritesItsObjectsOnce: a change recorded for two sinks writes the
// object's state and each body the sinks are sent; the bodies hold the same objects as the
// state and as each other, so the commit refers to those it wrote before rather than writing
// them again (a 2 KB configmap's update for two webhooks wrote 11 KB). Every body reads back
// byte for byte as recorded: at once, opened again, and after a compaction, which writes each
// entry whole.
func TestAnEventForTwoSinksWritesItsObjectsOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	a, b := &recorder{name: "a"}, &recorder{name: "b"}
	targets := []Target{a, b}
	j := openJournal(t, path, &targets)
	v1, v2 := addedWithData("cm", 10, 4096), addedWithData("cm", 11, 4096)
	j.OnEvent(v1)
	flush(t, j)
	before := j.store.written.Load()
	v2.Type, v2.OldObject = object.Modified, v1.Object
	j.OnEvent(v2)
	flush(t, j)
	objects := len(v1.Object.JSON()) + len(v2.Object.JSON())
	if w := j.store.written.Load() - before; w > int64(objects+1024) {
		t.Errorf("an update for two sinks wrote %d bytes; want at most its two objects (%d bytes) and 1 KiB", w, objects)
	}
	gone := v2
	gone.Type, gone.OldObject, gone.Revision = object.Deleted, nil, 12
	j.OnEvent(gone)
	flush(t, j)
	want := map[string][]string{}
	for _, r := range []*recorder{a, b} {
		if len(r.entries) != 3 {
			t.Fatalf("sink %s was handed %d entries; want 3", r.name, len(r.entries))
		}
		for _, e := range r.entries {
			want[r.name] = append(want[r.name], string(AppendBody(nil, e)))
		}
	}
	check := func(when string) {
		t.Helper()
		for _, r := range []*recorder{a, b} {
			var got []string
			if _, _, err := j.ReadOutbox(r.name, 0, 0, func(e Entry) bool {
				got = append(got, string(AppendBody(nil, e)))
				return true
			}); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if !slices.Equal(got, want[r.name]) {
				t.Errorf("%s: sink %s's outbox read back %d bodies that differ from the %d recorded", when, r.name, len(got), len(want[r.name]))
			}
		}
		if c := counterValue(j.m.corrupt); c != 0 {
			t.Errorf("%s: %v entries counted corrupt", when, c)
		}
	}
	check("at once")
	held := j.store.held.Load()
	reopen := func() {
		t.Helper()
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		j = openJournal(t, path, &targets)
	}
	reopen()
	check("opened again")
	if h := j.store.held.Load(); h != held {
		t.Errorf("opened again, the state held is %d bytes; want %d, as counted when written", h, held)
	}
	c := rotated(t, j)
	c.err = j.store.writeSnapshot(&c)
	j.finishCompaction(c)
	j.removing.Wait()
	check("after a compaction")
	reopen()
	check("opened again after a compaction")
}
