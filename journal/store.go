package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// store is the journal's state on disk, a log (package wal) in the directory state.path, and
// what of it the journal keeps in memory: per resource the last state of every object handed
// to the sinks (its uid and resourceVersion, and the object itself or where its JSON lies),
// the sinks' replay records, and the outboxes' index (which the Journal takes at New). Only
// the journal's goroutine changes it, a commit (one appended frame) at a time.
type store struct {
	log *wal.Log
	// Path is the log's directory.
	Path string
	// Fresh is true when there is no earlier state to compare with: nothing was read back.
	Fresh bool
	// Damaged, when set, is where damaged records were moved, and DamageErr what was wrong.
	Damaged   string
	DamageErr error
	// TornTail is how many bytes of a commit cut short by a crash were dropped at open.
	TornTail int64

	objects map[string]map[string]stored // resource name → cache key → state
	// revisions are, per resource name and stream, the revision through which the objects'
	// states hold every change of the stream, as the informer of a selection saw it.
	revisions map[string]map[string]revision
	records   map[string][]byte // sink → replayRecord's JSON
	outbox    map[string]map[uint64]indexed
	seq       uint64 // the highest outbox sequence used
	size      atomic.Int64
	written   atomic.Int64 // bytes appended
	// held is the size of the state: what a snapshot of it would hold (see heldSize).
	held atomic.Int64
	// corruptAtOpen counts the commits read back at open whose records did not all decode.
	corruptAtOpen int
	// unsynced are the buffers of the commits written and not yet durable, which the log holds
	// until they are; spare are buffers of synced commits, for commits to use again.
	unsynced []commitBuffer
	spare    [][]byte
	spareCap int // the spare buffers' capacity, in all
	// spareTxn is the transaction of the commit before, its maps cleared, for the next (see
	// txn.end).
	spareTxn *txn
}

// commitBuffer is a commit's buffer the log holds, and the number of its frame (see wal.Log.Written).
type commitBuffer struct {
	buf   []byte
	frame uint64
}

// Commit buffers up to maxRoundedBuffer are allocated in sizes of a power of two from
// minCommitBuffer, larger ones as commitSize estimates them (a commit of many small objects,
// of megabytes, would otherwise be up to twice as large). Once synced, at most maxSpare of
// them no larger than maxSpareBuffer, maxSpareBytes in all, are kept for later commits: under
// a steady stream of changes each commit then takes one. The commits written between two
// syncs' ends (syncEvery, and the fdatasync that runs beside them: 100 to 130 at 1,000 updates
// a second) each hold theirs meanwhile, hence 160 (about 2 MiB of a storm's 8 to 16 KiB
// buffers).
// An initial list's commits, of 1,024 events, take buffers of about 650 KiB with one sink
// (the objects' JSON is written from where it lies): one of them is kept too, for the next
// of the list's commits once it is synced. No more is kept, in all, than maxSpareBytes: a
// process with little to watch keeps little (4 MiB kept after the initial list of 5,000
// configmaps were 15% of a metadata-only cache's anonymous memory).
const (
	minCommitBuffer  = 8 << 10
	maxRoundedBuffer = 64 << 10
	maxSpareBuffer   = 1 << 20
	maxSpareBytes    = 2 << 20
	maxSpare         = 160
)

// stored is an object's state as the store holds it: its uid and resourceVersion, and the
// object (the cache's, as the sinks were last handed it) or, for a state read back at open,
// where its JSON lies in the log.
type stored struct {
	uid, rv string
	obj     *object.Object
	at      wal.Pos
	n       int
}

// revision is a stream's revision through which its objects' states hold every change, as the
// informer of selection (see dynamicinformer.Resumer) saw them.
type revision struct {
	selection string
	rev       uint64
}

// errLocked is another process holding the store.
var errLocked = errors.New("another process has the store open")

// openStore opens or creates the store at path. It fails at once if another process holds
// it. A torn tail is dropped; damage is set aside (see package wal), and what came before it read
// back: what followed is derived again at the next lists, with the same event ids.
func openStore(path string, datasync func(*os.File) error) (*store, error) {
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("state.path %s: is a file; the state store is a directory", path)
	}
	s := &store{Path: path, objects: map[string]map[string]stored{}, revisions: map[string]map[string]revision{}, records: map[string][]byte{}, outbox: map[string]map[uint64]indexed{}, Fresh: true}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("state.path %s: %w", path, err)
	}
	var format string
	l, rec, err := wal.Open(path, wal.Options{Datasync: datasync}, func(p wal.Pos, payload []byte) error {
		s.Fresh = false
		if f := s.load(p, payload); f != "" {
			format = f
		}
		return nil
	})
	if errors.Is(err, wal.ErrLocked) {
		err = errLocked
	}
	if err == nil && format != "" && format != logFormat && !slices.Contains(priorFormats, format) {
		err = errors.Join(fmt.Errorf("the store's format %q is not one this dynwatch reads (%s or earlier): it was written by a later release", format, logFormat), l.Close())
	}
	if err != nil {
		return nil, fmt.Errorf("state.path %s: %w", path, err)
	}
	s.log, s.TornTail = l, rec.TornTail
	if rec.Damaged != "" {
		s.Damaged, s.DamageErr = rec.Damaged, rec.DamageErr
	}
	if s.Fresh || format != logFormat {
		if _, err := l.Append(append([]byte{recFormat}, appendString(nil, logFormat)...)); err != nil {
			return nil, fmt.Errorf("state.path %s: %w", path, errors.Join(err, l.Close()))
		}
	}
	s.noteSize()
	return s, nil
}

// load applies a payload read back at open, and returns the format it names, if it names one.
// Records that do not decode end the payload's reading, and are counted as corrupt.
func (s *store) load(p wal.Pos, payload []byte) string {
	r := &recordReader{buf: payload}
	var format string
	for r.more() {
		switch k := r.kind(); k {
		case recFormat:
			format = r.string()
		case recObject:
			res, key, uid, rv := r.string(), r.string(), r.string(), r.string()
			b, off := r.bytes()
			if r.err == nil {
				s.unhold(res, key)
				st := stored{uid: uid, rv: rv, at: at(p, off), n: len(b)}
				inner(s.objects, res)[key] = st
				s.held.Add(objectSize(res, key, st))
			}
		case recDelete:
			res, key := r.string(), r.string()
			s.unhold(res, key)
			delete(s.objects[res], key)
		case recEntry:
			sink, seq := r.string(), r.uvarint()
			b, off := r.bytes()
			if r.err == nil {
				x := indexEntry(b, at(p, off))
				if old, ok := s.outbox[sink][seq]; ok {
					s.held.Add(-entrySize(sink, old.whole))
				}
				s.held.Add(entrySize(sink, x.whole))
				inner(s.outbox, sink)[seq] = x
				s.seq = max(s.seq, seq)
			}
		case recAck:
			sink, seq := r.string(), r.uvarint()
			if x, ok := s.outbox[sink][seq]; ok {
				s.held.Add(-entrySize(sink, x.whole))
			}
			delete(s.outbox[sink], seq)
		case recDeadline:
			sink, seq, deadline := r.string(), r.uvarint(), r.uvarint()
			if x, ok := s.outbox[sink][seq]; ok && r.err == nil {
				x.deadline = int64(deadline)
				s.outbox[sink][seq] = x
			}
		case recDropSink:
			sink := r.string()
			for _, x := range s.outbox[sink] {
				s.held.Add(-entrySize(sink, x.whole))
			}
			delete(s.outbox, sink)
		case recSinkRecord:
			sink := r.string()
			if v, _ := r.bytes(); len(v) > 0 {
				s.records[sink] = slices.Clone(v)
			} else {
				delete(s.records, sink)
			}
		case recSeq:
			s.seq = max(s.seq, r.uvarint())
		case recRevision:
			res, stream, selection, rev := r.string(), r.string(), r.string(), r.uvarint()
			if r.err == nil {
				inner(s.revisions, res)[stream] = revision{selection, rev}
			}
		default:
			r.err = fmt.Errorf("a record of kind %d: not one this dynwatch writes", k)
		}
	}
	if r.err != nil {
		// Its checksum held, so it was written so: what it holds is derived again at the lists.
		s.corruptAtOpen++
	}
	return format
}

// inner is m's map under k, made if there is none.
func inner[K comparable, V any](m map[string]map[K]V, k string) map[K]V {
	if m[k] == nil {
		m[k] = map[K]V{}
	}
	return m[k]
}

// object is a stored object: the one kept, or one decoded from its JSON in the log.
func (s *store) object(st stored) (*object.Object, error) {
	if st.obj != nil {
		return st.obj, nil
	}
	b, err := s.json(st)
	if err != nil {
		return nil, err
	}
	u, err := object.FromJSON(b)
	if err != nil {
		return nil, fmt.Errorf("stored object: %w", err)
	}
	return u, nil
}

// json is a stored object's JSON; the caller may keep it.
func (s *store) json(st stored) ([]byte, error) {
	if st.obj != nil {
		return st.obj.JSON(), nil
	}
	b := make([]byte, st.n)
	if err := s.log.ReadAt(st.at, b); err != nil {
		return nil, fmt.Errorf("stored object: %w", err)
	}
	return b, nil
}

// appendJSON appends st's JSON to buf as appendBytes does, read from the log straight into buf
// when the cache does not hold the object, and returns its length.
func (s *store) appendJSON(buf []byte, st stored) ([]byte, int, error) {
	if st.obj != nil {
		j := st.obj.JSON()
		return appendBytes(buf, j), len(j), nil
	}
	buf, err := s.appendRead(buf, st.at, st.n)
	if err != nil {
		return buf, 0, fmt.Errorf("stored object: %w", err)
	}
	return buf, st.n, nil
}

// appendRead appends the n bytes at p in the log to buf as appendBytes does, read straight
// into buf: at a million objects a buffer for each was 400 MB of garbage in one snapshot.
func (s *store) appendRead(buf []byte, p wal.Pos, n int) ([]byte, error) {
	buf = binary.AppendUvarint(buf, uint64(n))
	off := len(buf)
	buf = slices.Grow(buf, n)[:off+n]
	if err := s.log.ReadAt(p, buf[off:]); err != nil {
		return buf[:off], err
	}
	return buf, nil
}

// readEntry reads an outbox entry back from the log: it fails if the log cannot be read, and
// reports an entry that does not decode as corrupt.
func (s *store) readEntry(seq uint64, x indexed) (e Entry, corrupt bool, err error) {
	b := make([]byte, x.n)
	if err := s.log.ReadAt(x.at, b); err != nil {
		return Entry{}, false, fmt.Errorf("read outbox entry %d: %w", seq, err)
	}
	if x.whole != x.n {
		if b, err = s.appendWhole(make([]byte, 0, x.whole), x.at, b); errors.Is(err, errPiece) {
			return Entry{}, true, nil
		} else if err != nil {
			return Entry{}, false, fmt.Errorf("read outbox entry %d: %w", seq, err)
		}
	}
	if e, err = decodeEntry(b); err != nil {
		return e, true, nil
	}
	e.Seq = seq
	if x.deadline != 0 {
		e.Deadline = fromUnixNano(x.deadline)
	}
	return e, false, nil
}

func (s *store) noteSize() {
	snap, segs := s.log.Sizes()
	s.size.Store(snap + segs)
}

// close closes the log.
func (s *store) close() error { return s.log.Close() }

// sync makes every commit written durable: their buffers are free.
func (s *store) sync() error {
	err := s.log.Sync()
	s.synced()
	return err
}

// startSync begins making the commits written so far durable on a goroutine of the log's own
// (see wal.Log.StartSync); finishSync puts the outcome into effect once the channel is closed.
func (s *store) startSync() (<-chan struct{}, error) { return s.log.StartSync() }

// finishSync puts into effect the outcome of the sync startSync began.
func (s *store) finishSync() error {
	err := s.log.FinishSync()
	s.synced()
	return err
}

// synced frees the buffers of the commits the log has made durable, and holds no longer: by
// whichever sync, begun by startSync or not (Rotate syncs too), and whether a later one failed.
func (s *store) synced() {
	durable := s.log.Durable()
	n := 0
	for _, c := range s.unsynced {
		if c.frame > durable {
			break
		}
		if size := cap(c.buf); size <= maxSpareBuffer && len(s.spare) < maxSpare && s.spareCap+size <= maxSpareBytes {
			s.spare = append(s.spare, c.buf[:0])
			s.spareCap += size
		}
		n++
	}
	m := copy(s.unsynced, s.unsynced[n:])
	clear(s.unsynced[m:])
	s.unsynced = s.unsynced[:m]
}

// recordOverhead bounds what a record adds to the strings it holds: its kind and their lengths.
const recordOverhead = 1 + 6*binary.MaxVarintLen32

// objectSize and entrySize are what an object's state and an outbox entry add to a snapshot,
// give or take the lengths' encoding.
func objectSize(res, key string, st stored) int64 {
	return int64(recordOverhead + len(res) + len(key) + len(st.uid) + len(st.rv) + st.n)
}

func entrySize(sink string, n int32) int64 { return int64(recordOverhead+len(sink)) + int64(n) }

// unhold takes an object's state out of the size held.
func (s *store) unhold(res, key string) {
	if st, ok := s.objects[res][key]; ok {
		s.held.Add(-objectSize(res, key, st))
	}
}

// appendWholeAt appends the entry x indexes to buf as appendBytes does, with its body whole
// (see appendWhole), reading the entry into scratch, which it returns for the next. Its pieces
// were found whole when it was indexed (see wholeSize).
func (s *store) appendWholeAt(buf, scratch []byte, x indexed) ([]byte, []byte, error) {
	scratch = slices.Grow(scratch[:0], int(x.n))[:x.n]
	if err := s.log.ReadAt(x.at, scratch); err != nil {
		return buf, scratch, err
	}
	buf = binary.AppendUvarint(buf, uint64(x.whole))
	start := len(buf)
	buf, err := s.appendWhole(buf, x.at, scratch)
	if err == nil && len(buf)-start != int(x.whole) {
		err = fmt.Errorf("%d bytes whole; indexed as %d", len(buf)-start, x.whole)
	}
	return buf, scratch, err
}

// appendWhole appends v, the encoded entry that lies at p, to buf with its body whole: the
// bytes its pieces refer to are read from the log straight into buf. A piece that does not
// decode, or refers to bytes not before the entry in its file, is errPiece.
func (s *store) appendWhole(buf []byte, p wal.Pos, v []byte) ([]byte, error) {
	at, inPieces, err := bodyAt(v)
	if err != nil || !inPieces {
		return append(buf, v...), nil // one that does not decode fails as it is decoded
	}
	buf = append(buf, v[:at]...)
	for rest := v[at+1:]; len(rest) > 0; {
		pc, r, err := nextPiece(rest)
		if err != nil {
			return buf, err
		}
		rest = r
		if !pc.ref {
			buf = append(buf, pc.b...)
			continue
		}
		if int64(pc.back) > p.Off {
			return buf, errPiece
		}
		from := p
		from.Off -= int64(pc.back)
		off := len(buf)
		buf = slices.Grow(buf, pc.n)[:off+pc.n]
		if err := s.log.ReadAt(from, buf[off:]); err != nil {
			return buf[:off], err
		}
	}
	return buf, nil
}
