package history

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// blockSize is the size of a block's records, raw, past which the block is written. A read of
// one record decodes its block: 32 KiB takes about 25 µs; a list's records, in key order, serve
// about fifteen objects of a page a block. Against 16 KiB, 4% fewer bytes on disk; against 256
// KiB, a tenth of a random read's cost.
const blockSize = 32 << 10

// maxSegment bounds a segment: retention drops whole segments, so a segment is at most an
// eighth of what the history may keep, and at most this.
const maxSegment = 16 << 20

// segment is one of the log's segments (a file of package wal), as the index knows it.
type segment struct {
	id          uint64
	bytes       int64
	first, last uint64 // the lowest and highest revision of its records (0: none yet)
	firstChange uint64 // the lowest revision of a change a watch sent (not a list) it holds
	start, end  int64  // when its first and last change were observed (unix nanoseconds)
	blocks      []block
	// index is every change the segment holds: in the order written while it is the one
	// written to, sorted by key and revision once sealed.
	index []entry
	// chain finds a key's entries in the index while the segment is written to; nil once sealed.
	chain *chain
	// deletes are the index's deletes, in the index's order: what a read of the objects deleted
	// since a revision looks at, not every change.
	deletes []entry
	sealed  bool
}

// chain links the index entries of each key of a segment written to, newest first: heads[h] is
// the place in the index of the newest entry of hash h, links[i] that of the one before entry i
// of its key (-1: none). The writer adds to it under the Log's lock; a read takes a head, and
// the links then written, under it, and walks them after: a link once written never changes.
type chain struct {
	heads map[uint64]int32
	links []int32
}

// block is where a block lies, the highest revision it holds, and its epoch.
type block struct {
	pos   wal.Pos
	n     int
	last  uint64
	epoch uint32
}

// entry is a change in the index: its key's hash, its revision, its block (in its segment's
// blocks) and its place among the block's records.
type entry struct {
	key  uint64
	rev  uint64
	blk  uint32
	nth  uint16
	kind byte
}

// Log is one resource's history: its segments on disk and their index in memory.
//
// Each block belongs to an epoch: a run of changes with nothing left out between them. A gap
// that may hide changes (gapLost, a list's end) begins an epoch, and so does a start. A list's
// records belong to the epoch its end begins, for they are the objects as they were then. So
// the record of a key before another of the same epoch is the key's state before that one; a
// key's first record in an epoch (or a segment) carries the state before it.
type Log struct {
	gvr   schema.GroupVersionResource
	log   *slog.Logger
	codec *codec
	seed  maphash.Seed
	wal   *wal.Log

	mu sync.RWMutex // what readers see: segs, floor, through, policy
	// segs are the segments in order; the last is written to unless sealed.
	segs []*segment
	// floor is the revision from which the log holds every change: a read at or after it is
	// exact. It moves up with each gap, and as segments are dropped.
	floor uint64
	// through is the highest revision of a change a watch sent that the log holds.
	through uint64
	policy  config.History
	// lost counts the changes left out: not written, or dropped while the queue was full.
	lost atomic.Uint64

	// Owned by the writer.
	raw     []byte            // the records of the block being filled
	noted   []noted           // what the index will keep of them
	changes int               // how many of them are changes (not gaps)
	seen    map[uint64]latest // the keys the segment written to holds, with those of raw
	lastRev uint64            // the highest revision in raw
	heard   uint64            // through, counting the records of raw too
	// epoch is the epoch written to; listing is set while a list's records are written, in
	// the epoch after it, which its end begins; blockEpoch is the epoch of raw's changes.
	epoch      uint32
	listing    bool
	blockEpoch uint32
	// broken is set when a block could not be written: the segment written to no longer holds
	// every change of its keys, so a new one must be begun before anything more is written.
	broken bool
	// unsynced are the blocks written since the last sync, which the wal holds until it syncs
	// (see wal.Log.Write); spare, blocks synced since, whose buffers the next blocks take: a
	// block a buffer of its own was a megabyte every thousand changes for the collector.
	unsynced, spare [][]byte
}

// maxSpareBlocks bounds the buffers of blocks kept for the next ones: a second of changes at a
// few thousand a second. A buffer past maxPooled (a block of a large object) is not kept.
const maxSpareBlocks = 64

// syncEvery is how often the writer syncs the blocks the logs wrote. A sync a batch (linger)
// cost the writer a fifth of its CPU: a crash of the machine (not of the process, whose writes
// the kernel holds) loses at most the last second's, and the next start says so (a gap at its
// list's revision, as for any change the history did not hear).
const syncEvery = time.Second

// latest is a key's newest record in the segment written to, and its epoch.
type latest struct {
	rev   uint64
	kind  byte
	epoch uint32
}

// noEpoch is the epoch of a block of format 1: no other is of it.
const noEpoch = 0

// open opens gvr's history in dir, reading its index back from its segments.
func open(dir string, gvr schema.GroupVersionResource, policy config.History, c *codec, log *slog.Logger) (*Log, error) {
	l := &Log{gvr: gvr, log: log, codec: c, seed: maphash.MakeSeed(), policy: policy, seen: map[uint64]latest{}}
	w, rec, err := wal.Open(dir, wal.Options{SegmentSize: math.MaxInt64}, l.replay)
	if err != nil {
		return nil, fmt.Errorf("open the history of %s in %s: %w", object.ResourceName(gvr), dir, err)
	}
	l.wal = w
	if rec.Damaged != "" {
		log.Warn("history: damage in the log set aside; what followed it is gone from the history", "resource", object.ResourceName(gvr), "damaged", rec.Damaged, "err", rec.DamageErr)
	}
	for _, s := range l.segs {
		l.seal(s)
	}
	l.epoch++ // what a start writes may follow changes it missed
	l.heard = l.through
	if len(l.segs) > 0 && l.segs[0].firstChange > 0 {
		// What came before the oldest segment may have been dropped (retention writes the floor
		// it leaves as a gap first; this holds should that gap have been lost). A list's
		// objects it holds are older, and tell nothing of what changed before it.
		l.floor = max(l.floor, l.segs[0].firstChange-1)
	}
	if _, err := w.Rotate(); err != nil { // what is read back is sealed: a new segment for what follows
		return nil, errors.Join(err, w.Close())
	}
	return l, nil
}

// replay indexes one block read back at open.
func (l *Log) replay(p wal.Pos, payload []byte) error {
	raw, epoch, err := l.codec.records(payload, nil)
	if err != nil {
		return err
	}
	l.epoch = max(l.epoch, epoch)
	s := l.segmentFor(p.File)
	b := block{pos: p, n: len(payload), epoch: epoch}
	r := reader{buf: raw}
	var rec record
	for nth := 0; r.next(&rec); nth++ {
		l.note(s, notedOf(l, &rec, nth), uint32(len(s.blocks)))
		b.last = max(b.last, rec.rev)
	}
	if r.err != nil {
		return r.err
	}
	s.blocks = append(s.blocks, b)
	s.bytes += int64(len(payload))
	return nil
}

// segmentFor is segment id, the last, begun if need be.
func (l *Log) segmentFor(id uint64) *segment {
	if n := len(l.segs); n > 0 && l.segs[n-1].id == id {
		return l.segs[n-1]
	}
	s := &segment{id: id}
	l.segs = append(l.segs, s)
	return s
}

// noted is what the index and a segment's bounds keep of a record: the nth of its block.
type noted struct {
	key    uint64
	rev    uint64
	time   int64
	kind   byte
	listed bool
	nth    uint16
}

func notedOf(l *Log, rec *record, nth int) noted {
	n := noted{rev: rec.rev, time: rec.time, kind: rec.kind, listed: rec.flags&flagListed != 0, nth: uint16(nth)}
	if rec.kind != kindGap {
		n.key = l.hash(rec.key)
	}
	return n
}

// note puts rec, a record of block blk of s, in s's index and bounds.
func (l *Log) note(s *segment, rec noted, blk uint32) {
	if rec.kind == kindGap {
		l.floor = max(l.floor, rec.rev)
		return
	}
	s.index = append(s.index, entry{key: rec.key, rev: rec.rev, blk: blk, nth: rec.nth, kind: rec.kind})
	if rec.kind == kindDeleted {
		s.deletes = append(s.deletes, s.index[len(s.index)-1])
	}
	if s.chain == nil {
		s.chain = &chain{heads: map[uint64]int32{}}
	}
	prev, ok := s.chain.heads[rec.key]
	if !ok {
		prev = -1
	}
	s.chain.links = append(s.chain.links, prev)
	s.chain.heads[rec.key] = int32(len(s.index) - 1)
	if s.first == 0 || rec.rev < s.first {
		s.first = rec.rev
	}
	s.last = max(s.last, rec.rev)
	if s.start == 0 {
		s.start = rec.time
	}
	s.end = max(s.end, rec.time)
	if !rec.listed {
		l.through = max(l.through, rec.rev)
		if s.firstChange == 0 || rec.rev < s.firstChange {
			s.firstChange = rec.rev
		}
	}
}

func (l *Log) hash(key string) uint64 { return maphash.String(l.seed, key) }

// hashOf is the hash of the key of namespace and name (object.Key), without the key built.
func (l *Log) hashOf(namespace, name string) uint64 {
	if namespace == "" {
		return l.hash(name)
	}
	var h maphash.Hash // the hash of what was written, one string or several
	h.SetSeed(l.seed)
	h.WriteString(namespace)
	h.WriteByte('/')
	h.WriteString(name)
	return h.Sum64()
}

// seal sorts s's index by key and revision: it is written to no more.
func (l *Log) seal(s *segment) {
	index := slices.Clone(s.index)
	slices.SortStableFunc(index, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.rev, b.rev))
	})
	var deletes []entry
	for _, e := range index {
		if e.kind == kindDeleted {
			deletes = append(deletes, e)
		}
	}
	s.index, s.deletes, s.chain, s.sealed = index, deletes, nil, true
}

// searchKey is the place of the first entry of index, sorted by key, whose key is h or more. The
// keys are hashes, uniform: a guess from where h lies between the ends takes a few probes
// where halving takes a probe a doubling of the index.
func searchKey(index []entry, h uint64) int {
	lo, hi := 0, len(index) // the answer is in [lo, hi]: keys before lo are less, from hi on not
	for range 4 {
		if hi-lo <= 16 {
			break
		}
		a, b := index[lo].key, index[hi-1].key
		if h <= a {
			return lo
		}
		if h > b {
			return hi
		}
		m := lo + int(float64(h-a)/float64(b-a)*float64(hi-1-lo))
		m = min(max(m, lo), hi-1)
		if index[m].key < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo + sort.Search(hi-lo, func(i int) bool { return index[lo+i].key >= h })
}

// add puts a record in the block being filled, writing the block first when it is full or of
// another epoch. prev is the object before the change, kept only when the segment holds no
// earlier record of the key of the same epoch.
func (l *Log) add(rec record, prev []byte, now time.Time) {
	var epoch uint32
	if rec.kind == kindGap {
		l.gap(rec.cause)
	} else {
		epoch = l.epochOf(&rec)
	}
	if len(l.raw) >= blockSize || l.changes > 0 && rec.kind != kindGap && epoch != l.blockEpoch {
		l.write() // a block is of one epoch
	}
	if len(l.raw) == 0 {
		// A block lies in one segment: the segment is chosen before its first record, which
		// is encoded knowing whether the segment holds its key.
		broken := l.broken
		l.maybeRotate(now)
		if l.broken {
			l.mu.Lock()
			l.floor = max(l.floor, rec.rev)
			l.mu.Unlock()
			l.lost.Add(1)
			l.lose()
			return
		}
		if broken {
			// The first block after changes left out (the disk was full) begins with their
			// floor, as a gap: a start reads it back, and does not answer for them.
			l.mu.RLock()
			floor := l.floor
			l.mu.RUnlock()
			l.add(record{kind: kindGap, rev: floor, cause: gapLost}, nil, now)
		}
	}
	n := notedOf(l, &rec, len(l.noted))
	if rec.kind != kindGap {
		l.blockEpoch = epoch
		l.changes++
		if s, ok := l.seen[n.key]; !ok || s.epoch != epoch {
			rec.prev = prev
		}
		l.seen[n.key] = latest{rev: rec.rev, kind: rec.kind, epoch: epoch}
		if !n.listed {
			l.heard = max(l.heard, rec.rev)
		}
	}
	l.noted = append(l.noted, n)
	l.lastRev = max(l.lastRev, rec.rev)
	l.raw = appendRecord(l.raw, &rec)
}

// epochOf is the epoch of rec, a change: a list's records are of the epoch its end begins;
// a change a watch sent ends the list before it.
func (l *Log) epochOf(rec *record) uint32 {
	if rec.flags&flagListed != 0 {
		l.listing = true
		return l.epoch + 1
	}
	if l.listing {
		l.listing, l.epoch = false, l.epoch+1
	}
	return l.epoch
}

// gap moves the epochs for a gap of cause: a list's end ends it; changes left out begin an
// epoch (after the list they interrupt, if any); a relist's changes are one list, and what
// retention leaves is whole.
func (l *Log) gap(cause byte) {
	switch cause {
	case gapListEnd:
		l.listing, l.epoch = false, l.epoch+1
	case gapLost:
		if l.listing {
			l.listing, l.epoch = false, l.epoch+1
		}
		l.epoch++
	}
}

// lose begins an epoch after changes left out that may belong to any epoch begun so far.
func (l *Log) lose() {
	l.listing, l.epoch = false, max(l.epoch, l.blockEpoch)+1
}

// endList ends a list taken at revision rev: a gap, when the history does not reach rev.
func (l *Log) endList(rev uint64, now time.Time) {
	if rev > l.heard {
		l.add(record{kind: kindGap, rev: rev, cause: gapListEnd}, nil, now)
	} else if l.listing {
		l.gap(gapListEnd)
	}
}

// flush writes the block being filled, if any, and syncs what was written.
func (l *Log) flush() {
	l.write()
	l.sync()
}

// sync syncs what was written, if anything.
func (l *Log) sync() {
	if !l.wal.Unsynced() {
		return
	}
	if err := l.wal.Sync(); err == nil {
		for _, b := range l.unsynced {
			if len(l.spare) < maxSpareBlocks && cap(b) <= maxPooled {
				l.spare = append(l.spare, b)
			}
		}
		clear(l.unsynced)
		l.unsynced = l.unsynced[:0]
	} else {
		// The blocks are written, and read; the log writes them again before anything else.
		l.log.Warn("history: could not sync; written again with the next blocks", "resource", object.ResourceName(l.gvr), "err", err)
	}
}

// write writes the block being filled, if any, without syncing it (flush syncs). A block that
// cannot be written is lost, and the log says so: a gap at its highest revision.
func (l *Log) write() {
	if len(l.raw) == 0 {
		return
	}
	var buf []byte
	if n := len(l.spare); n > 0 {
		buf, l.spare = l.spare[n-1], l.spare[:n-1]
	}
	payload := l.codec.block(buf, l.raw, l.blockEpoch)
	p, err := l.wal.Write(payload)
	if err != nil {
		l.spare = append(l.spare, payload) // a failed write keeps nothing of it
		l.log.Warn("history: could not write; the changes are left out of the history, which reaches back only to after them", "resource", object.ResourceName(l.gvr), "revision", l.lastRev, "err", err)
		l.mu.Lock()
		l.floor = max(l.floor, l.lastRev)
		l.mu.Unlock()
		l.lost.Add(uint64(len(l.noted)))
		l.broken = true
		l.lose()
		l.reset()
		return
	}
	l.unsynced = append(l.unsynced, payload)
	l.mu.Lock()
	s := l.segmentFor(p.File)
	blk := uint32(len(s.blocks))
	for _, n := range l.noted {
		l.note(s, n, blk)
	}
	s.blocks = append(s.blocks, block{pos: p, n: len(payload), last: l.lastRev, epoch: l.blockEpoch})
	s.bytes += int64(len(payload))
	l.mu.Unlock()
	l.reset()
}

func (l *Log) reset() {
	l.raw, l.noted, l.changes, l.lastRev = l.raw[:0], l.noted[:0], 0, 0
}

// maybeRotate begins a new segment when the one written to holds an eighth of what the history
// may keep (or maxSegment), or reaches back an eighth of the retention: so that retention,
// dropping whole segments, keeps within about an eighth more than it is asked.
func (l *Log) maybeRotate(now time.Time) {
	l.mu.RLock()
	policy := l.policy
	var cur *segment
	if n := len(l.segs); n > 0 && !l.segs[n-1].sealed {
		cur = l.segs[n-1]
	}
	l.mu.RUnlock()
	if !l.broken && (cur == nil || cur.bytes < min(policy.MaxBytes/8, maxSegment) && now.Sub(time.Unix(0, cur.start)) < policy.Retain/8) {
		return
	}
	if _, err := l.wal.Rotate(); err != nil {
		l.log.Warn("history: could not begin a segment", "resource", object.ResourceName(l.gvr), "err", err)
		return
	}
	if cur != nil {
		l.mu.Lock()
		l.seal(cur)
		l.mu.Unlock()
	}
	l.broken = false
	l.seen = map[uint64]latest{}
}

// newest is the newest record of key: its revision and kind; false when the log holds none.
// The writer's: it reads the segment written to from seen, the sealed ones from their index.
func (l *Log) newest(key string) (latest, bool) {
	h := l.hash(key)
	if n, ok := l.seen[h]; ok {
		return n, true
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for i := len(l.segs) - 1; i >= 0; i-- {
		s := l.segs[i]
		if !s.sealed {
			continue // its keys are all in seen
		}
		hi := searchKey(s.index, h)
		for hi < len(s.index) && s.index[hi].key == h {
			hi++
		}
		if hi > 0 && s.index[hi-1].key == h {
			e := s.index[hi-1]
			return latest{rev: e.rev, kind: e.kind}, true
		}
	}
	return latest{}, false
}

// retain drops the oldest segments while the newest change they hold is older than the
// retention, or while the history takes more than its maxBytes; never the segment written to.
func (l *Log) retain(now time.Time) {
	l.mu.Lock()
	var total int64
	for _, s := range l.segs {
		total += s.bytes
	}
	n, floor := 0, l.floor
	for ; n < len(l.segs); n++ {
		s := l.segs[n]
		expired := now.Sub(time.Unix(0, s.end)) > l.policy.Retain
		if !s.sealed || !expired && total <= l.policy.MaxBytes {
			break
		}
		total -= s.bytes
		floor = max(floor, s.last)
	}
	l.mu.Unlock()
	if n == 0 {
		return
	}
	// The floor the drop leaves is written first, as a gap: a start after it reads it back.
	l.add(record{kind: kindGap, rev: floor, cause: gapRetention}, nil, now)
	l.flush()
	l.mu.Lock()
	l.floor = max(l.floor, floor)
	next := l.segs[n-1].id + 1
	if n < len(l.segs) {
		next = l.segs[n].id
	}
	l.segs = slices.Delete(l.segs, 0, n)
	l.mu.Unlock()
	if err := l.wal.Drop(next)(); err != nil {
		l.log.Warn("history: could not remove the segments retention dropped", "resource", object.ResourceName(l.gvr), "err", err)
	}
}

// Stats are what a history holds.
type Stats struct {
	Resource string `json:"resource"`
	// Bytes is the disk its segments take.
	Bytes int64 `json:"bytes"`
	// Versions is how many changes it holds.
	Versions int `json:"versions"`
	// Oldest is when the oldest change it holds was observed.
	Oldest time.Time `json:"oldest,omitzero"`
	// Floor is the resourceVersion from which it holds every change: a list at a
	// resourceVersion, or a watch from one, at or after it is answered from the history.
	Floor uint64 `json:"floor,string"`
	// Lost counts the changes left out since the start: not written (the disk was full) or
	// dropped while the queue was full. Each moved Floor past it.
	Lost uint64 `json:"lost"`
}

// Stats is what the history holds now.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	defer l.mu.RUnlock()
	st := Stats{Resource: object.ResourceName(l.gvr), Floor: l.floor, Lost: l.lost.Load()}
	for _, s := range l.segs {
		st.Bytes += s.bytes
		st.Versions += len(s.index)
		if st.Oldest.IsZero() && s.start != 0 {
			st.Oldest = time.Unix(0, s.start).UTC()
		}
	}
	return st
}

// close writes what is buffered, and closes the log.
func (l *Log) close() error {
	l.flush()
	l.codec.cache.forget(l)
	return l.wal.Close()
}
