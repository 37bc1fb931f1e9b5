package journal

import (
	"cmp"
	"errors"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynwatch/dynwatch/object"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Journal is the one path from the informers to the sinks' queues. OnEvent only appends to
// it; its goroutine takes everything pending at once and, in one commit to the store (a group
// commit), compares each event with the stored state of its object, filters it for every
// sink, writes the outbox entries and the object's new state, and only after the commit is
// written queues the deliveries (it is synced within syncEvery). So the state of an object
// never runs ahead of the outbox: what a crash cuts short before a commit, or before its sync,
// is derived again by the next start's comparison. A commit that fails (a full disk) queues nothing: its
// operations wait, and are committed again, until one succeeds. An operation that fails on its
// own (a corrupt entry) is counted and skipped; the rest of its batch commits. Without a store
// it only filters and queues.
type Journal struct {
	store   *store // nil: memory only
	log     *slog.Logger
	now     func() time.Time
	targets func() []Target
	m       *metrics
	retired func(Target)
	ignore  func(schema.GroupVersionResource, string, string) bool
	pre     *preselector // nil: the writer filters
	bound   func(schema.GroupVersionResource) (uint64, bool)
	current func(gvr schema.GroupVersionResource, namespace, name string) (*object.Object, bool)
	// commitBytes bounds a commit's size (see batchLen).
	commitBytes int
	// pressure bounds the events recorded and not yet committed (see Room).
	pressure *pressure

	mu sync.Mutex
	// pending are the operations waiting, in blocks of up to maxBatch (see takeBatch) from
	// the oldest; spare is a block applied, cleared, for the next.
	pending [][]op
	spare   []op
	// acks are the acknowledgements pending, apart from the other operations: each takes 24
	// bytes rather than an operation's 200 (a delivered initial list of 100,000 objects
	// waited as 19 MB of them), and the next commit applies every one, first.
	acks      []ack
	spareAcks []ack                  // the array of the acknowledgements last applied, cleared
	wake      chan struct{}          // something is pending that should commit now
	lazy      chan struct{}          // an acknowledgement is pending: it may wait up to ackDelay
	failure   atomic.Pointer[string] // the last commit's error, nil once one succeeds

	// Owned by the goroutine that flushes.
	batch batch // what the commit being made changes besides the store (see flushBatch)
	seq   uint64
	lists map[schema.GroupVersionResource]*listing
	// selections are, per resource name and stream, the selection its informer resumed with
	// (see Resume): the revisions of its events are recorded under it.
	selections map[string]map[string]string
	floor      Checkpoints            // the checkpoints Trim was given: what they cover is not recorded
	sinks      map[string]*sinkReplay // every target seen, by name: where its initialState replay stands
	first      bool                   // no batch has been applied yet
	payload    []byte                 // where fanOut builds the head of an event's payload for the log
	// compacting is true while a snapshot is being written; compacted receives it. After a
	// compaction fails, none begins before retryCompaction, compactionBackoff later.
	compacting        bool
	compacted         chan compaction
	removing          sync.WaitGroup // the removal of the files compactions replaced
	retryCompaction   time.Time
	compactionBackoff time.Duration
	// listsCoverAll: the initial lists hand the first batch's targets every object as ADDED
	// (no store, a new one, or one without sink records), so none of them replays.
	listsCoverAll bool

	// files is held to read entries from the log (shared) and to compact it (exclusive), so
	// that no file is removed under a reader. Take it before idx.
	files sync.RWMutex

	// What is committed, read by Checkpoints, OutboxLen and ReadOutbox.
	idx    sync.Mutex
	outbox map[string]map[uint64]indexed // sink → sequence → entry; the store's own map
	order  map[string][]uint64           // sink → its outbox's sequences in order, and some removed
	// outboxPeak is, per sink, the most entries its outbox's map has held since it was made.
	outboxPeak map[string]int
	progress   map[schema.GroupVersionResource]*progress
	seen       map[string]sinkView // the sinks' replay states as committed
}

// Target is a sink as the journal sees it.
type Target interface {
	// Name is the sink's name; its outbox is kept under it.
	Name() string
	// Selects reports whether the sink's filters select the event and, when its filter could
	// not decide, why: such an event is recorded (selected) with that error for the sink to
	// act on, or left out (not selected), as the sink chooses.
	Selects(object.Event) (bool, error)
	// Queue is handed each entry recorded for the sink once it is committed, in order, from
	// the journal's goroutine; it must not block.
	Queue(Entry)
	// InitialState reports whether the sink, when the journal first sees it, is to be handed
	// every current object as ADDED (see ReplayPage).
	InitialState() bool
}

// Options are a Journal's dependencies.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Path is the state store's file, opened (or created) by New and closed by Close; empty
	// keeps nothing: no outbox, no comparison after a restart.
	Path string
	Now  func() time.Time
	// Targets are the sinks, in configuration order; called from the journal's goroutine.
	Targets func() []Target
	// Retired is called, after the commit, for each target RemoveTarget removed.
	Retired func(Target)
	// Ignore, when set, names the objects whose changes are handed to no sink: the leader
	// election's own Lease and checkpoint ConfigMap, whose every delivery would move the
	// checkpoint, and so write it again. Their state is recorded all the same, so that a
	// stream resumed after a restart (Resume) holds them as the cache held them.
	Ignore func(gvr schema.GroupVersionResource, namespace, name string) bool
	// MaxPendingBytes bounds the bytes of events recorded and not yet committed before the
	// informers are held back (see Room); 0 never holds them back.
	MaxPendingBytes int64
	// Workers evaluate the targets' filters for events seen on a watch, off
	// the writer and in parallel across objects (each object's events in order); 0 leaves it
	// to the writer. Targets' Selects must then be safe to call from several goroutines.
	Workers int
	// Bound, when set, caps a resource's checkpoints: the revision through which the changes
	// the resource's informers make on their own (a namespaceSelector's namespaces joining and
	// leaving) have been handed to the journal; false for a resource without any. It is called
	// before the outboxes are read.
	Bound func(schema.GroupVersionResource) (uint64, bool)
	// Current, when set, is the object namespace/name of a resource as the informers' cache
	// holds it now. An entry read back from an outbox (ReadOutbox) whose body carries the very
	// version the cache holds, byte for byte and with no oldObject, then holds the cache's
	// object instead of its body, and builds the body when it is sent (AppendBody): a sink's
	// queue refilled from its outbox (an initial list longer than the queue) does not hold
	// every object a second time.
	Current func(gvr schema.GroupVersionResource, namespace, name string) (*object.Object, bool)

	// datasync is what makes the store's log durable; nil is fdatasync(2). A test makes it
	// slow or fail.
	datasync func(*os.File) error
	// commitBytes bounds a commit's size (see batchLen); 0 is maxCommitBytes. A test makes it
	// small.
	commitBytes int
}

// New opens the state store at o.Path (none when it is empty), reads the index of its
// outboxes, and registers the journal's metrics. Nothing is recorded until Run; Close closes
// the store.
func New(o Options) (*Journal, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	st, err := open(o.Logger, o.Path, o.datasync)
	if err != nil {
		return nil, err
	}
	j := &Journal{store: st, log: o.Logger, now: o.Now, targets: o.Targets, retired: o.Retired, ignore: o.Ignore, bound: o.Bound, current: o.Current, commitBytes: cmp.Or(o.commitBytes, maxCommitBytes), m: newMetrics(st),
		wake: make(chan struct{}, 1), lazy: make(chan struct{}, 1), lists: map[schema.GroupVersionResource]*listing{}, selections: map[string]map[string]string{}, floor: Checkpoints{},
		outbox: map[string]map[uint64]indexed{}, progress: map[schema.GroupVersionResource]*progress{},
		sinks: map[string]*sinkReplay{}, first: true, listsCoverAll: st == nil || st.Fresh,
		order: map[string][]uint64{}, outboxPeak: map[string]int{}, compacted: make(chan compaction, 1),
		pressure: newPressure(o.MaxPendingBytes, o.Now)}
	if st != nil {
		j.seq, j.outbox = st.seq, st.outbox
		for sink, entries := range st.outbox {
			j.order[sink] = slices.Sorted(maps.Keys(entries))
		}
	}
	for _, c := range append(j.pressure.m.collectors(), j.m) {
		if err := o.Registerer.Register(c); err != nil {
			_ = j.Close()
			return nil, err
		}
	}
	if o.Workers > 0 {
		j.pre = newPreselector(j, o.Workers)
	}
	return j, nil
}

// open opens the state store at path, logging what an operator should know of its state, or
// returns nil when path is empty.
func open(log *slog.Logger, path string, datasync func(*os.File) error) (*store, error) {
	if path == "" {
		log.Warn("state.path is not set: events queued at shutdown are dead-lettered, and a restart delivers every object as ADDED again")
		return nil, nil
	}
	st, err := openStore(path, datasync)
	if err != nil {
		return nil, err
	}
	if st.TornTail > 0 {
		log.Warn("state store: a commit cut short by a crash was dropped; what it held is derived again from the initial lists", "path", path, "bytes", st.TornTail)
	}
	if st.Damaged != "" {
		log.Error("state store damaged: set aside from the damage on, and every object changed since is delivered again with its usual event id", "path", path, "setAside", st.Damaged, "err", st.DamageErr)
	} else if st.Fresh {
		log.Warn("state store created: with no earlier state, every object is delivered as ADDED (expected on a first start; otherwise the state was lost)", "path", path)
	}
	return st, nil
}

// Durable reports whether the journal keeps a state store: without one nothing outlives the
// process, and there are no outboxes to read back.
func (j *Journal) Durable() bool { return j.store != nil }

// Close stops the preselector's workers, waits for a compaction under way, and closes the
// state store, if there is one. Call it once Run has returned and nothing reads the outboxes
// any more.
func (j *Journal) Close() error {
	if j.pre != nil {
		j.pre.stop()
	}
	if j.store == nil {
		return nil
	}
	if j.compacting {
		j.finishCompaction(<-j.compacted)
	}
	j.removing.Wait()
	return j.store.close()
}

// Sinks lists the sinks that have an outbox in the state store.
func (j *Journal) Sinks() ([]string, error) {
	if j.store == nil {
		return nil, nil
	}
	j.idx.Lock()
	defer j.idx.Unlock()
	return slices.Sorted(maps.Keys(j.outbox)), nil
}

// OnEvent hands an informer's event to the journal (it implements dynamicinformer.Subscriber).
// It never blocks: what it holds until the event is committed is bounded by holding the
// informers back (see Room). With workers, an event other than an initial list's is filtered
// by them first; an initial list's, mostly unchanged objects after a restart, goes straight to
// the writer, which filters only what changed. An object Ignore names is recorded, in order
// with the rest, and handed to no sink.
func (j *Journal) OnEvent(e object.Event) {
	o := op{kind: opEvent, event: e, quiet: j.ignores(e.Resource, e.Object)}
	j.pressure.take(heldBytes(e))
	if j.pre != nil && !e.InitialList {
		j.pre.add(o)
		return
	}
	j.submit(o)
}

// ignores reports whether Options.Ignore names obj, of gvr.
func (j *Journal) ignores(gvr schema.GroupVersionResource, obj *object.Object) bool {
	return j.ignore != nil && j.ignore(gvr, obj.GetNamespace(), obj.GetName())
}

// ListStarted implements dynamicinformer.ListObserver. With workers, it first waits until what
// they hold is committed: the list's comparison starts after every earlier event.
func (j *Journal) ListStarted(gvr schema.GroupVersionResource, run uint64, streams []string) {
	if j.pre != nil {
		j.pre.drain()
	}
	j.submit(op{kind: opListStarted, control: &control{gvr: gvr, run: run, streams: streams}})
}

// ListSynced implements dynamicinformer.ListObserver. With workers, it first waits until what
// they hold is committed, as ListStarted does.
func (j *Journal) ListSynced(gvr schema.GroupVersionResource, run uint64, revision uint64) {
	if j.pre != nil {
		j.pre.drain()
	}
	j.submit(op{kind: opListSynced, control: &control{gvr: gvr, run: run, revision: revision}})
}

// SetDeadline keeps an entry's retry deadline across restarts.
func (j *Journal) SetDeadline(sink string, seq uint64, deadline time.Time) {
	if seq != 0 {
		j.submit(op{kind: opDeadline, sink: sink, seq: seq, control: &control{deadline: deadline}})
	}
}

// Corrupt counts an outbox entry that does not decode, and removes it.
func (j *Journal) Corrupt(sink string, seq uint64) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt outbox entry removed", "sink", sink, "seq", seq)
	j.Ack(sink, seq)
}

// DropSink removes a sink's outbox if it is empty.
func (j *Journal) DropSink(sink string) { j.submit(op{kind: opDropSink, sink: sink}) }

// RemoveTarget hands t to Retired once everything recorded for it so far is committed.
func (j *Journal) RemoveTarget(t Target) {
	j.submit(op{kind: opRemoveSink, control: &control{target: t}})
}

// Trim removes, from every outbox, the entries cp acknowledges, and until the next Trim does
// not record what it covers. cp is the journal's from then on.
func (j *Journal) Trim(cp Checkpoints) { j.submit(op{kind: opTrim, control: &control{cp: cp}}) }

// Backlog counts what the journal holds that is not done with: operations recorded and not
// yet committed, and outbox entries, of every sink, not yet acknowledged.
func (j *Journal) Backlog() int {
	j.mu.Lock()
	n := 0
	for _, block := range j.pending {
		n += len(block)
	}
	j.mu.Unlock()
	j.idx.Lock()
	defer j.idx.Unlock()
	for _, entries := range j.outbox {
		n += len(entries)
	}
	return n
}

// OutboxLen counts a sink's outbox entries.
func (j *Journal) OutboxLen(sink string) int {
	j.idx.Lock()
	defer j.idx.Unlock()
	return len(j.outbox[sink])
}

func (j *Journal) submit(o op) {
	j.mu.Lock()
	n := len(j.pending)
	if n == 0 || len(j.pending[n-1]) >= maxBatch {
		block := j.spare
		if block == nil {
			// A block of maxBatch is 240 KB to allocate and clear: one was made whenever
			// an event came while the writer applied the block before (70 times in a storm of
			// 9,000 updates, a tenth of what it allocated). A block behind others (a
			// backlog) is whole from the start; the first grows as events come.
			size := minBlock
			if n > 0 {
				size = maxBatch
			}
			block = make([]op, 0, size)
		}
		j.pending, j.spare = append(j.pending, block), nil
		n++
	}
	if b := j.pending[n-1]; len(b) == cap(b) { // twice the room, within maxBatch
		grown := make([]op, len(b), min(max(2*cap(b), minBlock), maxBatch))
		copy(grown, b)
		clear(b) // the old array may live on under a batch taken from it: it keeps no event
		j.pending[n-1] = grown
	}
	j.pending[n-1] = append(j.pending[n-1], o)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Ack removes an outbox entry: its delivery is finished (made or dead-lettered).
func (j *Journal) Ack(sink string, seq uint64) {
	if seq == 0 {
		return
	}
	j.mu.Lock()
	j.acks = append(j.acks, ack{sink, seq})
	j.mu.Unlock()
	select {
	case j.lazy <- struct{}{}:
	default:
	}
}

// Healthy reports the last commit's failure, if the last commit failed.
func (j *Journal) Healthy() error {
	if msg := j.failure.Load(); msg != nil {
		return errors.New(*msg)
	}
	return nil
}

// Ready implements httpapi.Readiness: not ready while the state store cannot commit.
func (j *Journal) Ready() (bool, []string) {
	if err := j.Healthy(); err != nil {
		return false, []string{err.Error()}
	}
	return true, nil
}
