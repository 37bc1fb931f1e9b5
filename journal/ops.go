package journal

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

type opKind int

const (
	opEvent opKind = iota
	opListStarted
	opListSynced
	opDeadline   // a delivery's retry deadline is set: keep it across restarts
	opDropSink   // a sink's outbox is empty and the sink gone: remove the outbox
	opRemoveSink // a sink is removed: hand it to retired once what was queued for it is committed
	opTrim       // checkpoints: remove the outbox entries they acknowledge
	opReplay     // a page of current objects for one target's initialState
	opReplayStatus
	opResume // an informer's stream starts: what is recorded of it, to resume from
)

// op is one operation pending for the writer. Events and acknowledgements, nearly all of them,
// carry only their own fields; the rest are behind control, so that an initial list of
// 100,000 events waiting to be written is 20 MB of operations, not 42.
type op struct {
	kind  opKind
	event object.Event
	sink  string
	seq   uint64
	pre   *preselected // opEvent: what the preselector computed; nil for the writer to
	quiet bool         // opEvent: recorded, and handed to no sink (see Options.Ignore)
	*control
}

// control is what operations other than events and acknowledgements carry.
type control struct {
	gvr      schema.GroupVersionResource
	run      uint64
	deadline time.Time
	target   Target              // opRemoveSink
	streams  []string            // opListStarted
	revision uint64              // opListSynced
	cp       Checkpoints         // opTrim
	objects  []*object.Object    // opReplay
	complete bool                // opReplay: the resource's last page
	replayed chan<- int          // opReplay: how many entries, once committed
	status   chan<- ReplayStatus // opReplayStatus
	stream   string              // opResume
	sel      string              // opResume: the stream's selection
	resumed  chan<- resumption   // opResume
}

// queued is an entry to queue once its transaction has committed.
type queued struct {
	target Target
	e      Entry
}

// batch is what one transaction produced, put into effect only once it commits.
type batch struct {
	out       []queued
	added     []added
	removed   []removed
	deadlines []deadline
	dropped   []string
	progress  []step
	finished  []schema.GroupVersionResource
	retired   []Target
	sinks     bool     // a replay state changed
	replies   []func() // answers to send once committed
}

// reset empties b for the next commit, keeping the arrays of its entries and acknowledgements
// but those an outsized commit grew: a commit of an initial list's 1,024 events grew them anew
// each time (24 MB of garbage in the third of a second after the list of 20,000 configmaps).
func (b *batch) reset() {
	*b = batch{out: emptied(b.out, keptEntries), added: emptied(b.added, keptEntries), removed: emptied(b.removed, 2*maxBatch), progress: emptied(b.progress, 2*maxBatch)}
}

// keptEntries is how many entries a batch's arrays of them keep room for: a commit of maxBatch
// events to up to four sinks, in the array append grows to hold them (up to a third more than
// they need). Kept up to twice maxBatch, the arrays a commit of an initial list to two sinks
// grew were let go every time, and grown anew by copies for the next commit (16 MB of garbage
// through the list of 10,000 configmaps, at the peak of dynwatch's resident memory). What
// they keep is what the largest commit used, 3 MB at most.
const keptEntries = 6 * maxBatch

// emptied is s cleared, to be appended to again, or nil if it grew past n elements.
func emptied[S ~[]E, E any](s S, n int) S {
	if cap(s) > n {
		return nil
	}
	clear(s)
	return s[:0]
}

type added struct {
	sink string
	seq  uint64
	x    indexed
	off  int // of the entry in the commit's payload
}

type deadline struct {
	sink string
	seq  uint64
	at   int64
}

type removed struct {
	sink string
	seq  uint64
}

// ack is an acknowledgement pending: sink's entry seq is delivered (see Journal.Ack).
type ack struct {
	sink string
	seq  uint64
}

// ackSize is about what an acknowledgement adds to a commit: its kind, a sink's name and a
// sequence.
const ackSize = 32

// eventBytes is what the events of ops held (see heldBytes).
func eventBytes(ops []op) int64 {
	var n int64
	for _, o := range ops {
		if o.kind == opEvent {
			n += heldBytes(o.event)
		}
	}
	return n
}

// commitSize is about what a commit of ops copies into its buffer with n sinks, so that the
// buffer is allocated once rather than grown, and no larger than it needs (see opSize).
func commitSize(ops []op, n int) int {
	size := 0
	for _, o := range ops {
		size += opSize(o, n, true)
	}
	return size
}

// opSize is about what o adds to a commit with n sinks: its object, and for each sink an entry
// with the object and, but for an ADDED, its old one (about as large). copied leaves out the
// objects the commit writes from where they lie (see txn.value): what its buffer holds.
func opSize(o op, n int, copied bool) int {
	if o.kind != opEvent {
		return 0
	}
	obj, old := len(o.event.Object.JSON()), 0
	if o.event.Type != object.Added {
		old = obj
	}
	if copied && obj >= refMin {
		obj, old = 0, 0
	}
	return 128 + obj + n*(512+obj+old)
}

func (o op) String() string {
	switch o.kind {
	case opEvent:
		return fmt.Sprintf("%s %s %s", o.event.Type, object.ResourceName(o.event.Resource), object.KeyOf(o.event.Object))
	case opListStarted, opListSynced:
		return "list " + object.ResourceName(o.gvr)
	case opTrim:
		return "trim to checkpoints"
	case opReplay, opReplayStatus:
		return fmt.Sprintf("initialState of %s: %s", o.target.Name(), object.ResourceName(o.gvr))
	case opResume:
		return fmt.Sprintf("resume %s stream %q", object.ResourceName(o.gvr), o.stream)
	default:
		return fmt.Sprintf("outbox %s entry %d", o.sink, o.seq)
	}
}
