package journal

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// syncTarget is a target safe to hand entries from Run's goroutine.
type syncTarget struct {
	mu      sync.Mutex
	entries []Entry
	queued  chan struct{}
}

func (*syncTarget) Name() string                       { return "sink" }
func (*syncTarget) Selects(object.Event) (bool, error) { return true, nil }
func (*syncTarget) InitialState() bool                 { return false }
func (t *syncTarget) Queue(e Entry) {
	t.mu.Lock()
	t.entries = append(t.entries, e)
	t.mu.Unlock()
	t.queued <- struct{}{}
}

// TestAcknowledgementsRideOnTheNextCommit: an acknowledgement starts no transaction (two
// fsyncs) of its own; it commits with the next event's, or alone once ackDelay has passed.
func TestAcknowledgementsRideOnTheNextCommit(t *testing.T) {
	j, _ := newJournal(t)
	tg := &syncTarget{queued: make(chan struct{}, 10)}
	j.targets = func() []Target { return []Target{tg} }
	done := make(chan struct{})
	go func() { j.Run(t.Context()); close(done) }()
	t.Cleanup(func() { <-done })
	record := func(name string, rev uint64) Entry {
		t.Helper()
		j.OnEvent(addedAt(name, rev))
		select {
		case <-tg.queued:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s was not queued", name)
		}
		tg.mu.Lock()
		defer tg.mu.Unlock()
		return tg.entries[len(tg.entries)-1]
	}
	a := record("a", 11)
	j.Ack("sink", a.Seq)
	b := record("b", 12)
	if n, c := j.OutboxLen("sink"), commits(j); n != 1 || c != 2 {
		t.Fatalf("after a, its ack, then b: %d outbox entries in %v commits; want 1 entry (b) in 2 commits", n, c)
	}
	j.Ack("sink", b.Seq)
	testbed.Eventually(t, ackDelay+5*time.Second, func() error {
		if n := j.OutboxLen("sink"); n != 0 {
			return fmt.Errorf("an acknowledgement with no event after it is not committed: %d outbox entries", n)
		}
		return nil
	})
	if c := commits(j); c != 3 {
		t.Errorf("%v commits; want 3", c)
	}
}

func commits(j *Journal) float64 {
	var m dto.Metric
	_ = j.m.commits.Write(&m)
	return m.GetCounter().GetValue()
}

// syncCounter is a target that notes, as each entry is handed to it, how many fdatasyncs the
// store had made.
type syncCounter struct {
	syncTarget
	j          *Journal
	syncsAtGot []float64
}

func (t *syncCounter) Queue(e Entry) {
	t.mu.Lock()
	t.syncsAtGot = append(t.syncsAtGot, counterValue(t.j.m.syncs))
	t.mu.Unlock()
	t.syncTarget.Queue(e)
}

// TestAnEntryIsHandedOnOnceWrittenAndSyncedSoonAfter: a delivery does not wait for its
// commit's fdatasync; the commits written within syncEvery share one, which follows.
func TestAnEntryIsHandedOnOnceWrittenAndSyncedSoonAfter(t *testing.T) {
	j, _ := newJournal(t)
	tg := &syncCounter{syncTarget: syncTarget{queued: make(chan struct{}, 10)}, j: j}
	j.targets = func() []Target { return []Target{tg} }
	done := make(chan struct{})
	go func() { j.Run(t.Context()); close(done) }()
	t.Cleanup(func() { <-done })
	j.OnEvent(addedAt("a", 11))
	select {
	case <-tg.queued:
	case <-time.After(10 * time.Second):
		t.Fatal("a was not queued")
	}
	tg.mu.Lock()
	at := tg.syncsAtGot[0]
	tg.mu.Unlock()
	if at != 0 {
		t.Errorf("a was handed on after %v fdatasyncs; want before any", at)
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		if n := counterValue(j.m.syncs); n != 1 {
			return fmt.Errorf("%v fdatasyncs after a's commit; want 1", n)
		}
		return nil
	})
}

// TestCommitsGoOnWhileAnFdatasyncRuns: the writer hands the periodic fdatasync to a goroutine
// of its own, so that a volume's slow fdatasync (16 ms and more under load) does not hold up
// the commits, and the deliveries, that arrive meanwhile.
func TestCommitsGoOnWhileAnFdatasyncRuns(t *testing.T) {
	var hold atomic.Bool // from the first commit's sync on; the store's opening syncs too
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	datasync := func(f *os.File) error {
		if hold.Load() {
			entered <- struct{}{}
			once.Do(func() { <-release })
		}
		return f.Sync()
	}
	tg := &syncTarget{queued: make(chan struct{}, 10)}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} }, datasync: datasync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	done := make(chan struct{})
	go func() { j.Run(t.Context()); close(done) }()
	t.Cleanup(func() { <-done })
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released)
	hold.Store(true)
	j.OnEvent(addedAt("a", 11))
	<-tg.queued
	select {
	case <-entered: // a's commit's fdatasync, held
	case <-time.After(10 * time.Second):
		t.Fatal("a's commit was not synced")
	}
	j.OnEvent(addedAt("b", 12))
	select {
	case <-tg.queued:
	case <-time.After(10 * time.Second):
		t.Fatal("b was not handed on while a's commit's fdatasync ran")
	}
	released()
	testbed.Eventually(t, 10*time.Second, func() error {
		if n := counterValue(j.m.syncs); n != 2 {
			return fmt.Errorf("%v fdatasyncs once the one held has returned; want 2, a's commit's and b's", n)
		}
		return nil
	})
}

// unsyncedWatcher is a target that notes, as each commit's entries are handed to it, the most
// the log has held written and not yet synced.
type unsyncedWatcher struct {
	target
	j   *Journal
	max int64
}

func (t *unsyncedWatcher) Queue(e Entry) {
	t.max = max(t.max, t.j.store.log.UnsyncedBytes())
	t.target.Queue(e)
}

// TestALargeFlushHoldsAtMostSyncBytesUnsynced: the log keeps every frame written in memory
// until it is synced (to write it again if the sync fails), and the kernel its pages dirty, so
// an initial list of many objects, recorded in one flush of many commits, syncs as it goes
// rather than only once it has written everything: 20,000 configmaps held 109 MB of commit
// buffers at once before it did.
func TestALargeFlushHoldsAtMostSyncBytesUnsynced(t *testing.T) {
	j, _ := newJournal(t)
	tg := &unsyncedWatcher{j: j}
	j.targets = func() []Target { return []Target{tg} }
	const objects = 10000 // of about 2 KB: each commit of maxBatch writes about 4 MB
	for i := range objects {
		j.OnEvent(addedWithData(fmt.Sprintf("cm-%05d", i), uint64(10+i), 2000))
	}
	if err := j.flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(tg.entries); n != objects {
		t.Fatalf("%d entries handed on; want %d", n, objects)
	}
	written := j.store.written.Load()
	// A commit is written whole before the bound is checked, so one commit may pass it.
	if limit := syncBytes + 2*written/objects*maxBatch; tg.max > limit {
		t.Errorf("the flush of %d MB held up to %d MB written and not synced; want at most %d MB", written>>20, tg.max>>20, limit>>20)
	}
}

// TestACommitUsesABufferAgainOnceItsFrameIsSynced: the log holds each commit's buffer until
// its fdatasync, then lets it go; a commit made after that takes one of those buffers rather
// than a new one, so that the store's writes do not, by themselves, drive the collector.
func TestACommitUsesABufferAgainOnceItsFrameIsSynced(t *testing.T) {
	j, _ := newJournal(t)
	j.targets = func() []Target { return nil } // each commit holds an object's state alone
	const commits, size = 200, 8192
	events := make([]object.Event, commits)
	for i := range events {
		events[i] = addedWithData(fmt.Sprintf("cm-%03d", i), uint64(10+i), size)
	}
	j.OnEvent(addedWithData("first", 1, size))
	flush(t, j)
	total := allocated(func() {
		for _, e := range events {
			j.OnEvent(e)
			flush(t, j)
		}
	})
	if per := int64(total) / commits; per > size/2 {
		t.Errorf("each commit of an object's state of %d KB, synced, allocated %d bytes; want well under the state's size", size>>10, per)
	}
}

// TestACommitBufferIsNotUsedAgainWhileTheLogMayWriteItAgain: the log holds a commit's frame
// until a sync has made it durable, to write it again if a sync fails; its buffer is free only
// then, whichever sync it was: one begun on a goroutine of its own, or the one a rotation
// makes, which puts the outcome of the first into effect before its own.
func TestACommitBufferIsNotUsedAgainWhileTheLogMayWriteItAgain(t *testing.T) {
	var failing atomic.Bool
	eio := errors.New("input/output error")
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return nil },
		datasync: func(f *os.File) error {
			if failing.Load() {
				return eio
			}
			return f.Sync()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	j.OnEvent(addedWithData("a", 11, 8192))
	if err := j.flush(); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	done, err := j.store.startSync()
	if err != nil || done == nil {
		t.Fatalf("startSync: %v, %v; want a sync begun", done, err)
	}
	<-done
	if _, err := j.store.log.Rotate(); !errors.Is(err, eio) {
		t.Fatalf("Rotate with the sync begun failed: %v; want %v", err, eio)
	}
	if err := j.store.finishSync(); !errors.Is(err, eio) {
		t.Errorf("finishSync of the failed sync: %v; want %v", err, eio)
	}
	if n := len(j.store.spare); n != 0 {
		t.Fatalf("%d commit buffers free while the log holds a's frame to write it again; want none", n)
	}
	failing.Store(false)
	if err := j.sync(); err != nil {
		t.Fatal(err)
	}
	if n := len(j.store.spare); n != 1 {
		t.Errorf("%d commit buffers free once a's frame is durable; want 1", n)
	}
}

// TestOnlyACommitBufferThatMayBeKeptIsRoundedUp: a small commit's buffer is sized to a power of
// two, so that later commits can take it again once it is synced; an initial list's commit of
// megabytes is sized as estimated, not up to twice that.
func TestOnlyACommitBufferThatMayBeKeptIsRoundedUp(t *testing.T) {
	j, _ := newJournal(t)
	for _, tt := range []struct{ size, want int }{
		{100, minCommitBuffer},
		{10 << 10, 16 << 10},
		{maxRoundedBuffer, maxRoundedBuffer},
		{maxRoundedBuffer + 1, maxRoundedBuffer + 1},
		{3<<20 + 1, 3<<20 + 1},
	} {
		if got := cap(j.store.begin(tt.size).buf); got != tt.want {
			t.Errorf("a commit estimated at %d bytes has a buffer of %d; want %d", tt.size, got, tt.want)
		}
	}
}

// TestACommitTakesTheSmallestSpareBufferThatHoldsIt: a commit of a few acknowledgements does
// not take the buffer of an initial list's commit, which the list's next commit needs.
func TestACommitTakesTheSmallestSpareBufferThatHoldsIt(t *testing.T) {
	j, _ := newJournal(t)
	large, small := make([]byte, 0, 640<<10), make([]byte, 0, minCommitBuffer)
	j.store.spare, j.store.spareCap = [][]byte{large, small}, cap(large)+cap(small)
	if got := cap(j.store.begin(100).buf); got != cap(small) {
		t.Errorf("a commit of 100 bytes took a spare buffer of %d; want the one of %d", got, cap(small))
	}
	if got := cap(j.store.begin(600 << 10).buf); got != cap(large) {
		t.Errorf("a commit of 600 KiB took a buffer of %d; want the spare one of %d", got, cap(large))
	}
	if j.store.spareCap != 0 {
		t.Errorf("%d bytes of spare buffers counted once both were taken; want 0", j.store.spareCap)
	}
}

// TestABatchOfAllThatIsPendingIsTakenWithoutACopy: under a steady stream each batch is
// everything pending; it is taken as it lies, and the next operations are appended into the
// array of the batch before, cleared once applied, rather than into a new one. The
// acknowledgements pending go with every batch, their array used again so too.
func TestABatchOfAllThatIsPendingIsTakenWithoutACopy(t *testing.T) {
	j, _ := newJournal(t)
	e := addedAt("a", 1)
	cycle := func() {
		j.OnEvent(e)
		j.OnEvent(e)
		j.Ack("sink", 1)
		ops, acks := j.takeBatch(1)
		if len(ops) != 2 || len(acks) != 1 {
			t.Fatalf("took %d operations and %d acknowledgements; want 2 and 1", len(ops), len(acks))
		}
		j.batchDone(ops, acks)
	}
	cycle()
	cycle()
	if n := testing.AllocsPerRun(100, cycle); n > 0 {
		t.Errorf("taking a batch of what was pending allocated %.1f times; want none", n)
	}
	// More than a batch: the first maxBatch are taken as they lie in the array.
	for i := range maxBatch + 2 {
		j.OnEvent(addedAt("a", uint64(3+i)))
	}
	j.mu.Lock()
	first := &j.pending[0][0]
	j.mu.Unlock()
	ops, acks := j.takeBatch(1)
	if len(ops) != maxBatch || &ops[0] != first {
		t.Errorf("took %d operations of %d pending, copied %v; want %d, not copied", len(ops), maxBatch+2, &ops[0] != first, maxBatch)
	}
	j.batchDone(ops, acks)
	if rest, _ := j.takeBatch(1); len(rest) != 2 || rest[0].event.Revision != uint64(3+maxBatch) {
		t.Errorf("then took %d operations; want the 2 left, from revision %d", len(rest), 3+maxBatch)
	}
}

// allocated is what fn allocates, on every goroutine.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// discarding is a sink of that name that selects every event and keeps nothing it is handed.
type discarding string

func (d discarding) Name() string                     { return string(d) }
func (discarding) Selects(object.Event) (bool, error) { return true, nil }
func (discarding) Queue(Entry)                        {}
func (discarding) InitialState() bool                 { return false }

// TestAFlushedEventIsNotKeptAliveByThePendingOperations: once committed, an object's
// superseded versions are garbage; the journal keeps only the last one as the object's state.
// The array the operations waited in, resliced past them, kept every one alive until a later
// append outgrew it.
func TestAFlushedEventIsNotKeptAliveByThePendingOperations(t *testing.T) {
	j, _ := newJournal(t)
	j.targets = func() []Target { return []Target{discarding("sink")} }
	const versions = 1500 // two commits' worth, so the array is grown past what it holds
	old := make([]weak.Pointer[object.Object], 0, versions)
	prev := addedAt("a", 10).Object
	j.OnEvent(addedAt("a", 10))
	for v := range versions {
		e := addedAt("a", uint64(11+v))
		e.Type, e.OldObject = object.Modified, prev
		old = append(old, weak.Make(prev))
		prev = e.Object
		j.OnEvent(e)
	}
	if err := j.flush(); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	alive := 0
	for _, w := range old {
		if w.Value() != nil {
			alive++
		}
	}
	if alive > 0 {
		t.Errorf("%d of %d superseded versions are still alive after their commit", alive, len(old))
	}
}

// TestADrainedBacklogLeavesNothingOfItsSize: once a backlog of entries (an initial list's) has
// been delivered and acknowledged, the journal holds nothing of its size: not the arrays its
// operations and acknowledgements waited in, nor the outbox's table or order at their peak.
// After the initial deliveries of 20,000 configmaps they were 11 MB of dynwatch's live heap.
func TestADrainedBacklogLeavesNothingOfItsSize(t *testing.T) {
	j, _ := newJournal(t)
	j.targets = func() []Target { return []Target{discarding("sink")} }
	const entries = 20_000
	j.OnEvent(addedAt("a", 1))
	flush(t, j)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for v := range entries {
		j.OnEvent(addedAt("a", uint64(2+v))) // one object: its state is the same size throughout
	}
	flush(t, j)
	if n := j.OutboxLen("sink"); n != entries+1 {
		t.Fatalf("%d entries in the outbox; want %d", n, entries+1)
	}
	for seq := range uint64(entries + 1) {
		j.Ack("sink", seq+1)
	}
	flush(t, j)
	if n := j.OutboxLen("sink"); n != 0 {
		t.Fatalf("%d entries in the outbox after every one was acknowledged; want 0", n)
	}
	if j.compacting { // the log compacted once most of it was acknowledged: a passing cost
		j.finishCompaction(<-j.compacted)
	}
	j.removing.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d KiB kept after %d entries were recorded and acknowledged", kept>>10, entries)
	if kept > maxSpareBytes+2<<20 { // commit buffers (maxSpareBytes) and a commit's arrays kept for the next
		t.Errorf("%d KiB kept after %d entries were recorded and acknowledged; want nothing of their number", kept>>10, entries)
	}
}

// TestAcknowledgementsWaitInLittle: acknowledgements wait for the next commit (up to
// ackDelay); a delivered initial list's wait at once. Each takes a sink and a sequence, not a
// whole operation: 100,000 of them were 19 MB.
func TestAcknowledgementsWaitInLittle(t *testing.T) {
	j, _ := newJournal(t)
	const acks = 20_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for seq := range uint64(acks) {
		j.Ack("sink", seq+1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / acks
	t.Logf("%d bytes per acknowledgement pending", per)
	if per > 64 {
		t.Errorf("%d bytes per acknowledgement pending; want no more than twice a sink's name and a sequence", per)
	}
}

// TestACommitOfAnInitialListMakesLittleGarbage: what the journal allocates to record an
// initial list's events, beside the entries it keeps, is a few bytes per event and sink: the
// batch's bookkeeping (the operations waiting, the entries to queue, the progress of the
// stream) is not grown anew for every commit, nor copied as it grows, whatever the number of
// sinks. Through the initial list of 20,000 configmaps, 24 MB of it was garbage within a third
// of a second, the peak of dynwatch's resident memory; with two sinks or more, the arrays of
// entries were let go and grown anew for every commit (16 MB through the list of 10,000).
func TestACommitOfAnInitialListMakesLittleGarbage(t *testing.T) {
	for _, c := range []struct {
		name  string
		sinks int
	}{{"one sink", 1}, {"two sinks", 2}, {"three sinks", 3}} {
		t.Run(c.name, func(t *testing.T) {
			j, _ := newJournal(t)
			targets := make([]Target, c.sinks)
			for i := range targets {
				targets[i] = discarding(fmt.Sprintf("sink-%d", i))
			}
			j.targets = func() []Target { return targets }
			const objects = 4 * maxBatch
			events := make([]object.Event, objects)
			for i := range events {
				events[i] = addedAt(fmt.Sprintf("cm-%05d", i), uint64(10+i))
				events[i].InitialList = true
			}
			record := func(events []object.Event) {
				for _, e := range events { // at once, as an informer hands a list it has read
					j.OnEvent(e)
				}
				flush(t, j)
			}
			record(events[:maxBatch]) // the journal's own arrays and maps, grown once
			per := allocated(func() { record(events[maxBatch:]) }) / (objects - maxBatch)
			limit := uint64(1280 + 1280*c.sinks) // 2,560 with one sink, as before; its state, and for each sink its entry's strings, its index and its room in commit buffers
			t.Logf("%d bytes allocated per event of an initial list (limit %d)", per, limit)
			if per > limit {
				t.Errorf("%d bytes allocated per event of an initial list; want no more than %d: its state, and its entry for each sink", per, limit)
			}
		})
	}
}

// TestAnEntryIsQueuedWithoutABodyOfItsOwn: the log records each entry's whole request body,
// but the entry queued for the sink holds only the event and the old object, which live on
// anyway, and builds the same body when it is sent: a body is not held twice while it waits
// (an initial list of 20,000 objects queued 20,000 of them).
func TestAnEntryIsQueuedWithoutABodyOfItsOwn(t *testing.T) {
	j, tg := newJournal(t)
	j.OnEvent(addedWithData("a", 11, 100))
	flush(t, j)
	changed := addedWithData("a", 12, 200)
	changed.Type = object.Modified
	j.OnEvent(changed)
	flush(t, j)
	if len(tg.entries) != 2 {
		t.Fatalf("%d entries queued; want 2", len(tg.entries))
	}
	var recorded [][]byte
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool {
		recorded = append(recorded, e.Body)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for i, e := range tg.entries {
		if e.Body != nil {
			t.Errorf("entry %d was queued with a body of its own, %d bytes", i, len(e.Body))
		}
		if got := AppendBody(nil, e); string(got) != string(recorded[i]) {
			t.Errorf("entry %d builds the body\n%s\nwhere the log recorded\n%s", i, got, recorded[i])
		}
	}
	if !strings.Contains(string(recorded[1]), `"oldObject":`) {
		t.Errorf("the MODIFIED entry's body has no oldObject: %s", recorded[1])
	}
}

// TestAnEntryReadBackHoldsTheCachedObjectItCarries: an entry read back from the outbox (a
// sink's queue refilled once an initial list outgrew it) holds the cache's object, not a copy
// of its whole body, when the cache still holds the very version the body carries, and builds
// the same body when it is sent. An entry of a version the cache no longer holds, or with an
// oldObject, keeps its body.
func TestAnEntryReadBackHoldsTheCachedObjectItCarries(t *testing.T) {
	tg := &target{}
	cache := map[string]*object.Object{}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} },
		Current: func(_ schema.GroupVersionResource, _, name string) (*object.Object, bool) {
			o, ok := cache[name]
			return o, ok
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	a, b := addedWithData("a", 11, 100), addedWithData("b", 12, 100)
	c := addedWithData("c", 15, 100)
	c.Type, c.OldObject = object.Modified, addedWithData("c", 14, 50).Object
	cache["a"], cache["b"], cache["c"] = a.Object, addedWithData("b", 13, 100).Object, c.Object
	for _, e := range []object.Event{a, b, c} {
		j.OnEvent(e)
	}
	flush(t, j)
	var read []Entry
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool {
		read = append(read, e)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(read) != 3 || len(tg.entries) != 3 {
		t.Fatalf("read back %d entries, queued %d; want 3", len(read), len(tg.entries))
	}
	for i, want := range []struct {
		name   string
		shared bool
	}{{"a", true}, {"b", false}, {"c", false}} {
		e := read[i]
		if shared := e.Body == nil && e.Event.Object == cache[want.name]; shared != want.shared {
			t.Errorf("%s read back holding the cache's object: %v (body of %d bytes); want %v", want.name, shared, len(e.Body), want.shared)
		}
		if got, recorded := AppendBody(nil, e), AppendBody(nil, tg.entries[i]); string(got) != string(recorded) {
			t.Errorf("%s read back builds the body\n%s\nwhere the log recorded\n%s", want.name, got, recorded)
		}
	}
}

// TestACommitIsBoundedInSize: a batch stops at what a commit may write (maxCommitBytes, made
// 1 MiB here), not only at maxBatch operations, so that an initial list of large objects (etcd
// allows 1.5 MB each) does not build commits of gigabytes: 1,024 of them made one buffer of
// about 3 GB with one sink. An event larger than the bound still commits, alone.
// TestACommitWritesObjectsFromWhereTheyLie: an event's object, and the entry's body that
// carries it, are written to the log from the object's own JSON, not copied into the commit:
// an initial list of 20,000 configmaps copied about 100 MB into commit buffers in a third of
// a second, the peak of dynwatch's resident memory.
func TestACommitWritesObjectsFromWhereTheyLie(t *testing.T) {
	j, tg := newJournal(t)
	const objects, size = 16, 1 << 20
	events := make([]object.Event, objects)
	for i := range events {
		events[i] = addedWithData(fmt.Sprint("o-", i), uint64(1+i), size)
	}
	// Each object added, then modified: the second entry's body carries both versions.
	for i := range objects {
		e := addedWithData(fmt.Sprint("o-", i), uint64(objects+1+i), size)
		e.Type, e.OldObject = object.Modified, events[i].Object
		events = append(events, e)
	}
	total := allocated(func() {
		for _, e := range events {
			j.OnEvent(e)
		}
		flush(t, j)
	})
	t.Logf("%d MiB allocated to record %d events of objects of 1 MiB", total>>20, len(events))
	if total > uint64(len(events)*size/4) {
		t.Errorf("%d MiB allocated to record %d events of objects of 1 MiB, each written with its entry's body; want a fraction of one MiB each", total>>20, len(events))
	}
	if len(tg.entries) != len(events) {
		t.Fatalf("%d entries queued; want %d", len(tg.entries), len(events))
	}
	// What was written reads back as what was recorded.
	var entries []Entry
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(d Entry) bool { entries = append(entries, d); return true }); err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(events) {
		t.Fatalf("%d entries read back; want %d", len(entries), len(events))
	}
	for _, d := range entries {
		want := AppendBody(nil, tg.entries[d.Seq-1])
		if got := AppendBody(nil, d); !bytes.Equal(got, want) {
			t.Errorf("entry %d reads back as a body of %d bytes; want the %d recorded", d.Seq, len(got), len(want))
		}
	}
}

func TestACommitIsBoundedInSize(t *testing.T) {
	tg := &target{}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} }, commitBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	const objects, size = 10, 150 << 10 // about 300 KiB a commit with one sink
	j.OnEvent(addedWithData("big", 1, 3<<20))
	for i := range objects {
		j.OnEvent(addedWithData(fmt.Sprint("o-", i), uint64(2+i), size))
	}
	flush(t, j)
	// The big one alone, then three of 150 KiB to a commit.
	if c, want := commits(j), 1+float64((objects+2)/3); c != want {
		t.Errorf("%v commits of one 3 MiB object and %d of 150 KiB; want %v", c, objects, want)
	}
	if len(tg.entries) != objects+1 {
		t.Errorf("%d entries queued; want %d", len(tg.entries), objects+1)
	}
}

// TestAnEventThatComesWhileABatchIsAppliedTakesASmallBlock: the writer applies one block while
// an event arrives; the event waits in a block sized to what waits, not in a whole maxBatch
// one (240 KB to allocate and clear, 70 times in a storm of 9,000 updates).
func TestAnEventThatComesWhileABatchIsAppliedTakesASmallBlock(t *testing.T) {
	j, _ := newJournal(t)
	e := addedAt("a", 1)
	overlap := func() {
		j.OnEvent(e)
		applying, acks := j.takeBatch(1)
		j.OnEvent(e) // while the first is applied
		next, nextAcks := j.takeBatch(1)
		j.batchDone(applying, acks)
		j.batchDone(next, nextAcks)
	}
	overlap()
	const rounds = 100
	perRound := allocated(func() {
		for range rounds {
			overlap()
		}
	}) / rounds
	if limit := uint64(2 * minBlock * unsafe.Sizeof(op{})); perRound > limit {
		t.Errorf("an event recorded while a batch was applied allocated %d bytes; want at most %d (a block of %d is %d)", perRound, limit, maxBatch, maxBatch*unsafe.Sizeof(op{}))
	}
}

// TestACommitTakesTheMapsOfTheOneBeforeClearedAndNothingOfIt: a transaction ended (here
// without its commit, as after a failed one) is the next one begun, its maps empty: what it
// staged is neither listed, nor held, nor stored by the next commit.
func TestACommitTakesTheMapsOfTheOneBeforeClearedAndNothingOfIt(t *testing.T) {
	j, _ := newJournal(t)
	secret := addedAt("s", 5).Object
	first := j.store.begin(0)
	first.put("secrets", "ns/s", secret)
	first.revision("secrets", "", "", 5)
	first.end()
	next := j.store.begin(0)
	if next != first {
		t.Fatal("the next commit did not take the transaction ended before it")
	}
	if res := next.resources(); len(res) != 0 || next.holds("secrets") {
		t.Fatalf("the next commit sees secrets (resources %v), which only the one ended staged", next.resources())
	}
	if _, ok := next.get("secrets", "ns/s"); ok {
		t.Fatal("the next commit reads a secret only the one ended staged")
	}
	next.put("configmaps", "ns/a", addedAt("a", 6).Object)
	if _, err := next.commit(); err != nil {
		t.Fatal(err)
	}
	next.end()
	if _, ok := j.store.objects["secrets"]; ok {
		t.Error("the store holds secrets after a commit that staged none")
	}
	if _, ok := j.store.revisions["secrets"]; ok {
		t.Error("the store holds a revision of secrets after a commit that noted none")
	}
	if _, ok := j.store.objects["configmaps"]["ns/a"]; !ok {
		t.Error("the commit's own object is not stored")
	}
}
