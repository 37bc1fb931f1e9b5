package delivery

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

func delivery(key, id string) Delivery { return Delivery{Entry: journal.Entry{Key: key, ID: id}} }

func TestQueueOrdersPerKeyAndRunsKeysInParallel(t *testing.T) {
	q := NewQueue(10)
	for _, d := range []Delivery{delivery("a", "a1"), delivery("a", "a2"), delivery("b", "b1"), delivery("a", "a3")} {
		if err := q.Push(d); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	first, _ := q.Pop(ctx)
	second, _ := q.Pop(ctx)
	if first.ID != "a1" || second.ID != "b1" {
		t.Fatalf("popped %s, %s; want a1 then b1 (a2 must wait for a1)", first.ID, second.ID)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if d, err := q.Pop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("popped %s while a and b were both in progress", d.ID)
	}
	q.Done(first)
	if d, _ := q.Pop(ctx); d.ID != "a2" {
		t.Fatalf("popped %s after a1 was done, want a2", d.ID)
	}
	if q.Len() != 3 {
		t.Fatalf("Len = %d, want 3 (a2 and b1 in progress, a3 queued)", q.Len())
	}
	if left := q.Drain(); len(left) != 1 || left[0].ID != "a3" {
		t.Fatalf("Drain = %v, want [a3]", left)
	}
}

func TestQueueRefusesPastCapacity(t *testing.T) {
	q := NewQueue(2)
	_ = q.Push(delivery("a", "1"))
	_ = q.Push(delivery("b", "2"))
	if err := q.Push(delivery("c", "3")); !errors.Is(err, ErrFull) {
		t.Fatalf("Push past capacity = %v, want ErrFull", err)
	}
	d, _ := q.Pop(t.Context())
	q.Done(d)
	if err := q.Push(delivery("c", "3")); err != nil {
		t.Fatalf("Push after Done freed room = %v", err)
	}
}

func TestQueueRetryHoldsItsKeyNotAWorker(t *testing.T) {
	q := NewQueue(10)
	for _, d := range []Delivery{delivery("a", "a1"), delivery("a", "a2"), delivery("b", "b1")} {
		if err := q.Push(d); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	a1, _ := q.Pop(ctx)
	retryAt := time.Now().Add(200 * time.Millisecond)
	q.Retry(a1, retryAt)
	if d, _ := q.Pop(ctx); d.ID != "b1" {
		t.Fatalf("popped %s while a1 waits to retry; want b1, the other key", d.ID)
	}
	next, _ := q.Pop(ctx)
	if next.ID != "a1" || time.Now().Before(retryAt) {
		t.Fatalf("popped %s at %s before the retry time; want a1, not before it", next.ID, time.Until(retryAt))
	}
	q.Done(next)
	if d, _ := q.Pop(ctx); d.ID != "a2" {
		t.Fatalf("popped %s; want a2 after a1", d.ID)
	}
	if n := q.Len(); n != 2 {
		t.Fatalf("Len = %d with b1 and a2 in progress, want 2", n)
	}
}

func TestQueuePopFailsOnceItsContextHasEndedEvenWithDeliveriesReady(t *testing.T) {
	q := NewQueue(10)
	_ = q.Push(delivery("a", "1"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if d, err := q.Pop(ctx); err == nil {
		t.Fatalf("Pop handed %q to a worker whose context has ended; want an error", d.ID)
	}
	if q.Len() != 1 {
		t.Errorf("%d deliveries queued; want the one pushed", q.Len())
	}
}

// TestQueueGivesEachNamespaceItsTurn: a burst of one namespace's changes (its objects brought
// in by a selection) queued before another namespace's one change does not hold it up: the
// workers take the namespaces' keys in turns, and each namespace's in the order they came.
func TestQueueGivesEachNamespaceItsTurn(t *testing.T) {
	q := NewQueue(100)
	key := func(ns, name string) string {
		return object.OrderingKey(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ns, name)
	}
	for i := range 5 {
		_ = q.Push(delivery(key("burst", fmt.Sprint(i)), fmt.Sprint("burst/", i)))
	}
	_ = q.Push(delivery(key("other", "x"), "other/x"))
	_ = q.Push(delivery(key("", "node"), "node")) // cluster-scoped: a namespace of its own
	var got []string
	for range 7 {
		d, err := q.Pop(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.ID)
		q.Done(d)
	}
	want := []string{"burst/0", "other/x", "node", "burst/1", "burst/2", "burst/3", "burst/4"}
	if !slices.Equal(got, want) {
		t.Errorf("popped %q; want %q", got, want)
	}

	// A delivery put back goes first again, ahead of the other namespaces' turns.
	for _, id := range []string{"a", "b"} {
		_ = q.Push(delivery(key(id, "o"), id))
	}
	first, _ := q.Pop(t.Context())
	q.Return(first)
	if again, _ := q.Pop(t.Context()); again.ID != first.ID {
		t.Errorf("after Return of %s, popped %s; want %s again", first.ID, again.ID, first.ID)
	}
}

// TestAStreamOfDeliveriesOfDifferentKeysReusesTheirArrays: a delivery pushed after another
// key's was popped and done takes that key's emptied array, which held nothing of it.
func TestAStreamOfDeliveriesOfDifferentKeysReusesTheirArrays(t *testing.T) {
	q := NewQueue(10)
	ctx := t.Context()
	keys := []string{"ns/a", "ns/b", "other/c"}
	i := 0
	cycle := func() {
		i++
		d := delivery(keys[i%len(keys)], "id")
		if err := q.Push(d); err != nil {
			t.Fatal(err)
		}
		got, err := q.Pop(ctx)
		if err != nil || got.Key != d.Key {
			t.Fatalf("popped %q, %v; want %q", got.Key, err, d.Key)
		}
		q.Done(got)
	}
	cycle()
	// What is left is the turns' per-namespace arrays of a key or two (16 bytes each).
	const rounds = 1000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		cycle()
	}
	runtime.ReadMemStats(&after)
	if perCycle := (after.TotalAlloc - before.TotalAlloc) / rounds; perCycle >= uint64(unsafe.Sizeof(Delivery{})) {
		t.Errorf("a push, pop and done allocated %d bytes; want less than a delivery's array (%d)", perCycle, unsafe.Sizeof(Delivery{}))
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, list := range q.free {
		for _, d := range list[:cap(list)] {
			if d.Key != "" {
				t.Errorf("a free array holds the delivery of %q", d.Key)
			}
		}
	}
}
