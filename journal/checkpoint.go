package journal

import (
	"maps"
	"slices"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Checkpoints are, per sink and per resource, a revision through which every event is
// acknowledged: delivered or dead-lettered by the replica that published them, or superseded
// by a later state of its object that was. One resource's resourceVersions compare as
// integers, so the revision means the same on every replica.
type Checkpoints map[string]map[schema.GroupVersionResource]uint64

// Equal reports whether c and o hold the same checkpoints.
func (c Checkpoints) Equal(o Checkpoints) bool {
	return maps.EqualFunc(c, o, maps.Equal)
}

// progress is how far a resource's committed events reach: per stream, a revision through
// which every change has been recorded. It counts once the run's initial lists have synced.
type progress struct {
	run    uint64
	synced bool
	pos    map[string]uint64
}

// step is one change to the progress, put into effect when its transaction commits: a run
// started (streams set), a run synced, or a stream advanced by an event.
type step struct {
	gvr     schema.GroupVersionResource
	run     uint64
	streams []string
	synced  bool
	stream  string
	rev     uint64
}

// advance notes how far e moves its stream: an event seen on a watch, to its revision; an
// object of the initial list, to at least its revision, which the list's own revision is at or
// after. A relist's events are in no order and move nothing: what a relist finds is recorded
// by the time the next watch event is.
// Events of the same stream one after the other make one step, to the highest revision.
func (b *batch) advance(e object.Event) {
	if e.Revision == 0 || (!e.InOrder && !e.InitialList) {
		return
	}
	if n := len(b.progress); n > 0 {
		if last := &b.progress[n-1]; last.moves() && last.gvr == e.Resource && last.stream == e.Stream {
			last.rev = max(last.rev, e.Revision)
			return
		}
	}
	b.progress = append(b.progress, step{gvr: e.Resource, stream: e.Stream, rev: e.Revision})
}

// moves reports whether s moves a stream (see advance), rather than starting a list or ending
// one (see committed).
func (s *step) moves() bool { return s.streams == nil && !s.synced }

// committed puts into effect what a committed transaction changed in the outboxes and the
// progress.
func (j *Journal) committed(b *batch) {
	j.idx.Lock()
	defer j.idx.Unlock()
	for _, a := range b.added {
		if j.outbox[a.sink] == nil {
			j.outbox[a.sink] = map[uint64]indexed{}
		}
		j.outbox[a.sink][a.seq] = a.x
		j.order[a.sink] = append(j.order[a.sink], a.seq)
		j.noteHeld(entrySize(a.sink, a.x.whole))
	}
	for _, r := range b.removed {
		if x, ok := j.outbox[r.sink][r.seq]; ok {
			j.noteHeld(-entrySize(r.sink, x.whole))
		}
		delete(j.outbox[r.sink], r.seq)
	}
	for _, d := range b.deadlines {
		if x, ok := j.outbox[d.sink][d.seq]; ok {
			x.deadline = d.at
			j.outbox[d.sink][d.seq] = x
		}
	}
	for _, sink := range b.dropped {
		delete(j.outbox, sink)
		delete(j.order, sink)
		delete(j.outboxPeak, sink)
	}
	for sink, order := range j.order {
		entries := j.outbox[sink]
		if len(order) > 2*len(entries)+1024 {
			order = slices.DeleteFunc(order, func(seq uint64) bool { _, ok := entries[seq]; return !ok })
			if cap(order) > 4*len(order)+1024 {
				order = slices.Clone(order) // a backlog's array, delivered
			}
			j.order[sink] = order
		}
		// A map keeps the table of its largest size: once three quarters of a backlog (an
		// initial list's) is delivered, the rest moves to one of its size.
		if n := len(entries); n > j.outboxPeak[sink] {
			j.outboxPeak[sink] = n
		} else if peak := j.outboxPeak[sink]; peak >= 1024 && n <= peak/4 {
			smaller := make(map[uint64]indexed, n)
			maps.Copy(smaller, entries)
			j.outbox[sink] = smaller
			j.outboxPeak[sink] = n
		}
	}
	for _, s := range b.progress {
		p := j.progress[s.gvr]
		switch {
		case s.streams != nil:
			p = &progress{run: s.run, pos: map[string]uint64{}}
			for _, st := range s.streams {
				p.pos[st] = 0
			}
			j.progress[s.gvr] = p
		case p == nil:
		case s.synced:
			p.synced = p.synced || p.run == s.run
		default:
			if _, ok := p.pos[s.stream]; ok {
				p.pos[s.stream] = max(p.pos[s.stream], s.rev)
			}
		}
	}
}

// Checkpoints computes what this journal's outboxes acknowledge, per target and per resource
// whose initial lists have synced: the revision just below its oldest entry still in the
// outbox (the lowest its change may have happened at: see Entry.Since), and no further than
// every stream of the resource has been recorded, nor than any of its events the preselector
// still holds, nor than its Bound. They hold for a replica that delivers: what it has not
// delivered is in its outboxes. A target has none before the journal has seen it, nor for a
// resource it has still to be replayed (its initialState): the objects yet to replay are
// older than the events after them.
//
// The Bound keeps a checkpoint from acknowledging a change this replica has not made yet and
// another may have: a namespace that joined a selection, seen first by a follower, whose own
// events of it carry revisions the leader's checkpoints would otherwise pass.
func (j *Journal) Checkpoints() Checkpoints {
	targets := j.targets()
	bounds := j.bounds()
	j.idx.Lock()
	defer j.idx.Unlock()
	cp := Checkpoints{}
	for _, t := range targets {
		byResource := map[schema.GroupVersionResource]uint64{}
		cp[t.Name()] = byResource
		seen, ok := j.seen[t.Name()]
		if !ok || seen.target != t {
			continue
		}
		for gvr, p := range j.progress {
			if !p.synced || seen.replaying[gvr] {
				continue
			}
			reach, first := uint64(0), true
			for stream, pos := range p.pos {
				if low, ok := j.preselecting(gvr, stream); ok && low-1 < pos {
					pos = low - 1 // the preselector holds an earlier event of the stream
				}
				if first || pos < reach {
					reach, first = pos, false
				}
			}
			if b, ok := bounds[gvr]; ok {
				reach = min(reach, b)
			}
			if reach > 0 {
				byResource[gvr] = reach
			}
		}
		for _, x := range j.outbox[t.Name()] {
			if c, ok := byResource[x.resource]; ok && x.lowest() != 0 && x.lowest() <= c {
				byResource[x.resource] = x.lowest() - 1
			}
		}
	}
	return cp
}

// bounds reads the Bound of every resource whose progress the journal follows.
func (j *Journal) bounds() map[schema.GroupVersionResource]uint64 {
	if j.bound == nil {
		return nil
	}
	j.idx.Lock()
	gvrs := slices.Collect(maps.Keys(j.progress))
	j.idx.Unlock()
	out := map[schema.GroupVersionResource]uint64{}
	for _, gvr := range gvrs {
		if b, ok := j.bound(gvr); ok {
			out[gvr] = b
		}
	}
	return out
}

// preselecting is the lowest revision of a stream's events the preselector holds, if any.
func (j *Journal) preselecting(gvr schema.GroupVersionResource, stream string) (uint64, bool) {
	if j.pre == nil {
		return 0, false
	}
	return j.pre.pending(gvr, stream)
}

// Seen is how far this journal has seen a resource: the highest revision committed from any
// of its streams, and those streams (namespaces, "" for all of them), sorted; no streams when
// it does not watch the resource. A revision at or below it is one the cluster has reached.
func (j *Journal) Seen(gvr schema.GroupVersionResource) (uint64, []string) {
	j.idx.Lock()
	defer j.idx.Unlock()
	p := j.progress[gvr]
	if p == nil {
		return 0, nil
	}
	var rev uint64
	for _, pos := range p.pos {
		rev = max(rev, pos)
	}
	return rev, slices.Sorted(maps.Keys(p.pos))
}

// trim makes cp the floor below which nothing is recorded, replacing the last one (the floor
// follows the checkpoints as they are now, lower ones too), and removes the outbox entries it
// covers.
func (j *Journal) trim(tx *txn, cp Checkpoints, b *batch) {
	if j.floor.Equal(cp) {
		return
	}
	j.floor = cp
	for sink, entries := range j.outbox { // only this goroutine changes it
		floor := j.floor[sink]
		for seq, x := range entries {
			if x.revision != 0 && x.revision <= floor[x.resource] && tx.ack(sink, seq) {
				b.removed = append(b.removed, removed{sink, seq})
			}
		}
	}
}

// noteHeld counts n bytes more (or fewer) of outbox entries in the store's state.
func (j *Journal) noteHeld(n int64) {
	if j.store != nil {
		j.store.held.Add(n)
	}
}
