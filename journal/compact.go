package journal

import (
	"encoding/binary"
	"fmt"
	"maps"
	"time"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// A compaction replaces the log's segments with a snapshot of the state they lead to: every
// outbox entry, every sink's replay record and every object's state, as records. The journal's
// goroutine begins a new segment and takes the state as committed at that point (a copy of
// the maps, not of the objects: those the cache shares are immutable, the others are read from
// the log); a goroutine of its own writes the snapshot, reading from the segments it replaces,
// while commits go on into the new segment; the journal's goroutine then points what it keeps
// at the snapshot and removes the old files. A crash at any point leaves either the old files
// or the snapshot whole (see package wal).

// minCompact is the log's size below which it is not compacted: below it a snapshot would cost
// more than the records it saves reading at the next start.
const minCompact = 4 << 20

// snapshotFrame is the size past which a snapshot's records begin a new frame.
const snapshotFrame = 1 << 20

// compaction is a snapshot being written: what it holds, where each thing was, and once
// written where it is.
type compaction struct {
	id      uint64 // the first segment after it
	objects []snapObject
	entries []snapEntry
	records map[string][]byte
	revs    map[string]map[string]revision
	seq     uint64
	err     error
	started time.Time
}

type snapObject struct {
	res, key string
	st       stored
	to       wal.Pos // where its JSON lies in the snapshot
	n        int     // and its length there: the cache's object's, which st.n may not be
}

type snapEntry struct {
	sink string
	seq  uint64
	x    indexed
	to   wal.Pos
}

// maybeCompact begins a compaction when the store's files have grown past twice the state they
// hold (and minCompact), and no compaction is under way. A snapshot holds about the state, so
// each is written for at least its size of commits (writing the snapshot costs about what the
// commits did); and the files stay within about twice the state, whether the log grew or the
// state shrank (an outbox emptied).
func (j *Journal) maybeCompact() {
	if j.store == nil || j.compacting || j.now().Before(j.retryCompaction) {
		return
	}
	snap, segs := j.store.log.Sizes()
	if segs == 0 || snap+segs < max(j.store.held.Load()*2, minCompact) {
		return
	}
	id, err := j.store.log.Rotate()
	if err != nil {
		j.compactionFailed()
		j.log.Warn("state store: could not begin a compaction", "path", j.store.Path, "err", err, "retryIn", j.compactionBackoff)
		return
	}
	c := j.compaction(id)
	j.compacting = true
	go func() {
		c.err = j.store.writeSnapshot(&c)
		j.compacted <- c
	}()
}

// compaction is what snapshot id is to hold: a copy of the state as it is now.
func (j *Journal) compaction(id uint64) compaction {
	c := compaction{id: id, records: maps.Clone(j.store.records), revs: map[string]map[string]revision{}, seq: j.seq, started: time.Now()}
	for res, m := range j.store.revisions {
		c.revs[res] = maps.Clone(m)
	}
	n := 0
	for _, objs := range j.store.objects {
		n += len(objs)
	}
	c.objects = make([]snapObject, 0, n)
	for res, objs := range j.store.objects {
		for key, st := range objs {
			c.objects = append(c.objects, snapObject{res: res, key: key, st: st})
		}
	}
	n = 0
	for _, entries := range j.outbox {
		n += len(entries)
	}
	c.entries = make([]snapEntry, 0, n)
	for sink, entries := range j.outbox {
		for seq, x := range entries {
			c.entries = append(c.entries, snapEntry{sink: sink, seq: seq, x: x})
		}
	}
	return c
}

// writeSnapshot writes c's state as snapshot c.id, and notes where each thing now lies.
func (s *store) writeSnapshot(c *compaction) error {
	return s.log.WriteSnapshot(c.id, func(add func([]byte) (wal.Pos, error)) error {
		// Sized once for a frame and a record past it: grown from nothing, 1.25 times at a
		// time, it was 5 MB of garbage a snapshot.
		buf := make([]byte, 0, snapshotFrame+64<<10)
		buf = append(buf, recFormat)
		buf = appendString(buf, logFormat)
		buf = append(buf, recSeq)
		buf = binary.AppendUvarint(buf, c.seq)
		// The entries and objects whose records the buffer holds, each with its bytes' offset
		// in it: where they lie is known once the buffer is added.
		var placed []placement
		flush := func(force bool) error {
			if len(buf) == 0 || !force && len(buf) < snapshotFrame {
				return nil
			}
			p, err := add(buf)
			if err != nil {
				return err
			}
			for _, pl := range placed {
				if pl.object {
					c.objects[pl.i].to = at(p, pl.off)
				} else {
					c.entries[pl.i].to = at(p, pl.off)
				}
			}
			buf, placed = buf[:0], placed[:0]
			return nil
		}
		for res, m := range c.revs {
			for stream, r := range m {
				buf = appendRevision(buf, res, stream, r)
			}
		}
		for sink, v := range c.records {
			buf = append(buf, recSinkRecord)
			buf = appendString(buf, sink)
			buf = appendBytes(buf, v)
		}
		var pieces []byte // an entry whose body is in pieces, read to be written whole
		for i := range c.entries {
			e := &c.entries[i]
			buf = append(buf, recEntry)
			buf = appendString(buf, e.sink)
			buf = binary.AppendUvarint(buf, e.seq)
			var err error
			if e.x.whole == e.x.n {
				buf, err = s.appendRead(buf, e.x.at, int(e.x.n))
			} else {
				buf, pieces, err = s.appendWholeAt(buf, pieces, e.x)
			}
			if err != nil {
				return fmt.Errorf("outbox %s entry %d: %w", e.sink, e.seq, err)
			}
			off := len(buf) - int(e.x.whole)
			if e.x.deadline != 0 {
				putEntryDeadline(buf[off:], fromUnixNano(e.x.deadline))
			}
			placed = append(placed, placement{i: i, off: off})
			if err := flush(false); err != nil {
				return err
			}
		}
		for i := range c.objects {
			o := &c.objects[i]
			buf = append(buf, recObject)
			buf = appendString(buf, o.res)
			buf = appendString(buf, o.key)
			buf = appendString(buf, o.st.uid)
			buf = appendString(buf, o.st.rv)
			var err error
			if buf, o.n, err = s.appendJSON(buf, o.st); err != nil {
				return fmt.Errorf("object %s %s: %w", o.res, o.key, err)
			}
			placed = append(placed, placement{object: true, i: i, off: len(buf) - o.n})
			if err := flush(false); err != nil {
				return err
			}
		}
		return flush(true)
	})
}

// placement is a snapshot's entry (or object, c.entries[i] or c.objects[i]) whose bytes begin
// at off in the frame being filled.
type placement struct {
	object bool
	i      int
	off    int
}

// finishCompaction points what the journal keeps at the snapshot c wrote, and removes the
// files it replaces; or, if c failed, leaves them.
func (j *Journal) finishCompaction(c compaction) {
	j.compacting = false
	if c.err != nil {
		j.compactionFailed()
		j.log.Warn("state store: compaction failed; the log is kept as it is, and compacted again later", "path", j.store.Path, "err", c.err, "retryIn", j.compactionBackoff)
		return
	}
	j.compactionBackoff = 0
	j.files.Lock()
	defer j.files.Unlock()
	j.idx.Lock()
	for _, e := range c.entries {
		if x, ok := j.outbox[e.sink][e.seq]; ok && x.at == e.x.at {
			x.at, x.n = e.to, x.whole
			j.outbox[e.sink][e.seq] = x
		}
	}
	j.idx.Unlock()
	for _, o := range c.objects {
		if st, ok := j.store.objects[o.res][o.key]; ok && st.at == o.st.at {
			st.at, st.n = o.to, o.n
			j.store.objects[o.res][o.key] = st
		}
	}
	remove := j.store.log.Compact(c.id)
	j.removing.Go(func() { // off the writer's goroutine: commits go on meanwhile
		if err := remove(); err != nil {
			j.log.Warn("state store: could not remove the files a snapshot replaced", "path", j.store.Path, "err", err)
		}
	})
	j.store.noteSize()
	j.m.compactions.Inc()
	snap, _ := j.store.log.Sizes()
	j.log.Info("state store compacted", "path", j.store.Path, "objects", len(c.objects), "entries", len(c.entries), "bytes", snap, "took", time.Since(c.started))
}

// keep marks obj, an object the cache holds, as the stored state of the object at key, when the
// state stored is the same (uid and resourceVersion): from then on the store reads it from
// memory rather than from the log.
func (s *store) keep(res, key string, obj *object.Object) {
	if st, ok := s.objects[res][key]; ok && st.obj == nil {
		st.obj = obj
		s.objects[res][key] = st
	}
}

// compactionFailed counts a failed compaction and puts the next off: each try begins a segment
// and writes the whole state, so a volume too full for a snapshot is not tried at every commit.
// The backoff doubles from a second to five minutes.
func (j *Journal) compactionFailed() {
	j.m.compactionErrors.Inc()
	j.compactionBackoff = min(max(2*j.compactionBackoff, time.Second), 5*time.Minute)
	j.retryCompaction = j.now().Add(j.compactionBackoff)
}
