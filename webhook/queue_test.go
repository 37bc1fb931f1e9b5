package webhook

import (
	"context"
	"errors"
	"testing"
	"time"
)

func delivery(key, id string) Delivery { return Delivery{Key: key, ID: id} }

func TestMemoryQueueOrdersPerKeyAndRunsKeysInParallel(t *testing.T) {
	q := NewMemoryQueue(10)
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

func TestMemoryQueueRefusesPastCapacity(t *testing.T) {
	q := NewMemoryQueue(2)
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
