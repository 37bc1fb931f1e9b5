package history

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

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

func TestAHistoryAnswersTheStateAtEveryRevisionItHolds(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 1<<30)
	states, last := churn(l, 20, 9)
	check := func(l *Log) {
		t.Helper()
		floor, through := l.Floor()
		if floor != 100 || through != last {
			t.Fatalf("floor and through are %d and %d; want 100 and %d", floor, through, last)
		}
		present := states[last]
		for rev := floor + 1; rev <= last; rev += 7 {
			past, err := l.Past(t.Context(), rev)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint64{}
			for k, v := range present {
				if !past.Changed(k) {
					got[k] = v
					continue
				}
				o, changed, err := past.At(k)
				if err != nil || !changed {
					t.Fatalf("at %d, %s changed but its state then: %v, %v", rev, k, changed, err)
				}
				if o != nil {
					got[k] = object.Revision(o.GetResourceVersion())
				}
			}
			if err := past.Gone(t.Context(), func(o *object.Object) bool {
				got[object.KeyOf(o)] = object.Revision(o.GetResourceVersion())
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if want := states[rev]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("at %d:\n got %v\nwant %v", rev, got, want)
			}
		}
	}
	check(l)
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, 1<<30) // read back: every segment sealed
	t.Cleanup(func() { _ = l.close() })
	check(l)
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
	past, err := l.Past(t.Context(), after.Floor)
	if err != nil {
		t.Fatal(err)
	}
	if want := 599 - int(after.Floor); len(past.changed) != want {
		t.Fatalf("at the floor %d, %d objects changed after; want %d", after.Floor, len(past.changed), want)
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
