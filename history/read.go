package history

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"iter"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/dynwatch/dynwatch/object"
)

// ErrMovedOn is a read that found a segment gone: retention dropped it meanwhile. The reader
// asks again, or answers as for a revision before the history (410 Expired).
var ErrMovedOn = errors.New("the history moved on while it was read")

// Version is one retained version of an object.
type Version struct {
	Type     object.EventType
	Revision uint64
	// Time is when dynwatch observed the change.
	Time time.Time
	// Listed is set for a version a list found rather than a watch: it may stand for several
	// changes made while dynwatch was not watching, and its Time is the list's.
	Listed bool
	// Managers is the JSON array of the field managers behind the change (see
	// object.ChangedManagers); nil when not known.
	Managers []byte
	// Object is the object after the change; for a delete, as the apiserver last sent it, at
	// the delete's resourceVersion.
	Object *object.Object
}

// view is what one read sees of a log: its segments as they were when the read began, and the
// last blocks it read. A view of a few objects' versions (cached) shares the blocks it decodes
// with other reads, through the codec's cache; one that reads its way through the log (a watch
// replayed) decodes into buffers of its own, pooled: release gives them back when it is done.
type view struct {
	l      *Log
	segs   []segment
	cached bool
	blocks map[blockID]*decoded // the blocks read last, up to viewBlocks
	order  []blockID
	// payload is the last block as read from disk, before it is decoded.
	payload *[]byte
}

// decoded is a block's records, raw, and where each begins.
type decoded struct {
	raw  *[]byte
	offs []uint32
	// pooled is set for a buffer of a view's own, from buffers.
	pooled bool
}

// blockID names a block of a view: its segment's place, and its place in the segment.
type blockID struct {
	seg int
	blk uint32
}

// viewBlocks is how many decoded blocks a read keeps: the blocks of a page's objects, and of the
// versions before them, are often the same.
const viewBlocks = 16

// buffers are the pool of a view's buffers: blocks, raw and as read. A buffer that grew past
// maxPooled (a block of one large object) is left to the collector.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, blockSize+blockSize/4); return &b }}

const maxPooled = 4 * blockSize

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooled {
		*b = (*b)[:0]
		buffers.Put(b)
	}
}

// view begins a read; a cached one shares the blocks it decodes.
func (l *Log) view(cached bool) *view {
	l.mu.RLock()
	defer l.mu.RUnlock()
	v := &view{l: l, segs: make([]segment, len(l.segs)), cached: cached, blocks: make(map[blockID]*decoded, viewBlocks)}
	for i, s := range l.segs {
		v.segs[i] = *s
	}
	return v
}

// release gives the view's buffers back: what was read from them must not be used after.
func (v *view) release() {
	for _, d := range v.blocks {
		if d.pooled {
			putBuffer(d.raw)
		}
	}
	if v.payload != nil {
		putBuffer(v.payload)
	}
	v.blocks, v.order, v.payload = nil, nil, nil
}

// Floor is the revision from which the log holds every change, and Through the highest one of
// a change a watch sent that it holds: a list at a revision between them, or a watch from one,
// is answered exactly.
func (l *Log) Floor() (floor, through uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.floor, l.through
}

// block is block blk of segment si, decoded.
func (v *view) block(si int, blk uint32) (*decoded, error) {
	id := blockID{si, blk}
	if d, ok := v.blocks[id]; ok {
		return d, nil
	}
	// The block read longest ago makes way, and a buffer of the view's own takes this one's:
	// what is read from a block is copied out (objectOf, Past.object) before viewBlocks more
	// are read.
	var spare *decoded
	if len(v.order) == viewBlocks {
		spare = v.blocks[v.order[0]]
		delete(v.blocks, v.order[0])
		v.order = v.order[1:]
	}
	key := cacheKey{log: v.l, seg: v.segs[si].id, blk: blk}
	if v.cached {
		if d, ok := v.l.codec.cache.get(key); ok {
			v.blocks[id], v.order = d, append(v.order, id)
			return d, nil
		}
	}
	b := v.segs[si].blocks[blk]
	if v.payload == nil {
		v.payload = buffers.Get().(*[]byte)
	}
	*v.payload = slices.Grow((*v.payload)[:0], b.n)[:b.n]
	if err := v.l.wal.ReadAt(b.pos, *v.payload); err != nil {
		return nil, errors.Join(ErrMovedOn, err)
	}
	d := spare
	switch {
	case v.cached:
		d = &decoded{raw: new([]byte)} // the cache's: a read may hold it after it is evicted
	case d == nil:
		d = &decoded{raw: buffers.Get().(*[]byte), pooled: true}
	}
	raw, _, err := v.l.codec.records(*v.payload, (*d.raw)[:0])
	*d.raw, d.offs = raw, d.offs[:0]
	if err == nil {
		// Where each record begins, found once.
		r := reader{buf: raw}
		for len(r.buf) > 0 && r.err == nil {
			d.offs = append(d.offs, uint32(len(raw)-len(r.buf)))
			r.skip()
		}
		err = r.err
	}
	if err != nil {
		if d.pooled {
			putBuffer(d.raw)
		}
		return nil, err
	}
	if v.cached {
		v.l.codec.cache.add(key, d)
	}
	v.blocks[id], v.order = d, append(v.order, id)
	return d, nil
}

// record is the nth record of block blk of segment si.
func (v *view) record(si int, blk uint32, nth uint16) (record, error) {
	d, err := v.block(si, blk)
	if err != nil {
		return record{}, err
	}
	if int(nth) >= len(d.offs) {
		return record{}, errors.New("an index entry past its block's records")
	}
	r := reader{buf: (*d.raw)[d.offs[nth]:], inPlace: v.cached} // a cached block is never written again
	var rec record
	if r.next(&rec) {
		return rec, nil
	}
	return record{}, cmp.Or(r.err, errShort)
}

// entries are the index entries of key's hash in segment si, oldest first: in the order written
// in the segment written to (from its chain), by revision in a sealed one.
func (v *view) entries(si int, h uint64) []entry {
	s := &v.segs[si]
	if !s.sealed {
		out := slices.Collect(v.chained(si, h))
		slices.Reverse(out)
		return out
	}
	lo := searchKey(s.index, h)
	hi := lo
	for hi < len(s.index) && s.index[hi].key == h {
		hi++
	}
	return s.index[lo:hi]
}

// chained are the index entries of key's hash in segment si, written to, newest first.
func (v *view) chained(si int, h uint64) iter.Seq[entry] {
	return func(yield func(entry) bool) {
		s := &v.segs[si]
		if s.chain == nil {
			return
		}
		v.l.mu.RLock()
		i, ok := s.chain.heads[h]
		links := s.chain.links
		v.l.mu.RUnlock()
		if !ok {
			return
		}
		for ; i >= 0; i = links[i] {
			if int(i) < len(s.index) && !yield(s.index[i]) { // else written after the view began
				return
			}
		}
	}
}

// Revisions calls fn with every retained version of the object at key (namespace/name),
// newest first, until fn returns false.
func (l *Log) Revisions(ctx context.Context, key string, fn func(Version) bool) error {
	v, h := l.view(true), l.hash(key)
	defer v.release()
	var last uint64 // a version recorded twice (a watch resumed from before the history's end) is one
	for si := len(v.segs) - 1; si >= 0; si-- {
		es := v.entries(si, h)
		es = slices.Clone(es)
		// Newest first: by revision, and among equal ones the later record.
		slices.Reverse(es)
		slices.SortStableFunc(es, func(a, b entry) int { return cmp.Compare(b.rev, a.rev) })
		for _, e := range es {
			if err := ctx.Err(); err != nil {
				return err
			}
			rec, err := v.record(si, e.blk, e.nth)
			if err != nil {
				return err
			}
			if rec.key != key || rec.rev == last {
				continue
			}
			last = rec.rev
			if !fn(versionOf(&rec)) {
				return nil
			}
		}
	}
	return nil
}

// versionOf is rec as a Version, copied out of the block rec was read from.
func versionOf(rec *record) Version {
	return Version{Type: typeOf(rec.kind), Revision: rec.rev, Time: time.Unix(0, rec.time), Listed: rec.flags&flagListed != 0,
		Managers: bytes.Clone(rec.managers), Object: objectOf(rec.obj)}
}

// objectOf is an object of the JSON b, copied out of the block it lies in: an object that kept
// its block would keep 32 KiB for a few hundred bytes.
func objectOf(b []byte) *object.Object { return object.OfJSON(bytes.Clone(b), nil, nil) }

// Change is one change the log holds, with the object before it.
type Change struct {
	Version
	// Before is the object before the change; nil for an object the change adds, or when
	// not asked for.
	Before *object.Object
}

// Changes calls fn, in the order they happened, with every change after revision rev that a
// watch sent (not those a list found), until fn returns false; with before, each carries
// the object before it. In order, and exact, for a resource watched in one stream.
func (l *Log) Changes(ctx context.Context, rev uint64, before bool, fn func(Change) bool) error {
	v := l.view(false)
	defer v.release()
	var p *Past
	if before {
		var err error
		if p, err = v.past(ctx, rev, math.MaxUint64); err != nil {
			return err
		}
	}
	last := rev // a change recorded twice (a watch resumed from before the history's end) is sent once
	// Where each key's last change sent lies: the object before its next one. Its first one's
	// is p's to read, from the index.
	sent := map[string]blockRecord{}
	return v.scan(ctx, rev, func(at blockRecord, rec *record) (bool, error) {
		if rec.flags&flagListed != 0 || rec.rev <= last {
			return true, nil
		}
		last = rec.rev
		c := Change{Version: versionOf(rec)}
		if before && rec.kind != kindAdded {
			var err error
			if c.Before, err = v.objectBefore(p, sent, rec.key); err != nil {
				return false, err
			}
		}
		if before {
			sent[rec.key] = at
		}
		return fn(c), nil
	})
}

// blockRecord is where a record lies in a view: its segment, its block and its place there.
type blockRecord struct {
	si  int
	blk uint32
	nth uint16
}

// objectBefore is the object at key before its next change in a scan: the one its last change
// sent left, else, for its first, what p says it was at the scan's revision.
func (v *view) objectBefore(p *Past, sent map[string]blockRecord, key string) (*object.Object, error) {
	at, ok := sent[key]
	if !ok {
		o, _, err := p.At(object.SplitKey(key))
		return o, err
	}
	prev, err := v.record(at.si, at.blk, at.nth)
	if err != nil || prev.kind == kindDeleted {
		return nil, err
	}
	return objectOf(prev.obj), nil
}

// scan calls fn with each change after revision rev, in the order written, until it returns
// false or an error.
func (v *view) scan(ctx context.Context, rev uint64, fn func(at blockRecord, rec *record) (bool, error)) error {
	for si := range v.segs {
		s := &v.segs[si]
		if s.last <= rev {
			continue
		}
		for blk, b := range s.blocks {
			if b.last <= rev {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			d, err := v.block(si, uint32(blk))
			if err != nil {
				return err
			}
			// Copied: fn reads other blocks, and a block read long enough ago lends its memory
			// to another.
			r := reader{buf: bytes.Clone(*d.raw)}
			var rec record
			for nth := 0; r.next(&rec); nth++ {
				if rec.kind == kindGap || rec.rev <= rev {
					continue
				}
				if ok, err := fn(blockRecord{si, uint32(blk), uint16(nth)}, &rec); err != nil || !ok {
					return err
				}
			}
			if r.err != nil {
				return r.err
			}
		}
	}
	return nil
}

// Deleted calls fn with the last version of every object whose last retained change is its
// delete, until fn returns false; in no order.
func (l *Log) Deleted(ctx context.Context, fn func(Version) bool) error {
	v := l.view(false)
	defer v.release()
	decided := map[uint64]bool{}
	for si := len(v.segs) - 1; si >= 0; si-- {
		for _, e := range v.latest(si) {
			if decided[e.key] {
				continue
			}
			decided[e.key] = true
			if e.kind != kindDeleted {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rec, err := v.record(si, e.blk, e.nth)
			if err != nil {
				return err
			}
			if !fn(versionOf(&rec)) {
				return nil
			}
		}
	}
	return nil
}

// latest is the newest index entry of each key's hash in segment si.
func (v *view) latest(si int) []entry {
	s := &v.segs[si]
	var out []entry
	if s.sealed {
		for i, e := range s.index {
			if i+1 == len(s.index) || s.index[i+1].key != e.key {
				out = append(out, e)
			}
		}
		return out
	}
	last := map[uint64]int{}
	for i, e := range s.index {
		last[e.key] = i
	}
	for _, i := range last {
		out = append(out, s.index[i])
	}
	return out
}

// Past is the history read at a past revision: which objects changed after it, known from the
// index alone, and, one at a time, what each was then, read from disk only when asked. A key is
// looked up when asked about, segment after segment from the revision on, until one holds a
// change of it: in a sealed segment by its sorted index, in the one written to by its chain.
//
// The objects a Past of Log.Past hands out (At, Gone) lie in the blocks it read, and in a slab
// of its own that Close gives back for other reads: they must not be used after Close.
type Past struct {
	v         *view
	rev, upTo uint64
	memo      map[uint64]ref // the keys asked about
	slab      *object.Slab   // a cached view's objects
}

// ref is what the index says of a key after the revision: whether it changed (ok), its first
// change after it (entry e of segment si), and the key's entry before that in the segment, if
// any.
type ref struct {
	si      int
	e       entry
	prev    entry
	hasPrev bool
	ok      bool
}

// Past reads the log at revision rev as it stood at revision upTo: the changes after upTo are
// left out, so that it agrees with a cache at upTo. Exact only at or after the floor (see Floor).
// Close it when done with it and its objects.
func (l *Log) Past(ctx context.Context, rev, upTo uint64) (*Past, error) {
	p, err := l.view(true).past(ctx, rev, upTo)
	if err != nil {
		return nil, err
	}
	p.slab = slabs.Get().(*object.Slab)
	return p, nil
}

// slabs are the pool of Pasts' slabs: a page holds hundreds of objects.
var slabs = sync.Pool{New: func() any { return new(object.Slab) }}

func (v *view) past(ctx context.Context, rev, upTo uint64) (*Past, error) {
	if err := ctx.Err(); err != nil {
		v.release()
		return nil, err
	}
	memo, _ := memos.Get().(map[uint64]ref)
	if memo == nil {
		memo = make(map[uint64]ref, 1024)
	}
	return &Past{v: v, rev: rev, upTo: upTo, memo: memo}, nil
}

// memos are the pool of a Past's memo maps: a page looks up hundreds of keys.
var memos sync.Pool

// Close gives back p's buffers, and those of the objects it handed out.
func (p *Past) Close() {
	p.v.release()
	if p.slab != nil {
		p.slab.Reset()
		slabs.Put(p.slab)
		p.slab = nil
	}
	if p.memo != nil && len(p.memo) <= 1<<14 { // a map of a read that looked up many more keys is left to go
		clear(p.memo)
		memos.Put(p.memo)
	}
	p.memo = nil
}

// object is an object of the JSON b, read from a block of p's view. A cached view's blocks are
// the cache's, never written again (see view.block): the object lies in its block, not copied
// (a page of objects reads a few dozen blocks, which the cache holds anyway), and in p's slab.
// Else b lies in a buffer of the view's own, given back on release: the object is a copy.
func (p *Past) object(b []byte) *object.Object {
	if p.slab != nil && p.v.cached {
		return p.slab.OfJSON(b[:len(b):len(b)])
	}
	return objectOf(b)
}

// reaches reports whether s may hold a change after the revision, up to the bound.
func (p *Past) reaches(s *segment) bool { return s.last > p.rev && s.first <= p.upTo }

// lookup is what the index says of the key of hash h after the revision.
func (p *Past) lookup(h uint64) ref {
	if r, ok := p.memo[h]; ok {
		return r
	}
	var r ref
	for si := range p.v.segs {
		if p.reaches(&p.v.segs[si]) {
			if r = p.first(si, h); r.ok {
				break
			}
		}
	}
	p.memo[h] = r
	return r
}

// first is the first change after the revision, up to the bound, of the key of hash h in
// segment si, with the key's entry before it there.
func (p *Past) first(si int, h uint64) ref {
	if !p.v.segs[si].sealed {
		// Newest first, from the chain: the last change after the revision met is the first,
		// and the entry met next at or before the revision, the one before it.
		var r ref
		for e := range p.v.chained(si, h) {
			switch {
			case e.rev > p.rev && e.rev <= p.upTo:
				r = ref{si: si, e: e, ok: true}
			case e.rev <= p.rev && r.ok && !r.hasPrev:
				r.prev, r.hasPrev = e, true
			}
		}
		return r
	}
	var before entry
	var hasBefore bool
	for _, e := range p.v.entries(si, h) {
		switch {
		case e.rev <= p.rev:
			before, hasBefore = e, true
		case e.rev <= p.upTo:
			return ref{si: si, e: e, prev: before, hasPrev: hasBefore, ok: true}
		}
	}
	return ref{}
}

// last is the last change after the revision, up to the bound, of the key of hash h.
func (p *Past) last(h uint64) (entry, bool) {
	for si := len(p.v.segs) - 1; si >= 0; si-- {
		if !p.reaches(&p.v.segs[si]) {
			continue
		}
		if !p.v.segs[si].sealed {
			for e := range p.v.chained(si, h) { // newest first
				if e.rev > p.rev && e.rev <= p.upTo {
					return e, true
				}
			}
			continue
		}
		var last entry
		var ok bool
		for _, e := range p.v.entries(si, h) {
			if e.rev > p.rev && e.rev <= p.upTo {
				last, ok = e, true
			}
		}
		if ok {
			return last, true
		}
	}
	return entry{}, false
}

// Changed reports whether the object namespace/name changed after the revision: if not, it was
// then as it is now.
func (p *Past) Changed(namespace, name string) bool {
	return p.lookup(p.v.l.hashOf(namespace, name)).ok
}

// At is the object namespace/name as it was at the revision, nil when it did not exist then,
// for an object that changed after it; false when it did not change (Changed was of a key of
// the same hash): it was then as it is now.
func (p *Past) At(namespace, name string) (*object.Object, bool, error) {
	r := p.lookup(p.v.l.hashOf(namespace, name))
	if !r.ok {
		return nil, false, nil
	}
	o, k, err := p.before(r)
	if err != nil || !object.IsKeyOf(k, namespace, name) {
		return nil, false, err
	}
	return o, true, nil
}

// before is the object of r's key just before r, and its key. It is read, where the index
// knows it, from the key's record before r: a list's records lie in key order, and a page of
// objects as a list found them reads a few blocks, not one an object. Else from the state before
// it that r's record carries.
func (p *Past) before(r ref) (*object.Object, string, error) {
	if r.e.kind == kindAdded {
		rec, err := p.v.record(r.si, r.e.blk, r.e.nth)
		return nil, rec.key, err
	}
	if at, e, ok := p.earlier(r); ok {
		prev, err := p.v.record(at, e.blk, e.nth)
		if err != nil {
			return nil, "", err
		}
		if prev.kind == kindDeleted {
			return nil, prev.key, nil
		}
		return p.object(prev.obj), prev.key, nil
	}
	rec, err := p.v.record(r.si, r.e.blk, r.e.nth)
	if err != nil {
		return nil, rec.key, err
	}
	if len(rec.prev) > 0 {
		return p.object(rec.prev), rec.key, nil
	}
	if !r.hasPrev {
		return nil, rec.key, nil // not known: the record should have carried it
	}
	prev, err := p.v.record(r.si, r.prev.blk, r.prev.nth)
	if err != nil || prev.kind == kindDeleted || prev.key != rec.key {
		return nil, rec.key, err
	}
	return p.object(prev.obj), rec.key, nil
}

// earlier is the index entry of r's key just before r, and its segment, when it is of r's epoch
// (see Log): then it is the key's state before r. A key's entries before r lie in r's segment or
// in earlier ones, and none of theirs is after the revision (r is the key's first change after
// it); epochs only grow, segment after segment.
func (p *Past) earlier(r ref) (int, entry, bool) {
	epoch := p.v.epoch(r.si, r.e)
	if epoch == noEpoch {
		return 0, entry{}, false
	}
	if r.hasPrev {
		return r.si, r.prev, p.v.epoch(r.si, r.prev) == epoch
	}
	for si := r.si - 1; si >= 0; si-- {
		s := &p.v.segs[si]
		if len(s.blocks) == 0 || s.blocks[len(s.blocks)-1].epoch < epoch {
			break
		}
		if s.first > p.rev && s.last <= p.upTo {
			// Every change it holds is after the revision, up to the bound: lookup looked
			// here before it found r, and found none of the key's.
			continue
		}
		if es := p.v.entries(si, r.e.key); len(es) > 0 {
			e := es[len(es)-1] // a sealed segment's, by revision
			return si, e, p.v.epoch(si, e) == epoch
		}
	}
	return 0, entry{}, false
}

// epoch is the epoch of e, an entry of segment si.
func (v *view) epoch(si int, e entry) uint32 { return v.segs[si].blocks[e.blk].epoch }

// Gone calls fn with every object that existed at the revision and whose last change is its
// delete (up to the view's bound): the objects deleted since, as they were then, in no order,
// until fn returns false. It reads the index's deletes after the revision, and from disk only
// those objects.
func (p *Past) Gone(ctx context.Context, fn func(*object.Object) bool) error {
	done := map[uint64]bool{} // each key is looked at once: its last change decides
	for si := range p.v.segs {
		s := &p.v.segs[si]
		if !p.reaches(s) {
			continue
		}
		for _, e := range s.deletes {
			if e.kind != kindDeleted || e.rev <= p.rev || e.rev > p.upTo || done[e.key] {
				continue
			}
			done[e.key] = true
			r := p.lookup(e.key)
			if last, _ := p.last(e.key); r.e.kind == kindAdded || last.kind != kindDeleted {
				continue // did not exist at the revision, or exists now
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			o, _, err := p.before(r)
			if err != nil {
				return err
			}
			if o != nil && !fn(o) {
				return nil
			}
		}
	}
	return nil
}
