package history

import (
	"context"
	"errors"
	"slices"
	"sort"
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
// last block it read.
type view struct {
	l     *Log
	segs  []segment
	floor uint64
	at    struct {
		seg int
		blk uint32
		raw []byte
	}
}

// view begins a read.
func (l *Log) view() *view {
	l.mu.RLock()
	defer l.mu.RUnlock()
	v := &view{l: l, segs: make([]segment, len(l.segs)), floor: l.floor}
	for i, s := range l.segs {
		v.segs[i] = *s
	}
	v.at.seg = -1
	return v
}

// Floor is the revision from which the log holds every change, and Through the highest one of
// a change a watch sent that it holds: a list at a revision between them, or a watch from one,
// is answered exactly.
func (l *Log) Floor() (floor, through uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.floor, l.through
}

// block is the raw records of block blk of segment si.
func (v *view) block(si int, blk uint32) ([]byte, error) {
	if v.at.seg == si && v.at.blk == blk && v.at.raw != nil {
		return v.at.raw, nil
	}
	b := v.segs[si].blocks[blk]
	payload := make([]byte, b.n)
	if err := v.l.wal.ReadAt(b.pos, payload); err != nil {
		return nil, errors.Join(ErrMovedOn, err)
	}
	raw, err := v.l.codec.records(payload)
	if err != nil {
		return nil, err
	}
	v.at.seg, v.at.blk, v.at.raw = si, blk, raw
	return raw, nil
}

// record is the nth record of block blk of segment si.
func (v *view) record(si int, blk uint32, nth uint16) (record, error) {
	raw, err := v.block(si, blk)
	if err != nil {
		return record{}, err
	}
	r := reader{buf: raw}
	var rec record
	for i := 0; r.next(&rec); i++ {
		if i == int(nth) {
			return rec, nil
		}
	}
	if r.err != nil {
		return record{}, r.err
	}
	return record{}, errors.New("an index entry past its block's records")
}

// entries are the index entries of key's hash in segment si, oldest first.
func (v *view) entries(si int, h uint64) []entry {
	s := &v.segs[si]
	if !s.sealed {
		var out []entry
		for _, e := range s.index {
			if e.key == h {
				out = append(out, e)
			}
		}
		return out
	}
	lo := sort.Search(len(s.index), func(i int) bool { return s.index[i].key >= h })
	hi := lo
	for hi < len(s.index) && s.index[hi].key == h {
		hi++
	}
	return s.index[lo:hi]
}

// before is the JSON of key's object just before rec, a record of segment si: none for an
// object rec adds; its prev, when the segment holds no earlier record of key; else the object
// of the record of key before it in the segment.
func (v *view) before(si int, rec *record) ([]byte, error) {
	if rec.kind == kindAdded {
		return nil, nil
	}
	if len(rec.prev) > 0 {
		return rec.prev, nil
	}
	es := v.entries(si, v.l.hash(rec.key))
	for i := len(es) - 1; i >= 0; i-- {
		e := es[i]
		if e.rev >= rec.rev {
			continue
		}
		p, err := v.record(si, e.blk, e.nth)
		if err != nil {
			return nil, err
		}
		if p.key != rec.key {
			continue // another key of the same hash
		}
		if p.kind == kindDeleted {
			return nil, nil
		}
		return p.obj, nil
	}
	return nil, nil
}

// Revisions calls fn with every retained version of the object at key (namespace/name),
// newest first, until fn returns false.
func (l *Log) Revisions(ctx context.Context, key string, fn func(Version) bool) error {
	v, h := l.view(), l.hash(key)
	var last uint64 // a version recorded twice (a watch resumed from before the history's end) is one
	for si := len(v.segs) - 1; si >= 0; si-- {
		es := v.entries(si, h)
		es = slices.Clone(es)
		// Newest first: by revision, and among equal ones the later record.
		slices.Reverse(es)
		slices.SortStableFunc(es, func(a, b entry) int { return compareRev(b.rev, a.rev) })
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

func compareRev(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// versionOf is rec as a Version. Its object keeps the block rec was read from.
func versionOf(rec *record) Version {
	return Version{Type: typeOf(rec.kind), Revision: rec.rev, Time: time.Unix(0, rec.time), Listed: rec.flags&flagListed != 0,
		Managers: rec.managers, Object: object.OfJSON(rec.obj, nil, nil)}
}

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
	v := l.view()
	last := rev // a change recorded twice (a watch resumed from before the history's end) is sent once
	return v.scan(ctx, rev, func(si int, rec *record) (bool, error) {
		if rec.flags&flagListed != 0 || rec.rev <= last {
			return true, nil
		}
		last = rec.rev
		c := Change{Version: versionOf(rec)}
		if before {
			b, err := v.before(si, rec)
			if err != nil {
				return false, err
			}
			if b != nil {
				c.Before = object.OfJSON(b, nil, nil)
			}
		}
		return fn(c), nil
	})
}

// scan calls fn with each change after revision rev, in the order written, until it returns
// false or an error.
func (v *view) scan(ctx context.Context, rev uint64, fn func(si int, rec *record) (bool, error)) error {
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
			raw, err := v.block(si, uint32(blk))
			if err != nil {
				return err
			}
			r := reader{buf: raw}
			var rec record
			for r.next(&rec) {
				if rec.kind == kindGap || rec.rev <= rev {
					continue
				}
				if ok, err := fn(si, &rec); err != nil || !ok {
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

// At is, for each object changed after revision rev, its state at rev: its object then, or nil
// for an object that did not exist then. An object not in it was, at rev, as it is now. Exact
// only for a revision at or after the floor (see Floor).
func (l *Log) At(ctx context.Context, rev uint64) (map[string]*object.Object, error) {
	v := l.view()
	at := map[string]*object.Object{}
	err := v.scan(ctx, rev, func(si int, rec *record) (bool, error) {
		if _, decided := at[rec.key]; decided {
			return true, nil
		}
		b, err := v.before(si, rec)
		if err != nil {
			return false, err
		}
		at[rec.key] = nil
		if b != nil {
			at[rec.key] = object.OfJSON(b, nil, nil)
		}
		return true, nil
	})
	return at, err
}

// Deleted calls fn with the last version of every object whose last retained change is its
// delete, until fn returns false; in no order.
func (l *Log) Deleted(ctx context.Context, fn func(Version) bool) error {
	v := l.view()
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
