package history

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

var configmaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func cm(name string, rv uint64, value string) *object.Object {
	o, err := object.FromJSON(fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"ns","name":%q,"uid":"u-%s","resourceVersion":"%d"},"data":{"v":%q}}`, name, name, rv, value))
	if err != nil {
		panic(err)
	}
	return o
}

// openLog opens a history in dir that keeps everything for an hour, within maxBytes.
func openLog(t *testing.T, dir string, maxBytes int64) *Log {
	t.Helper()
	c, err := newCodec()
	if err != nil {
		t.Fatal(err)
	}
	l, err := open(dir, configmaps, config.History{Retain: time.Hour, MaxBytes: maxBytes}, c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// churn writes, from revision 100 on, objects a0..a(n-1) added, each changed changes times,
// and the even ones deleted; it returns the state of every object after each revision.
func churn(l *Log, n, changes int) (states map[uint64]map[string]uint64, last uint64) {
	states = map[uint64]map[string]uint64{}
	cur := map[string]*object.Object{}
	now := map[string]uint64{}
	rev := uint64(100)
	l.add(record{kind: kindGap, rev: rev}, nil, time.Now())
	snapshot := func() {
		m := map[string]uint64{}
		for k, v := range now {
			m[k] = v
		}
		states[rev] = m
	}
	emit := func(e object.Event) {
		rev++
		e.Revision, e.InOrder, e.Resource, e.Observed = rev, true, configmaps, time.Now()
		l.record(e, time.Now())
	}
	for round := 0; round <= changes; round++ {
		for i := range n {
			name := fmt.Sprintf("a%d", i)
			o := cm(name, rev+1, fmt.Sprintf("%d", round))
			if old, ok := cur[name]; ok {
				emit(object.Event{Type: object.Modified, Object: o, OldObject: old})
			} else {
				emit(object.Event{Type: object.Added, Object: o})
			}
			cur[name], now["ns/"+name] = o, rev
			snapshot()
		}
	}
	for i := 0; i < n; i += 2 {
		name := fmt.Sprintf("a%d", i)
		gone := cm(name, rev+1, "gone")
		emit(object.Event{Type: object.Deleted, Object: gone, Last: cur[name]})
		delete(cur, name)
		delete(now, "ns/"+name)
		snapshot()
	}
	l.flush()
	return states, rev
}

// TestAHistoryAnswersTheStateAtEveryRevisionItHolds reads the history at every seventh revision
// of a churn, as it stood at the churn's end and at some revisions after the one read (as a
// cache then would hold it), with the history in one segment and in a segment a block or so
// (the state before a change read from another segment), as written and read back.
func TestAHistoryAnswersTheStateAtEveryRevisionItHolds(t *testing.T) {
	for _, c := range []struct {
		name     string
		maxBytes int64
	}{{"one segment", 1 << 30}, {"a segment a block", 16 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLog(t, dir, c.maxBytes)
			states, last := churn(l, 40, 12)
			check := func(l *Log) {
				t.Helper()
				floor, through := l.Floor()
				if floor != 100 || through != last {
					t.Fatalf("floor and through are %d and %d; want 100 and %d", floor, through, last)
				}
				if n := len(l.segs); c.maxBytes < 1<<20 && n < 4 {
					t.Fatalf("the history is in %d segments; want several", n)
				}
				for rev := floor + 1; rev <= last; rev += 7 {
					for _, upTo := range []uint64{last, min(last, rev+29)} {
						checkPast(t, l, states, rev, upTo)
					}
				}
			}
			check(l)
			if err := l.close(); err != nil {
				t.Fatal(err)
			}
			l = openLog(t, dir, c.maxBytes) // read back: every segment sealed
			t.Cleanup(func() { _ = l.close() })
			check(l)
		})
	}
}

// checkPast checks that l read at rev as it stood at upTo, with the objects a cache at upTo
// held (states[upTo]), answers states[rev].
func checkPast(t *testing.T, l *Log, states map[uint64]map[string]uint64, rev, upTo uint64) {
	t.Helper()
	if err := pastAgrees(t.Context(), l, states, rev, upTo); err != nil {
		t.Fatal(err)
	}
}

func pastAgrees(ctx context.Context, l *Log, states map[uint64]map[string]uint64, rev, upTo uint64) error {
	past, err := l.Past(ctx, rev, upTo)
	if err != nil {
		return err
	}
	defer past.Close()
	got := map[string]uint64{}
	for k, v := range states[upTo] {
		if !past.Changed(object.SplitKey(k)) {
			got[k] = v
			continue
		}
		o, changed, err := past.At(object.SplitKey(k))
		if err != nil || !changed {
			return fmt.Errorf("at %d (up to %d), %s changed but its state then: %v, %w", rev, upTo, k, changed, err)
		}
		if o != nil {
			got[k] = object.Revision(o.GetResourceVersion())
		}
	}
	var both []string
	if err := past.Gone(ctx, func(o *object.Object) bool {
		k := object.KeyOf(o)
		if _, ok := got[k]; ok {
			both = append(both, k)
		}
		got[k] = object.Revision(o.GetResourceVersion())
		return true
	}); err != nil {
		return err
	}
	if len(both) > 0 {
		return fmt.Errorf("at %d (up to %d), %v are both held and gone", rev, upTo, both)
	}
	if want := states[rev]; fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("at %d (up to %d):\n got %v\nwant %v", rev, upTo, got, want)
	}
	return nil
}

// TestReadsAtOnceShareDecodedBlocksAndEachAgrees reads the history at many revisions from
// several goroutines at once while it is written to: they share the blocks the cache holds,
// which is bounded, and each answers the state at its revision.
func TestReadsAtOnceShareDecodedBlocksAndEachAgrees(t *testing.T) {
	l := openLog(t, t.TempDir(), 16<<10)
	t.Cleanup(func() { _ = l.close() })
	states, last := churn(l, 40, 12)
	var g errgroup.Group
	for w := range 4 {
		g.Go(func() error {
			for rev := uint64(101 + w); rev <= last; rev += 13 {
				if err := pastAgrees(t.Context(), l, states, rev, last); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error { // a writer beside them: changes of other objects, after last
		for i := range 500 {
			o := cm(fmt.Sprintf("z%d", i), last+1+uint64(i), "z")
			l.record(object.Event{Type: object.Added, Object: o, Revision: last + 1 + uint64(i), InOrder: true, Resource: configmaps, Observed: time.Now()}, time.Now())
			if i%50 == 0 {
				l.flush()
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	c := l.codec.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Len() == 0 || c.bytes > c.max {
		t.Fatalf("the cache holds %d blocks in %d bytes; want some, within %d", c.lru.Len(), c.bytes, c.max)
	}
}

// TestTheStateBeforeAChangeIsReadFromTheRecordBeforeItOnlyWithNothingLeftOutBetween: the state
// of an object at a revision is read from its record before its next change when nothing was
// left out between (a list's records, which lie in key order, serve a page from a few blocks),
// and else from the state its next change carries; with the history in one segment, and in a
// segment a block (the record before read from another segment). The carried state is marked
// ("carried") to tell which was read; the apiserver's would be the same.
func TestTheStateBeforeAChangeIsReadFromTheRecordBeforeItOnlyWithNothingLeftOutBetween(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(l *Log, ev func(object.Event, uint64))
		at    uint64
		want  string // the value of data.v read at at
	}{
		{"a change after a list, with nothing between", func(l *Log, ev func(object.Event, uint64)) {
			ev(object.Event{Type: object.Added, Object: cm("a", 50, "listed"), InitialList: true}, 50)
			l.endList(100, time.Now())
			ev(object.Event{Type: object.Modified, Object: cm("a", 120, "2"), OldObject: cm("a", 50, "carried")}, 120)
		}, 110, "listed"},
		{"a change after a list and changes left out", func(l *Log, ev func(object.Event, uint64)) {
			ev(object.Event{Type: object.Added, Object: cm("a", 50, "listed"), InitialList: true}, 50)
			l.endList(100, time.Now())
			l.add(record{kind: kindGap, rev: 110, cause: gapLost}, nil, time.Now()) // a change at 105 left out
			ev(object.Event{Type: object.Modified, Object: cm("a", 120, "2"), OldObject: cm("a", 105, "carried")}, 120)
		}, 115, "carried"},
		{"a change after changes left out", func(l *Log, ev func(object.Event, uint64)) {
			ev(object.Event{Type: object.Added, Object: cm("a", 101, "0")}, 101)
			l.add(record{kind: kindGap, rev: 102, cause: gapLost}, nil, time.Now()) // the change at 102
			ev(object.Event{Type: object.Modified, Object: cm("a", 103, "2"), OldObject: cm("a", 102, "carried")}, 103)
		}, 102, "carried"},
		{"a change after a relist", func(l *Log, ev func(object.Event, uint64)) {
			ev(object.Event{Type: object.Added, Object: cm("a", 101, "0")}, 101)
			l.record(object.Event{Type: object.Modified, Object: cm("a", 105, "relisted"), OldObject: cm("a", 101, "carried"), Revision: 105, Resource: configmaps, Observed: time.Now()}, time.Now()) // not InOrder: a relist found it
			l.flush()
			ev(object.Event{Type: object.Modified, Object: cm("a", 120, "2"), OldObject: cm("a", 105, "carried")}, 120)
		}, 110, "relisted"},
	} {
		for _, maxBytes := range []int64{1 << 30, 8} { // one segment; a segment a block
			t.Run(fmt.Sprintf("%s, segments of %d bytes at most", c.name, maxBytes/8), func(t *testing.T) {
				dir := t.TempDir()
				l := openLog(t, dir, maxBytes)
				ev := func(e object.Event, rev uint64) {
					e.Revision, e.InOrder, e.Resource, e.Observed = rev, !e.InitialList, configmaps, time.Now()
					l.record(e, time.Now())
					l.flush() // a block each
				}
				l.add(record{kind: kindGap, rev: 40, cause: gapListEnd}, nil, time.Now())
				c.write(l, ev)
				l.flush()
				read := func(l *Log) {
					t.Helper()
					past, err := l.Past(t.Context(), c.at, 200)
					if err != nil {
						t.Fatal(err)
					}
					defer past.Close()
					o, changed, err := past.At("ns", "a")
					if err != nil || !changed || o == nil {
						t.Fatalf("at %d, ns/a: %v, %v, %v", c.at, o, changed, err)
					}
					if v := gjson.GetBytes(o.JSON(), "data.v").String(); v != c.want {
						t.Fatalf("at %d, ns/a holds %q; want %q", c.at, v, c.want)
					}
				}
				read(l)
				if err := l.close(); err != nil {
					t.Fatal(err)
				}
				l = openLog(t, dir, maxBytes) // read back: the epochs are the blocks'
				t.Cleanup(func() { _ = l.close() })
				read(l)
			})
		}
	}
}

func TestAnObjectsRevisionsAreEveryVersionNewestFirstAlsoAfterItsDelete(t *testing.T) {
	l := openLog(t, t.TempDir(), 1<<30)
	t.Cleanup(func() { _ = l.close() })
	_, _ = churn(l, 4, 5)
	var types []string
	var revs []uint64
	if err := l.Revisions(t.Context(), "ns/a0", func(v Version) bool {
		types, revs = append(types, string(v.Type)), append(revs, v.Revision)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"DELETED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "ADDED"}
	if fmt.Sprint(types) != fmt.Sprint(want) {
		t.Fatalf("revisions %v (%v); want %v", types, revs, want)
	}
	for i := 1; i < len(revs); i++ {
		if revs[i] >= revs[i-1] {
			t.Fatalf("revisions not newest first: %v", revs)
		}
	}
	var deleted []string
	if err := l.Deleted(t.Context(), func(v Version) bool { deleted = append(deleted, v.Object.GetName()); return true }); err != nil {
		t.Fatal(err)
	}
	if len(deleted) != 2 {
		t.Fatalf("deleted %v; want a0 and a2", deleted)
	}
}

func TestChangesAfterARevisionComeInOrderWithTheObjectBefore(t *testing.T) {
	l := openLog(t, t.TempDir(), 1<<30)
	t.Cleanup(func() { _ = l.close() })
	_, last := churn(l, 5, 3)
	from := uint64(107)
	next := from + 1
	if err := l.Changes(t.Context(), from, true, func(c Change) bool {
		if c.Revision != next {
			t.Fatalf("change at %d; want %d", c.Revision, next)
		}
		if c.Type != object.Added && (c.Before == nil || c.Before.GetName() != c.Object.GetName()) {
			t.Fatalf("the %s at %d has no object before it", c.Type, c.Revision)
		}
		next++
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if next != last+1 {
		t.Fatalf("changes ended at %d; want %d", next-1, last)
	}
}

func TestRetentionDropsTheOldestSegmentsAndMovesTheFloorForGood(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 1<<20)
	rnd := rand.New(rand.NewPCG(1, 2)) // incompressible values, so that the history fills its disk
	big := make([]byte, 0, 16<<10)
	for range 16 << 10 {
		big = append(big, byte('a'+rnd.IntN(26)))
	}
	for i := range 400 {
		rnd.Shuffle(len(big), func(i, j int) { big[i], big[j] = big[j], big[i] })
		o := cm(fmt.Sprintf("b%d", i), uint64(200+i), string(big))
		l.record(object.Event{Type: object.Added, Object: o, Revision: uint64(200 + i), InOrder: true, Resource: configmaps}, time.Now())
	}
	l.flush()
	before := l.Stats()
	l.retain(time.Now())
	after := l.Stats()
	if after.Bytes > 1<<20 || after.Bytes >= before.Bytes {
		t.Fatalf("retention left %d bytes of %d; want at most 1 MiB", after.Bytes, before.Bytes)
	}
	if after.Floor <= 200 {
		t.Fatalf("the floor stayed at %d after retention dropped segments", after.Floor)
	}
	past, err := l.Past(t.Context(), after.Floor, 599)
	if err != nil {
		t.Fatal(err)
	}
	defer past.Close()
	changed := 0
	for i := range 400 {
		if past.Changed("ns", fmt.Sprintf("b%d", i)) {
			changed++
		}
	}
	if want := 599 - int(after.Floor); changed != want {
		t.Fatalf("at the floor %d, %d objects changed after; want %d", after.Floor, changed, want)
	}
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, 1<<20)
	t.Cleanup(func() { _ = l.close() })
	if floor, _ := l.Floor(); floor != after.Floor {
		t.Fatalf("read back, the floor is %d; want %d, where retention left it", floor, after.Floor)
	}
}

// TestAnInitialListLargerThanTheQueueIsKeptWhole: the objects of an initial list, which the cache
// holds anyway, are queued whatever their bytes, so that a large resource's history starts with
// every object's state (only changes count against maxQueued); changes past it are left out, and
// said so.
func TestAnInitialListLargerThanTheQueueIsKeptWhole(t *testing.T) {
	r, err := New(Options{Logger: slog.New(slog.DiscardHandler), Path: t.TempDir(), Policy: func(schema.GroupVersionResource) (config.History, bool) {
		return config.History{Retain: time.Hour, MaxBytes: 1 << 30}, true
	}})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 1<<20)
	objects := maxQueued>>20 + 8 // more than the queue takes
	for i := range objects {
		r.OnEvent(object.Event{Type: object.Added, Object: cm(fmt.Sprintf("l%02d", i), uint64(100+i), big), InitialList: true, Revision: uint64(100 + i), Resource: configmaps, Observed: time.Now()})
	}
	r.ListSynced(configmaps, 0, 200)
	for i := range objects { // changes past the queue are left out
		r.OnEvent(object.Event{Type: object.Modified, Object: cm(fmt.Sprintf("l%02d", i), uint64(201+i), big), InOrder: true, Revision: uint64(201 + i), Resource: configmaps, Observed: time.Now()})
	}
	r.write(time.Now())
	l, ok := r.Of(configmaps)
	if !ok {
		t.Fatal("no history of configmaps")
	}
	st := l.Stats()
	if st.Versions < objects || st.Lost == 0 {
		t.Fatalf("the history holds %d versions and lost %d; want the %d listed ones and some changes lost", st.Versions, st.Lost, objects)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
}

// TestSearchKeyFindsWhatHalvingFinds compares the interpolation search of a sealed index with
// sort.Search, over uniform hashes (what it is made for), runs of one key, and skewed keys.
func TestSearchKeyFindsWhatHalvingFinds(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	uniform := func(n int) []uint64 {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = rnd.Uint64()
		}
		return ks
	}
	skewed := func(n int) []uint64 {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = uint64(i * i) // dense at the start, sparse at the end
		}
		ks[n-1] = math.MaxUint64
		return ks
	}
	runs := func(n int) []uint64 {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = uint64(i/50) * (math.MaxUint64 / 64)
		}
		return ks
	}
	for name, ks := range map[string][]uint64{"uniform": uniform(5000), "skewed": skewed(3000), "runs": runs(2000), "few": uniform(7), "none": nil} {
		slices.Sort(ks)
		index := make([]entry, len(ks))
		for i, k := range ks {
			index[i] = entry{key: k}
		}
		probes := append(slices.Clone(ks), 0, 1, math.MaxUint64, math.MaxUint64-1)
		for range 2000 {
			probes = append(probes, rnd.Uint64())
		}
		for _, k := range ks {
			probes = append(probes, k+1, k-1)
		}
		for _, h := range probes {
			want := sort.Search(len(index), func(i int) bool { return index[i].key >= h })
			if got := searchKey(index, h); got != want {
				t.Fatalf("%s: searchKey(%d) = %d, sort.Search %d", name, h, got, want)
			}
		}
	}
}

// TestAHistoryBatchIsReadableAtOnceAndSyncedByTheWritersNextTick writes batches through a
// Recorder: each is readable once written (its versions counted, its objects read at a past
// revision) and not synced; the writer's tick syncs every one of them.
func TestAHistoryBatchIsReadableAtOnceAndSyncedByTheWritersNextTick(t *testing.T) {
	r, err := New(Options{Logger: slog.New(slog.DiscardHandler), Path: t.TempDir(), Policy: func(schema.GroupVersionResource) (config.History, bool) {
		return config.History{Retain: time.Hour, MaxBytes: 1 << 30}, true
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.close(); err != nil {
			t.Error(err)
		}
	}()
	rev := uint64(100)
	var l *Log
	for batch := range 5 {
		rev++
		r.OnEvent(object.Event{Type: object.Added, Object: cm(fmt.Sprintf("c%d", rev), rev, "v"), InOrder: true, Revision: rev, Resource: configmaps, Observed: time.Now()})
		r.write(time.Now())
		var ok bool
		if l, ok = r.Of(configmaps); !ok {
			t.Fatal("no history of configmaps")
		}
		if !l.wal.Unsynced() {
			t.Fatalf("batch %d was synced as it was written; want it synced by the tick", batch)
		}
		if st := l.Stats(); st.Versions != batch+1 {
			t.Fatalf("after batch %d the history holds %d versions; want %d", batch, st.Versions, batch+1)
		}
	}
	past, err := l.Past(t.Context(), 101, rev)
	if err != nil {
		t.Fatal(err)
	}
	if o, changed, err := past.At("ns", fmt.Sprintf("c%d", rev)); err != nil || !changed || o != nil {
		t.Fatalf("at 101, ns/c%d (added after): %v, %v, %v; want nil, true, nil", rev, o, changed, err)
	}
	past.Close()
	r.sync()
	if l.wal.Unsynced() {
		t.Fatal("the writer's tick left the batches unsynced")
	}
}
