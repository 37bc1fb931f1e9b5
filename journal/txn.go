package journal

import (
	"encoding/binary"
	"maps"
	"math/bits"
	"slices"
	"time"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// txn is one commit being built: the records to append, and what they change, put into
// effect in the store only once the append has succeeded. Reads see the changes made so far.
type txn struct {
	s   *store
	buf []byte
	// refs are the values the commit writes from where they lie, not copied into buf (see
	// value); refBytes is their length.
	refs     []ref
	refBytes int
	objects  map[string]map[string]*staged // nil: deleted
	records  map[string][]byte             // nil: removed
	acked    map[string]map[uint64]bool
	revs     map[string]map[string]revision
}

// ref is a value written from where it lies, before buf[at:], at off in the payload.
type ref struct {
	at, off int
	b       []byte
}

// recentValues is how many of the last values written from where they lie an entry looks
// among for its objects (see placed): an event's state, and its old object as its first
// entry wrote it, are the last two.
const recentValues = 4

// refMin is the shortest value a commit writes from where it lies (see txn.value); a shorter
// one costs less copied than as one more vector of the write.
const refMin = 512

// len is the length of the payload so far: where the next byte appended goes.
func (t *txn) len() int { return len(t.buf) + t.refBytes }

// value appends b, which its owner never changes (an object's JSON), to the payload: written
// from where it lies once it is refMin bytes or longer, so that a commit of an initial list
// does not copy every object, and the entry's body that carries it, into its buffer.
func (t *txn) value(b []byte) {
	if len(b) < refMin {
		t.buf = append(t.buf, b...)
		return
	}
	t.refs = append(t.refs, ref{at: len(t.buf), off: t.len(), b: b})
	t.refBytes += len(b)
}

// placed is where in the payload b lies, if the commit wrote it, from where it lies, among its
// last recentValues values: an entry refers to it there rather than writing it again.
func (t *txn) placed(b []byte) (int, bool) {
	if len(b) < refMin {
		return 0, false
	}
	for i := len(t.refs) - 1; i >= max(0, len(t.refs)-recentValues); i-- {
		if r := t.refs[i]; len(r.b) == len(b) && &r.b[0] == &b[0] {
			return r.off, true
		}
	}
	return 0, false
}

// parts are the payload's pieces in order, for wal.Log.Write.
func (t *txn) parts() [][]byte {
	out := make([][]byte, 0, 2*len(t.refs)+1)
	at := 0
	for _, r := range t.refs {
		out = append(out, t.buf[at:r.at], r.b)
		at = r.at
	}
	return append(out, t.buf[at:])
}

// staged is an object's new state in a transaction, and where its JSON is in the payload.
type staged struct {
	st  stored
	off int
}

// begin starts a commit estimated at size bytes, in the smallest spare buffer that holds them
// (a commit of a few acknowledgements does not take the one an initial list's next commit
// needs), or a new one.
func (s *store) begin(size int) *txn {
	best := -1
	for i, b := range s.spare {
		if cap(b) >= size && (best < 0 || cap(b) < cap(s.spare[best])) {
			best = i
		}
	}
	t := s.spareTxn
	s.spareTxn = nil
	if t == nil {
		t = &txn{s: s}
	}
	if best >= 0 {
		b := s.spare[best]
		s.spare = slices.Delete(s.spare, best, best+1)
		s.spareCap -= cap(b)
		t.buf = b
		return t
	}
	n := max(size, minCommitBuffer)
	if n <= maxRoundedBuffer {
		n = 1 << bits.Len(uint(n-1)) // a size a later commit can take again; a larger one is not kept
	}
	t.buf = make([]byte, 0, n)
	return t
}

// end is called once t is done with, committed or not: its buffer stays with the log until
// synced (or is let go), and its maps, cleared, go to the next commit. A commit made about a
// dozen small maps, a tenth of what a storm allocated. Maps cleared keep their entries per
// resource and per sink, empty: whoever reads them takes an empty one for none.
func (t *txn) end() {
	for _, m := range t.objects {
		clear(m)
	}
	for _, m := range t.acked {
		clear(m)
	}
	for _, m := range t.revs {
		clear(m)
	}
	clear(t.records)
	clear(t.refs)
	t.buf, t.refs, t.refBytes = nil, t.refs[:0], 0
	t.s.spareTxn = t
}

// get is an object's state.
func (t *txn) get(res, key string) (stored, bool) {
	if st, ok := t.objects[res][key]; ok {
		if st == nil {
			return stored{}, false
		}
		return st.st, true
	}
	st, ok := t.s.objects[res][key]
	return st, ok
}

// put records obj as the state of the object at key.
func (t *txn) put(res, key string, obj *object.Object) {
	uid, rv, j := string(obj.GetUID()), obj.GetResourceVersion(), obj.JSON()
	t.buf = append(t.buf, recObject)
	t.buf = appendString(t.buf, res)
	t.buf = appendString(t.buf, key)
	t.buf = appendString(t.buf, uid)
	t.buf = appendString(t.buf, rv)
	t.buf = binary.AppendUvarint(t.buf, uint64(len(j)))
	off := t.len()
	t.value(j)
	t.stage(res, key, &staged{st: stored{uid: uid, rv: rv, obj: obj, n: len(j)}, off: off})
}

// revision notes that stream's objects' states hold every change through rev, as the informer
// of selection saw them; the record is written once per commit, with the last revision.
func (t *txn) revision(res, stream, selection string, rev uint64) {
	if r, ok := t.revs[res][stream]; ok && r.selection == selection && r.rev >= rev {
		return
	}
	if t.revs == nil {
		t.revs = map[string]map[string]revision{}
	}
	inner(t.revs, res)[stream] = revision{selection, rev}
}

// writeRevisions appends the revisions noted to the commit.
func (t *txn) writeRevisions() {
	for res, m := range t.revs {
		for stream, r := range m {
			t.buf = appendRevision(t.buf, res, stream, r)
		}
	}
}

func appendRevision(buf []byte, res, stream string, r revision) []byte {
	buf = append(buf, recRevision)
	buf = appendString(buf, res)
	buf = appendString(buf, stream)
	buf = appendString(buf, r.selection)
	return binary.AppendUvarint(buf, r.rev)
}

// del removes the state of the object at key.
func (t *txn) del(res, key string) {
	if _, ok := t.get(res, key); !ok {
		return
	}
	t.buf = append(t.buf, recDelete)
	t.buf = appendString(t.buf, res)
	t.buf = appendString(t.buf, key)
	t.stage(res, key, nil)
}

func (t *txn) stage(res, key string, st *staged) {
	if t.objects == nil {
		t.objects = map[string]map[string]*staged{}
	}
	if t.objects[res] == nil {
		t.objects[res] = map[string]*staged{}
	}
	t.objects[res][key] = st
}

// each calls fn with every object of res, as the transaction sees them.
func (t *txn) each(res string, fn func(key string, st stored)) {
	for k, st := range t.s.objects[res] {
		if _, ok := t.objects[res][k]; !ok {
			fn(k, st)
		}
	}
	for k, st := range t.objects[res] {
		if st != nil {
			fn(k, st.st)
		}
	}
}

// holds reports whether anything is stored for res.
func (t *txn) holds(res string) bool {
	for _, st := range t.objects[res] {
		if st != nil {
			return true
		}
	}
	for k := range t.s.objects[res] {
		if _, staged := t.objects[res][k]; !staged {
			return true
		}
	}
	return false
}

// resources are those the store has held objects of.
func (t *txn) resources() []string {
	var out []string
	for res := range t.s.objects {
		out = append(out, res)
	}
	for res, m := range t.objects {
		if _, ok := t.s.objects[res]; !ok && len(m) > 0 {
			out = append(out, res)
		}
	}
	return out
}

// entry appends an outbox entry whose body is body (d's own is not written), and returns
// where the entry begins in the payload, its length, and its length with its body whole. The
// objects of the body that the commit wrote already (the object's state, another sink's entry
// of the same event) are referred to, and the body written in pieces (see pieced).
func (t *txn) entry(sink string, seq uint64, d Entry, body payload) (off, n, whole int) {
	t.buf = append(t.buf, recEntry)
	t.buf = appendString(t.buf, sink)
	t.buf = binary.AppendUvarint(t.buf, seq)
	d.Body = nil
	whole = encodedSize(d) + body.len()
	objectAt, objectPlaced := t.placed(body.object)
	oldAt, oldPlaced := t.placed(body.old)
	if !objectPlaced && !oldPlaced {
		t.buf = binary.AppendUvarint(t.buf, uint64(whole))
		off = t.len()
		t.buf = appendEntry(t.buf, d)
		t.buf = append(t.buf, body.head...)
		t.value(body.object)
		if body.old != nil {
			t.buf = append(t.buf, oldObjectField...)
			t.value(body.old)
		}
		t.buf = append(t.buf, '}')
		return off, whole, whole
	}
	// How far back a reference reaches depends on the size of the entry's length before it,
	// which depends on the references' sizes: a few rounds settle both.
	size := func(off int) int {
		n := encodedSize(d) + 1 + literalSize(len(body.head)) + pieceSize(body.object, objectPlaced, off-objectAt) + literalSize(1)
		if body.old != nil {
			n += literalSize(len(oldObjectField)) + pieceSize(body.old, oldPlaced, off-oldAt)
		}
		return n
	}
	start, k := t.len(), 1
	for {
		off = start + k
		n = size(off)
		if uvarintSize(uint64(n)) == k {
			break
		}
		k = uvarintSize(uint64(n))
	}
	t.buf = binary.AppendUvarint(t.buf, uint64(n))
	t.buf = appendEntry(t.buf, d)
	t.buf = append(t.buf, pieced)
	t.buf = appendLiteral(t.buf, body.head)
	t.piece(body.object, objectPlaced, off-objectAt)
	if body.old != nil {
		t.buf = appendLiteral(t.buf, []byte(oldObjectField))
		t.piece(body.old, oldPlaced, off-oldAt)
	}
	t.buf = appendLiteral(t.buf, []byte("}"))
	return off, n, whole
}

// piece appends b as a piece: a reference back bytes back when the commit wrote it already,
// else a literal written from where it lies.
func (t *txn) piece(b []byte, placed bool, back int) {
	if placed {
		t.buf = append(t.buf, pieceRef)
		t.buf = binary.AppendUvarint(t.buf, uint64(back))
		t.buf = binary.AppendUvarint(t.buf, uint64(len(b)))
		return
	}
	t.buf = append(t.buf, pieceBytes)
	t.buf = binary.AppendUvarint(t.buf, uint64(len(b)))
	t.value(b)
}

// pieceSize is the length of b's piece (see piece).
func pieceSize(b []byte, placed bool, back int) int {
	if placed {
		return refSize(back, len(b))
	}
	return literalSize(len(b))
}

// has reports whether sink's outbox holds committed entry seq, not acknowledged in t.
func (t *txn) has(sink string, seq uint64) bool {
	_, ok := t.s.outbox[sink][seq]
	return ok && !t.acked[sink][seq]
}

// ack removes committed entry seq from sink's outbox.
func (t *txn) ack(sink string, seq uint64) bool {
	if !t.has(sink, seq) {
		return false
	}
	t.buf = append(t.buf, recAck)
	t.buf = appendString(t.buf, sink)
	t.buf = binary.AppendUvarint(t.buf, seq)
	if t.acked == nil {
		t.acked = map[string]map[uint64]bool{}
	}
	if t.acked[sink] == nil {
		t.acked[sink] = map[uint64]bool{}
	}
	t.acked[sink][seq] = true
	return true
}

// deadline records entry seq's retry deadline.
func (t *txn) deadline(sink string, seq uint64, d time.Time) bool {
	if !t.has(sink, seq) {
		return false
	}
	t.buf = append(t.buf, recDeadline)
	t.buf = appendString(t.buf, sink)
	t.buf = binary.AppendUvarint(t.buf, seq)
	t.buf = binary.AppendUvarint(t.buf, uint64(unixNano(d)))
	return true
}

// drop removes sink's outbox if it is empty, with nothing added in this transaction (added
// says whether something was).
func (t *txn) drop(sink string, added bool) bool {
	entries, ok := t.s.outbox[sink]
	if !ok || added || len(entries) > len(t.acked[sink]) {
		return false
	}
	t.buf = append(t.buf, recDropSink)
	t.buf = appendString(t.buf, sink)
	return true
}

// record is sink's replay record.
func (t *txn) record(sink string) ([]byte, bool) {
	if v, ok := t.records[sink]; ok {
		return v, v != nil
	}
	v, ok := t.s.records[sink]
	return v, ok
}

// setRecord writes sink's replay record; nil removes it.
func (t *txn) setRecord(sink string, v []byte) {
	t.buf = append(t.buf, recSinkRecord)
	t.buf = appendString(t.buf, sink)
	t.buf = appendBytes(t.buf, v)
	if t.records == nil {
		t.records = map[string][]byte{}
	}
	t.records[sink] = v
}

// sinkRecords are the sinks with a replay record.
func (t *txn) sinkRecords() []string {
	var out []string
	for sink := range t.s.records {
		if _, ok := t.record(sink); ok {
			out = append(out, sink)
		}
	}
	for sink, v := range t.records {
		if _, ok := t.s.records[sink]; !ok && v != nil {
			out = append(out, sink)
		}
	}
	return out
}

// commit writes t's records, if it has any, as one frame at the end of the log (synced later,
// see Journal.sync), and puts its changes into effect in the store. It returns where the
// payload lies, to place the entries it holds.
func (t *txn) commit() (wal.Pos, error) {
	t.writeRevisions()
	if t.len() == 0 {
		return wal.Pos{}, nil
	}
	p, err := t.s.log.Write(t.parts()...)
	if err != nil {
		return p, err
	}
	t.s.unsynced = append(t.s.unsynced, commitBuffer{buf: t.buf, frame: t.s.log.Written()})
	t.s.written.Add(int64(t.len()))
	for res, m := range t.objects {
		if len(m) == 0 {
			continue // a map an earlier commit left, cleared (see end)
		}
		objs := inner(t.s.objects, res)
		for key, st := range m {
			t.s.unhold(res, key)
			if st == nil {
				delete(objs, key)
				continue
			}
			st.st.at = at(p, st.off)
			objs[key] = st.st
			t.s.held.Add(objectSize(res, key, st.st))
		}
	}
	for sink, v := range t.records {
		if v == nil {
			delete(t.s.records, sink)
		} else {
			t.s.records[sink] = v
		}
	}
	for res, m := range t.revs {
		if len(m) > 0 {
			maps.Copy(inner(t.s.revisions, res), m)
		}
	}
	t.s.noteSize()
	return p, nil
}
