package journal

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
)

// Journal is the one path from the informers to the sinks' queues. Record only appends to
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
	pre     *preselector // nil: the writer filters
	bound   func(schema.GroupVersionResource) (uint64, bool)
	current func(gvr schema.GroupVersionResource, namespace, name string) (*dynamicinformer.Object, bool)
	// commitBytes bounds a commit's size (see batchLen).
	commitBytes int
	// pressure bounds the events recorded and not yet committed (see Room).
	pressure *pressure

	mu sync.Mutex
	// pending are the operations waiting, in blocks of maxBatch (see takeBatch) from the
	// oldest; spare is a block applied, cleared, for the next.
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
	Selects(dynamicinformer.Event) (bool, error)
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
	Current func(gvr schema.GroupVersionResource, namespace, name string) (*dynamicinformer.Object, bool)

	// datasync is what makes the store's log durable; nil is fdatasync(2). A test makes it
	// slow or fail.
	datasync func(*os.File) error
	// commitBytes bounds a commit's size (see batchLen); 0 is maxCommitBytes. A test makes it
	// small.
	commitBytes int
}

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
	event dynamicinformer.Event
	sink  string
	seq   uint64
	pre   *preselected // opEvent: what the preselector computed; nil for the writer to
	*control
}

// control is what operations other than events and acknowledgements carry.
type control struct {
	gvr      schema.GroupVersionResource
	run      uint64
	deadline time.Time
	target   Target                    // opRemoveSink
	streams  []string                  // opListStarted
	revision uint64                    // opListSynced
	cp       Checkpoints               // opTrim
	objects  []*dynamicinformer.Object // opReplay
	complete bool                      // opReplay: the resource's last page
	replayed chan<- int                // opReplay: how many entries, once committed
	status   chan<- ReplayStatus       // opReplayStatus
	stream   string                    // opResume
	sel      string                    // opResume: the stream's selection
	resumed  chan<- resumption         // opResume
}

// listing is a resource's initial list being compared with the stored state.
type listing struct {
	run     uint64
	streams []string
	fresh   bool                // nothing was stored for the resource
	seen    map[string]struct{} // keys listed so far
	count   struct{ unchanged, modified, added, deleted int }
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
	*b = batch{out: emptied(b.out), added: emptied(b.added), removed: emptied(b.removed), progress: emptied(b.progress)}
}

// emptied is s cleared, to be appended to again, or nil if it grew past a commit of maxBatch
// events to two sinks.
func emptied[S ~[]E, E any](s S) S {
	if cap(s) > 2*maxBatch {
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
	j := &Journal{store: st, log: o.Logger, now: o.Now, targets: o.Targets, retired: o.Retired, bound: o.Bound, current: o.Current, commitBytes: cmp.Or(o.commitBytes, maxCommitBytes), m: newMetrics(st),
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

// outboxPageSize is how many entries ReadOutbox reads at a time.
const outboxPageSize = 1000

// ReadOutbox reads sink's outbox in order from sequence from, calling fn with each entry until
// fn returns false, limit entries were read (no limit when limit <= 0), or the outbox ends. An
// entry read back carries its object's identity only; its Body is the whole request. Entries
// that do not decode are counted and acknowledged, and skipped. It returns the sequence to read
// from next (that of the entry fn refused, if it refused one) and whether the outbox ended.
// It is the one way anything reads an outbox back: a sink's window, the restore at start and
// the retirement of a removed sink.
func (j *Journal) ReadOutbox(sink string, from uint64, limit int, fn func(Entry) bool) (next uint64, end bool, err error) {
	if j.store == nil {
		return from, true, nil
	}
	for read := 0; limit <= 0 || read < limit; {
		n := outboxPageSize
		if limit > 0 {
			n = min(n, limit-read)
		}
		p, err := j.page(sink, from, n)
		if err != nil {
			return from, false, err
		}
		for _, seq := range p.Corrupt {
			j.Corrupt(sink, seq)
		}
		for _, e := range p.Entries {
			if !fn(e) {
				return e.Seq, false, nil
			}
			read++
		}
		from = p.Next
		if p.End {
			return from, true, nil
		}
	}
	return from, false, nil
}

// outboxPage is a stretch of a sink's outbox, oldest first. Its entries' events carry their
// objects' names, uids and resourceVersions only; each entry's Body is its whole request.
type outboxPage struct {
	Entries []Entry
	Corrupt []uint64 // entries that do not decode
	Next    uint64   // the first sequence after those read
	End     bool     // nothing follows
}

// page reads up to limit entries of a sink's outbox from sequence from on.
func (j *Journal) page(sink string, from uint64, limit int) (outboxPage, error) {
	j.files.RLock()
	defer j.files.RUnlock()
	p := outboxPage{Next: from, End: true}
	type slot struct {
		seq uint64
		x   indexed
	}
	var slots []slot
	j.idx.Lock()
	order := j.order[sink]
	for _, seq := range order[sort.Search(len(order), func(i int) bool { return order[i] >= from }):] {
		if len(slots) == limit {
			p.End = false
			break
		}
		if x, ok := j.outbox[sink][seq]; ok {
			slots = append(slots, slot{seq, x})
		}
	}
	j.idx.Unlock()
	var scratch []byte
	for _, s := range slots {
		e, corrupt, err := j.store.readEntry(s.seq, s.x)
		if err != nil {
			return p, err
		}
		p.Next = s.seq + 1
		if corrupt {
			p.Corrupt = append(p.Corrupt, s.seq)
			continue
		}
		e, scratch = j.shareObject(e, scratch)
		p.Entries = append(p.Entries, e)
	}
	return p, nil
}

// shareObject is e, read back from the outbox, holding the cache's object and no body when the
// cache holds the version of the object e carries and the body is, byte for byte, the one
// that object builds (see Options.Current); else e as it is. scratch is a buffer to build the
// body in, returned for the next entry.
func (j *Journal) shareObject(e Entry, scratch []byte) (Entry, []byte) {
	if j.current == nil {
		return e, scratch
	}
	o := e.Event.Object
	cur, ok := j.current(e.Event.Resource, o.GetNamespace(), o.GetName())
	if !ok || cur.GetUID() != o.GetUID() || cur.GetResourceVersion() != o.GetResourceVersion() {
		return e, scratch
	}
	shared := e
	shared.Event.Object, shared.Body = cur, nil
	scratch = AppendBody(scratch[:0], shared)
	if !bytes.Equal(scratch, e.Body) { // an oldObject, or the cache's object cut otherwise since a reload
		return e, scratch
	}
	return shared, scratch
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

// Record hands an informer's event to the journal. It never blocks: what it holds until the
// event is committed is bounded by holding the informers back (see Room). With workers, an
// event other than an initial list's is filtered by them first; an initial list's, mostly
// unchanged objects after a restart, goes straight to the writer, which filters only what
// changed.
func (j *Journal) Record(e dynamicinformer.Event) {
	j.pressure.take(heldBytes(e))
	if j.pre != nil && !e.InitialList {
		j.pre.add(op{kind: opEvent, event: e})
		return
	}
	j.submit(op{kind: opEvent, event: e})
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

// OutboxLen counts a sink's outbox entries.
func (j *Journal) OutboxLen(sink string) int {
	j.idx.Lock()
	defer j.idx.Unlock()
	return len(j.outbox[sink])
}

func (j *Journal) submit(o op) {
	j.mu.Lock()
	n := len(j.pending)
	if n == 0 || len(j.pending[n-1]) == cap(j.pending[n-1]) {
		block := j.spare
		if block == nil {
			block = make([]op, 0, maxBatch)
		}
		j.pending, j.spare = append(j.pending, block), nil
		n++
	}
	j.pending[n-1] = append(j.pending[n-1], o)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// ackDelay bounds how long an acknowledgement waits for a commit. Acknowledgements do
// not start commits of their own: they go with the next one that events start, and only
// when none has started for this long with one of their own. Under a steady stream of events
// that removes a commit (an fdatasync) per delivery; an acknowledgement lost in a crash is a
// delivery repeated with the same id, never one lost.
const ackDelay = time.Second

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

// Run flushes whenever something is pending that should commit now, and acknowledgements
// within ackDelay, until ctx ends; then it flushes and syncs once more. What a flush writes is
// handed to the sinks at once and synced within syncEvery, one fdatasync for every commit
// written meanwhile; the fdatasync runs on a goroutine of its own, and Run goes on committing
// while it does. Every releaseEvery it drops the pages reads of the store brought into the
// page cache. After a failed commit or sync it tries again with exponential backoff, from
// 100ms to 5s, not on every event.
func (j *Journal) Run(ctx context.Context) {
	retry := newStoppedTimer()
	acks := newStoppedTimer()
	syncs := newStoppedTimer()
	acksArmed, syncArmed := false, false
	var syncing <-chan struct{} // closed once the fdatasync in flight has returned
	var release <-chan time.Time
	if j.store != nil {
		t := time.NewTicker(releaseEvery)
		defer t.Stop()
		release = t.C
	}
	delay := time.Duration(0)
	failed := func(err error) {
		if err != nil {
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			retry.Reset(delay)
		} else {
			delay = 0
		}
	}
	// armSync starts the timer of the next sync, if something is left to sync and none is
	// in flight.
	armSync := func() {
		if delay == 0 && !syncArmed && syncing == nil && j.store != nil && j.store.log.Unsynced() {
			syncs.Reset(syncEvery)
			syncArmed = true
		}
	}
	for {
		select {
		case <-release:
			j.store.log.Release()
			continue
		case c := <-j.compacted:
			j.finishCompaction(c)
			j.maybeCompact() // the log may have outgrown the new snapshot meanwhile
			continue
		case <-j.wake:
			if delay > 0 {
				continue // failing: the timer decides when to try again
			}
		case <-j.lazy:
			if !acksArmed {
				acks.Reset(ackDelay)
				acksArmed = true
			}
			continue
		case <-acks.C:
			acksArmed = false
			if delay > 0 {
				continue
			}
		case <-syncs.C:
			syncArmed = false
			if delay == 0 && syncing == nil {
				var err error
				syncing, err = j.startSync()
				failed(err)
			}
			continue
		case <-syncing:
			syncing = nil
			failed(j.syncFinished())
			armSync() // what was committed while it ran
			continue
		case <-retry.C:
			failed(j.Flush())
			continue
		case <-ctx.Done():
			j.finish()
			return
		}
		failed(j.flush())
		armSync()
	}
}

func newStoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// syncEvery bounds how long a commit written stays unsynced: a delivery does not wait for its
// commit to be durable (see the package's guarantees), and the commits written within it share
// one fdatasync.
const syncEvery = 20 * time.Millisecond

// sync makes what the commits wrote durable, waiting for a sync begun by startSync first.
func (j *Journal) sync() error {
	if j.store == nil || !j.store.log.Unsynced() {
		return nil
	}
	return j.syncDone(j.store.sync())
}

// startSync begins making what the commits wrote durable on a goroutine of its own, and
// returns the channel closed once it has returned (nil when nothing is unsynced): Run goes on
// committing meanwhile, then calls syncFinished.
func (j *Journal) startSync() (<-chan struct{}, error) {
	if j.store == nil || !j.store.log.Unsynced() {
		return nil, nil
	}
	done, err := j.store.startSync()
	if err != nil {
		j.failed(err)
	}
	return done, err
}

// syncFinished puts into effect the outcome of the sync startSync began.
func (j *Journal) syncFinished() error { return j.syncDone(j.store.finishSync()) }

// syncDone notes a sync's outcome: counted when it succeeded, readiness failed until one does
// when it did not.
func (j *Journal) syncDone(err error) error {
	if err != nil {
		j.failed(err)
		return err
	}
	j.m.syncs.Inc()
	j.recovered()
	return nil
}

// failed notes that a commit or a sync failed: readiness fails, naming the store, until one
// succeeds.
func (j *Journal) failed(err error) {
	j.m.commitErrors.Inc()
	msg := fmt.Sprintf("state store %s: commit failed: %v", j.store.Path, err)
	if j.failure.Swap(&msg) == nil {
		j.log.Error("state store commit failed: nothing more is delivered until a commit succeeds", "path", j.store.Path, "err", err)
	}
}

// recovered notes that a commit or a sync succeeded.
func (j *Journal) recovered() {
	if j.failure.Swap(nil) != nil {
		j.log.Info("state store commits again", "path", j.store.Path)
	}
}

// finish commits and syncs what is pending and what the workers still evaluate, until a commit
// fails.
func (j *Journal) finish() {
	for j.Flush() == nil && j.pre != nil && !j.pre.empty() {
		select {
		case <-j.wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// releaseEvery is how often the pages that reads of the log brought into the page cache
// are dropped: an append drops its own once synced.
const releaseEvery = 10 * time.Second

// syncBytes bounds what a flush leaves written and not synced: the log holds each commit's
// frame in memory until its fdatasync (to write it again if the sync fails) and the kernel
// holds its pages dirty, both counted against the pod's memory limit. Without it, the
// initial list of 20,000 configmaps, one flush of twenty commits, held 109 MB of commit
// buffers at once: half the heap at its peak.
const syncBytes = 8 << 20

// maxBatch bounds the operations of one commit, so that the first events of an initial list
// of many objects reach the sinks while the rest are still being written.
const maxBatch = 1024

// maxCommitBytes bounds what one commit writes, as opSize estimates it: each object and, for
// each sink, an entry with the object and its old one. An initial list of large objects
// (etcd allows 1.5 MB each) made commits of gigabytes. A commit far smaller would part an
// event from those that arrived with it: with one fdatasync every syncBytes between commits,
// the others would wait for it.
const maxCommitBytes = 64 << 20

// Flush applies everything pending, as flush does, and syncs what it wrote.
func (j *Journal) Flush() error {
	if err := j.flush(); err != nil {
		return err
	}
	return j.sync()
}

// flush applies everything pending, in commits of a batch each (see batchLen), and queues each
// commit's entries once it is written; once the commits written since the last fdatasync pass
// syncBytes, it syncs them before the next. If a commit fails, nothing of it is queued and its
// operations wait for the next try, ahead of any that arrive meanwhile.
func (j *Journal) flush() error {
	for {
		j.mu.Lock()
		n := len(j.pending) + len(j.acks)
		j.mu.Unlock()
		if n == 0 {
			return nil
		}
		if err := j.flushBatch(); err != nil {
			return err
		}
		if j.store != nil && j.store.log.UnsyncedBytes() >= syncBytes {
			if err := j.sync(); err != nil {
				return err
			}
		}
	}
}

// flushBatch applies a batch of pending operations (see batchLen) in one commit.
func (j *Journal) flushBatch() error {
	targets := j.targets()
	ops, acks := j.takeBatch(len(targets))
	if len(ops) == 0 && len(acks) == 0 {
		return nil
	}
	seq, sinks, first, floor := j.seq, j.sinks, j.first, j.floor // put back if the commit fails
	j.sinks = cloneSinks(sinks)
	b := &j.batch
	defer b.reset()
	var tx *txn
	if j.store != nil {
		tx = j.store.begin(commitSize(ops, len(targets)) + len(acks)*ackSize)
	}
	j.see(tx, targets, b)
	for _, a := range acks {
		if tx != nil && tx.ack(a.sink, a.seq) {
			b.removed = append(b.removed, removed(a))
		}
	}
	for _, o := range ops {
		if err := j.apply(tx, targets, o, b); err != nil {
			j.m.writeErrors.Inc()
			j.log.Error("state store operation failed: it is skipped, the rest of its batch commits", "op", o.String(), "err", err)
			if o.kind == opEvent && tx != nil {
				// Forget the object's state, so that the next start derives it again from the cache.
				tx.del(object.ResourceName(o.event.Resource), object.KeyOf(o.event.Object))
			}
		}
	}
	if tx != nil {
		p, err := tx.commit()
		if err != nil {
			j.seq, j.sinks, j.first, j.floor = seq, sinks, first, floor
			j.failed(err)
			j.mu.Lock()
			if len(ops) > 0 {
				j.pending = append([][]op{ops}, j.pending...)
			}
			j.acks = append(acks, j.acks...)
			j.mu.Unlock()
			return err
		}
		for i := range b.added {
			b.added[i].x.at = at(p, b.added[i].off)
		}
		j.m.commits.Inc()
		j.recovered()
	}
	j.committed(b)
	j.pressure.give(eventBytes(ops))
	if b.sinks {
		j.publishSinks()
	}
	if j.pre != nil {
		for _, o := range ops {
			if o.pre != nil {
				j.pre.committed(o)
			}
		}
	}
	for _, gvr := range b.finished {
		delete(j.lists, gvr)
	}
	for _, q := range b.out {
		q.target.Queue(q.e)
	}
	for _, t := range b.retired {
		j.retired(t)
	}
	for _, reply := range b.replies {
		reply()
	}
	j.batchDone(ops, acks)
	j.maybeCompact()
	return nil
}

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

// takeBatch takes the pending operations one commit for that many sinks applies (see
// batchLen), oldest first, and every acknowledgement pending. Operations wait in blocks of
// maxBatch, so that a backlog (an initial list's 20,000 events, recorded at once) is not an
// array grown by copies (18 MB of garbage in a tenth of a second), and a batch is taken from
// the first block as it lies: the rest of the block when a commit holds all of it, or else
// its first slots, capped so that nothing is appended into them. batchDone clears them once
// applied, so that they keep no event, and its objects, alive, and keeps a whole block for
// the next.
func (j *Journal) takeBatch(sinks int) (ops []op, acks []ack) {
	j.mu.Lock()
	defer j.mu.Unlock()
	acks, j.acks, j.spareAcks = j.acks, j.spareAcks, nil
	if len(j.pending) == 0 {
		return nil, acks
	}
	first := j.pending[0]
	n := batchLen(first, sinks, j.commitBytes)
	if n < len(first) {
		j.pending[0] = first[n:]
		return first[:n:n], acks
	}
	n = copy(j.pending, j.pending[1:])
	j.pending[n] = nil // the last block, now also in the slot before
	j.pending = j.pending[:n]
	return first, acks
}

// batchLen is how many of ops, from the first, one commit for that many sinks applies: up to
// maxBatch, and no more than limit bytes as opSize estimates them, or the first alone when
// it is larger.
func batchLen(ops []op, sinks, limit int) int {
	size := 0
	for i, o := range ops {
		if i == maxBatch {
			return i
		}
		if size += opSize(o, sinks, false); i > 0 && size > limit {
			return i
		}
	}
	return len(ops)
}

// batchDone clears the operations of a batch applied and committed, so that they keep no
// event alive, and keeps their block for the next operations if they were a whole one and none
// is spare already. The acknowledgements' array is kept so too, unless a backlog grew it.
func (j *Journal) batchDone(ops []op, acks []ack) {
	clear(acks)
	clear(ops)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.spareAcks == nil && cap(acks) <= 2*maxBatch {
		j.spareAcks = acks[:0]
	}
	if j.spare == nil && cap(ops) == maxBatch {
		j.spare = ops[:0]
	}
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
	if o.event.Type != dynamicinformer.Added {
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

// apply applies one operation within tx (nil without a store).
func (j *Journal) apply(tx *txn, targets []Target, o op, b *batch) error {
	if tx == nil && (o.kind == opDeadline || o.kind == opDropSink || o.kind == opTrim) {
		return nil // without a store there is no outbox
	}
	var err error
	switch o.kind {
	case opEvent:
		err = j.applyEvent(tx, targets, o.event, o.pre, b)
		b.advance(o.event)
	case opListStarted:
		j.listStarted(tx, o.gvr, o.run, o.streams)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, streams: o.streams})
	case opListSynced:
		err = j.listSynced(tx, targets, o.gvr, o.run, o.revision, b)
		b.progress = append(b.progress, step{gvr: o.gvr, run: o.run, synced: true})
	case opTrim:
		j.trim(tx, o.cp, b)
	case opDeadline:
		if tx.deadline(o.sink, o.seq, o.deadline) {
			b.deadlines = append(b.deadlines, deadline{o.sink, o.seq, unixNano(o.deadline)})
		}
	case opDropSink:
		// Only empty: a webhook added again under the name may already have entries.
		if tx.drop(o.sink, slices.ContainsFunc(b.added, func(a added) bool { return a.sink == o.sink })) {
			b.dropped = append(b.dropped, o.sink)
		}
	case opRemoveSink:
		b.retired = append(b.retired, o.target)
		j.forget(tx, o.target, b)
	case opReplay, opReplayStatus, opResume:
		b.replies = append(b.replies, j.applyControl(tx, o, b))
	}
	return err
}

// applyControl applies an operation that answers its caller, and returns the reply, sent once
// the commit is written. Apart from apply, so that the reply's closure does not move every
// operation apply is handed to the heap.
func (j *Journal) applyControl(tx *txn, o op, b *batch) func() {
	switch o.kind {
	case opReplay:
		n := j.applyReplay(tx, o, b)
		return func() { o.replayed <- n }
	case opReplayStatus:
		st := j.status(o.target)
		return func() { o.status <- st }
	default: // opResume
		inner(j.selections, object.ResourceName(o.gvr))[o.stream] = o.sel
		// Once committed: the stream's state as of its revision, with nothing of the batch
		// half applied.
		return func() { o.resumed <- j.resumption(o.gvr, o.stream, o.sel) }
	}
}

// applyEvent compares an informer's event with the stored state of its object, stores the
// new state, and fans out what changed. pre, when not nil, is what the preselector computed
// for e as recorded: its verdicts hold unless the comparison changes the event.
func (j *Journal) applyEvent(tx *txn, targets []Target, e dynamicinformer.Event, pre *preselected, bt *batch) error {
	if pre == nil {
		pre = &preselected{}
	}
	if tx == nil {
		j.fanOut(nil, targets, e, nil, pre.verdicts, bt)
		return nil
	}
	res, key := object.ResourceName(e.Resource), object.KeyOf(e.Object) // as in the cache
	var prev *stored
	if st, ok := tx.get(res, key); ok {
		prev = &st
	}
	if e.InOrder && e.Revision != 0 {
		if sel, ok := j.selections[res][e.Stream]; ok {
			tx.revision(res, e.Stream, sel, e.Revision)
		}
		if prev != nil && stale(e, *prev) {
			j.m.suppressed.Inc()
			return nil
		}
	}
	l := j.lists[e.Resource]
	if e.Type == dynamicinformer.Deleted {
		if l != nil {
			l.count.deleted++
		}
		tx.del(res, key)
		j.fanOut(tx, targets, e, nil, pre.verdicts, bt)
		return nil
	}
	if l != nil {
		l.seen[key] = struct{}{}
	}
	if prev != nil && prev.uid == string(e.Object.GetUID()) && prev.rv == e.Object.GetResourceVersion() {
		j.m.suppressed.Inc()
		if l != nil {
			l.count.unchanged++
		}
		j.store.keep(res, key, e.Object)
		return nil
	}
	var old *dynamicinformer.Object // the object as the sinks last saw it
	rederived := false
	if prev != nil && (prev.uid != string(e.Object.GetUID()) || e.OldObject == nil || e.OldObject.GetResourceVersion() != prev.rv) {
		var err error
		if old, err = j.store.object(*prev); err != nil {
			// What the sinks saw is unknown: deliver the object as new, derived from the cache.
			j.corruptObject(e.Resource, key, err)
			prev, rederived = nil, true
		}
	}
	var oldJSON []byte // the old object as the sinks saw it: the same encoding a payload would make
	if prev != nil && prev.uid == string(e.Object.GetUID()) {
		if old != nil {
			oldJSON = old.JSON()
		} else if prev.obj != nil {
			oldJSON = prev.obj.JSON()
		} else {
			oldJSON = e.OldObject.JSON() // the same state: its resourceVersion is the stored one
		}
	}
	verdicts := pre.verdicts // hold while the event stays as recorded
	tx.put(res, key, e.Object)
	switch {
	case prev == nil:
		if l != nil {
			l.count.added++
		}
		if rederived {
			e.Type, e.OldObject, verdicts = dynamicinformer.Added, nil, nil
		}
	case prev.uid != string(e.Object.GetUID()):
		// Deleted and created again under the same name while nobody was looking.
		gone := dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: e.Resource, Object: old, Observed: e.Observed, Stream: e.Stream, Revision: e.Revision, Since: object.After(object.Revision(prev.rv))}
		j.fanOut(tx, targets, gone, nil, nil, bt)
		e.Type, e.OldObject, verdicts = dynamicinformer.Added, nil, nil
	default:
		if old != nil {
			// The sinks last saw the stored state, not the cache's: that is the old object.
			e.Type, e.OldObject, verdicts = dynamicinformer.Modified, old, nil
		}
		if l != nil {
			l.count.modified++
		}
	}
	j.fanOut(tx, targets, e, oldJSON, verdicts, bt)
	return nil
}

// corruptObject counts and logs a stored object that does not decode.
func (j *Journal) corruptObject(gvr schema.GroupVersionResource, key string, err error) {
	j.m.corrupt.Inc()
	j.log.Error("corrupt stored object: its state is derived again from the cache", "resource", object.ResourceName(gvr), "key", key, "err", err)
}

// fanOut makes an entry of e for every target whose filters select it, and with a store
// writes it to the target's outbox, unless a checkpoint Trim was given already covers it.
// oldJSON, when not nil, is the old object as the sinks last saw it (the stored state) to send
// in place of e.OldObject's; verdicts are the targets' on e, computed before, or nil (a target
// missing from them, added since, is asked now).
func (j *Journal) fanOut(tx *txn, targets []Target, e dynamicinformer.Event, oldJSON []byte, verdicts map[Target]verdict, bt *batch) {
	var body payload // built once for every entry the commit records
	now := j.now()
	for _, t := range targets {
		v, ok := verdicts[t]
		if !ok {
			v.selected, v.err = t.Selects(e)
		}
		selected, filterErr := v.selected, v.err
		if !selected || !j.delivers(t, e) {
			continue
		}
		if tx != nil && e.Revision != 0 && e.Revision <= j.floor[t.Name()][e.Resource] {
			continue // the leader has delivered it, or a later state of the object
		}
		// Queued without its body: the sink builds it from the event and the old object, which
		// live on anyway, when it sends it.
		d := Entry{Event: e, ID: EventID(e), Key: object.OrderingKey(e.Resource, e.Object.GetNamespace(), e.Object.GetName()), Enqueued: now, Old: oldJSON, Revision: e.Revision, Since: e.Since}
		if filterErr != nil {
			d.FilterError = filterErr.Error()
		}
		if tx != nil {
			if body.head == nil {
				j.payload = appendPayloadHead(j.payload[:0], e)
				body = payloadOf(e, oldJSON)
				body.head = j.payload
			}
			j.seq++
			d.Seq = j.seq
			off, n := tx.entry(t.Name(), d.Seq, d, body)
			bt.added = append(bt.added, added{t.Name(), d.Seq, indexed{resource: e.Resource, revision: d.Revision, since: d.Since, n: n}, off})
		}
		bt.out = append(bt.out, queued{t, d})
	}
}

// stale reports whether e, a watch's event, is older than prev, the state recorded of its
// object: as a watch resumed from a revision before the object's last recorded change (see
// Resume) may send it. A watch sends an object's versions in order, and its deletion as the
// last version of the incarnation recorded, so such an event was recorded already (or passed
// over by a relist) and is never delivered after the newer state.
func stale(e dynamicinformer.Event, prev stored) bool {
	if object.Revision(e.Object.GetResourceVersion()) < object.Revision(prev.rv) {
		return true
	}
	return e.Type == dynamicinformer.Deleted && prev.uid != string(e.Object.GetUID()) // an earlier incarnation's
}

// listStarted begins comparing a resource's initial list with what is stored.
func (j *Journal) listStarted(tx *txn, gvr schema.GroupVersionResource, run uint64, streams []string) {
	if tx == nil {
		return
	}
	j.lists[gvr] = &listing{run: run, streams: streams, fresh: !tx.holds(object.ResourceName(gvr)), seen: map[string]struct{}{}}
}

// listSynced ends the comparison: every stored object the initial list did not have was deleted
// while nobody was looking, by the list's revision, and is delivered as DELETED with its
// stored state.
func (j *Journal) listSynced(tx *txn, targets []Target, gvr schema.GroupVersionResource, run, revision uint64, bt *batch) error {
	l := j.lists[gvr]
	if tx == nil || l == nil || l.run != run {
		return nil
	}
	bt.finished = append(bt.finished, gvr)
	res := object.ResourceName(gvr)
	if len(l.streams) == 1 {
		// The states now hold every change through the list's revision (with several streams,
		// revision is the latest of their lists', and each stream waits for an event of its own).
		if sel, ok := j.selections[res][l.streams[0]]; ok {
			tx.revision(res, l.streams[0], sel, revision)
		}
	}
	var gone []string
	tx.each(res, func(key string, _ stored) {
		if _, ok := l.seen[key]; !ok {
			gone = append(gone, key)
		}
	})
	slices.SortFunc(gone, object.CompareKeys)
	now := j.now()
	for _, key := range gone {
		st, _ := tx.get(res, key)
		tx.del(res, key)
		obj, err := j.store.object(st)
		if err != nil {
			// Gone, and what it was is unreadable: nothing to deliver but the count.
			j.corruptObject(gvr, key, err)
			continue
		}
		e := dynamicinformer.Event{Type: dynamicinformer.Deleted, Resource: gvr, Object: obj, Observed: now, Revision: revision, Since: object.After(object.Revision(obj.GetResourceVersion()))}
		j.fanOut(tx, targets, e, nil, nil, bt)
	}
	if l.fresh && len(l.seen) > 0 {
		j.m.fullReplays.Inc()
		j.log.Warn("no stored state for this resource: every object was delivered as ADDED", "resource", object.ResourceName(gvr), "objects", len(l.seen))
		return nil
	}
	j.log.Info("initial list compared with the stored state", "resource", object.ResourceName(gvr),
		"unchanged", l.count.unchanged, "modified", l.count.modified, "added", l.count.added, "deleted", l.count.deleted+len(gone))
	return nil
}
