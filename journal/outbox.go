package journal

import (
	"bytes"
	"sort"
)

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
