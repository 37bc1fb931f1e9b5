package journal

import (
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// syncTarget is a target safe to hand entries from Run's goroutine.
type syncTarget struct {
	mu      sync.Mutex
	entries []Entry
	queued  chan struct{}
}

func (*syncTarget) Name() string                                { return "sink" }
func (*syncTarget) Selects(dynamicinformer.Event) (bool, error) { return true, nil }
func (*syncTarget) InitialState() bool                          { return false }
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
		j.Record(addedAt(name, rev))
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
	j.Record(addedAt("a", 11))
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
