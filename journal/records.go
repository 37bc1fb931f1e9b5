package journal

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// The log's records. A commit appends one frame (see package wal) holding its records one
// after another: a kind, then its fields, strings and byte strings each preceded by their
// length (a uvarint), numbers as uvarints. A snapshot holds the same records: the state as
// a sequence of them.
const (
	recFormat     byte = iota + 1 // format: the log's format (logFormat), first in a new log and in every snapshot
	recObject                     // resource, key, uid, resourceVersion, JSON: an object's state
	recDelete                     // resource, key: an object's state is gone
	recEntry                      // sink, seq, entry (encodeEntry): an outbox entry
	recAck                        // sink, seq: the entry left its outbox
	recDeadline                   // sink, seq, deadline (unix nanoseconds): the entry's retry deadline
	recDropSink                   // sink: its (empty) outbox is gone
	recSinkRecord                 // sink, replayRecord's JSON (empty: none): where its initialState replay stands
	recSeq                        // seq: the highest outbox sequence used
	recRevision                   // resource, stream, selection, revision: the stream's objects' states hold every change through revision (see Journal.Resume)
)

// logFormat is the log's format. 7 was the log's first (it follows the numbering of a store
// before the log, never released); 8 adds recRevision; 9 adds entries whose body is in pieces
// (see pieced). A log of format 7 or 8 is read, and written on as 9.
const logFormat = "9"

// priorFormats are the log's formats before logFormat, which this release reads and writes on.
var priorFormats = []string{"7", "8"}

func appendBytes(buf, b []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	return append(buf, b...)
}

// recordReader reads a payload's records; the first error stops it.
type recordReader struct {
	buf []byte
	off int // of buf[0] in the payload
	err error
}

func (r *recordReader) more() bool { return r.err == nil && len(r.buf) > 0 }

func (r *recordReader) kind() byte {
	if !r.more() {
		return 0
	}
	k := r.buf[0]
	r.buf, r.off = r.buf[1:], r.off+1
	return k
}

func (r *recordReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf)
	if n <= 0 {
		r.err = errors.New("a record cut short")
		return 0
	}
	r.buf, r.off = r.buf[n:], r.off+n
	return v
}

// bytes reads a byte string, and the offset in the payload where it begins; it aliases the
// payload.
func (r *recordReader) bytes() ([]byte, int) {
	n := r.uvarint()
	if r.err != nil {
		return nil, 0
	}
	if uint64(len(r.buf)) < n {
		r.err = errors.New("a record cut short")
		return nil, 0
	}
	b, at := r.buf[:n], r.off
	r.buf, r.off = r.buf[n:], r.off+int(n)
	return b, at
}

// string reads a string, copied out of the payload.
func (r *recordReader) string() string {
	b, _ := r.bytes()
	return string(b)
}

// at is the position of the byte at offset off of a payload that lies at p.
func at(p wal.Pos, off int) wal.Pos {
	p.Off += int64(off)
	return p
}

// An outbox entry: deadline, enqueued and observed times (unix nanoseconds), the revision, the
// since, the id, the ordering key and the filter error, then the request body, from which the
// event is restored. Formats 2 to 5 had no since.
const (
	entryHeader      = 5 * 8
	formatFourHeader = 4 * 8
)

// appendEntry appends d's encoding, of encodedSize(d) bytes, to buf.
func appendEntry(buf []byte, d Entry) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(unixNano(d.Deadline)))
	buf = binary.BigEndian.AppendUint64(buf, uint64(unixNano(d.Enqueued)))
	buf = binary.BigEndian.AppendUint64(buf, uint64(unixNano(d.Event.Observed)))
	buf = binary.BigEndian.AppendUint64(buf, d.Revision)
	buf = binary.BigEndian.AppendUint64(buf, d.Since)
	buf = appendString(buf, d.ID)
	buf = appendString(buf, d.Key)
	buf = appendString(buf, d.FilterError)
	return append(buf, d.Body...)
}

// encodedSize is the length of d's encoding.
func encodedSize(d Entry) int {
	return entryHeader + stringSize(d.ID) + stringSize(d.Key) + stringSize(d.FilterError) + len(d.Body)
}

func stringSize(s string) int { return uvarintSize(uint64(len(s))) + len(s) }

func uvarintSize(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// putEntryDeadline rewrites the deadline of v, an encoded entry, in place.
func putEntryDeadline(v []byte, deadline time.Time) {
	binary.BigEndian.PutUint64(v, uint64(unixNano(deadline)))
}

// indexed is what the journal keeps in memory of an outbox entry: enough to compute
// checkpoints, and where in the log the entry lies.
type indexed struct {
	resource schema.GroupVersionResource // from the ordering key
	revision uint64
	since    uint64
	at       wal.Pos
	n        int32 // the entry's length in the log
	whole    int32 // its length with its body whole, as a snapshot writes it: n, unless its body is in pieces
	deadline int64 // unix nanoseconds, set after the entry was written; 0 for the entry's own
}

// lowest is the lowest revision the entry's change may have happened at (see Entry.Since).
func (x indexed) lowest() uint64 {
	if x.since != 0 {
		return x.since
	}
	return x.revision
}

// indexEntry reads the index fields and lengths of v, an entry that lies at p; a corrupt entry
// has neither field.
func indexEntry(v []byte, p wal.Pos) indexed {
	x := indexed{at: p, n: int32(len(v)), whole: int32(wholeSize(v, p.Off))}
	if len(v) < entryHeader {
		return x
	}
	x.revision, x.since = binary.BigEndian.Uint64(v[24:]), binary.BigEndian.Uint64(v[32:])
	if _, rest, err := readString(v[entryHeader:]); err == nil {
		if key, _, err := readString(rest); err == nil {
			x.resource, _ = object.OrderingKeyResource(key)
		}
	}
	return x
}

// decodeEntry decodes an outbox entry as appendEntry encoded it. Its Body is the end of v: v
// must be the entry's own buffer, not modified after.
func decodeEntry(v []byte) (Entry, error) {
	if len(v) < entryHeader {
		return Entry{}, errors.New("truncated")
	}
	d := Entry{
		Deadline: fromUnixNano(int64(binary.BigEndian.Uint64(v[0:]))),
		Enqueued: fromUnixNano(int64(binary.BigEndian.Uint64(v[8:]))),
		Revision: binary.BigEndian.Uint64(v[24:]),
		Since:    binary.BigEndian.Uint64(v[32:]),
	}
	observed := fromUnixNano(int64(binary.BigEndian.Uint64(v[16:])))
	rest := v[entryHeader:]
	var err error
	if d.ID, rest, err = readString(rest); err != nil {
		return d, err
	}
	if d.Key, rest, err = readString(rest); err != nil {
		return d, err
	}
	if d.FilterError, rest, err = readString(rest); err != nil {
		return d, err
	}
	d.Body = rest[:len(rest):len(rest)]
	// The body is the request; of the event, only what names it is read, in place: a queue
	// refilled from the outbox would otherwise hold every object twice, in the body and as the
	// event's, and a refill would decode every object whole (gjson stops at what it looks for,
	// near each body's start).
	f := gjson.GetManyBytes(d.Body, "type", "resource.group", "resource.version", "resource.resource",
		"object.metadata.name", "object.metadata.namespace", "object.metadata.uid", "object.metadata.resourceVersion", "managers")
	if !f[0].Exists() || !f[4].Exists() {
		return d, errors.New("body: no type or object.metadata.name")
	}
	meta := map[string]any{"name": f[4].String(), "uid": f[6].String(), "resourceVersion": f[7].String()}
	if ns := f[5].String(); ns != "" {
		meta["namespace"] = ns
	}
	d.Event = object.Event{
		Type:     object.EventType(f[0].String()),
		Resource: schema.GroupVersionResource{Group: f[1].String(), Version: f[2].String(), Resource: f[3].String()},
		Object:   object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": meta}}),
		Observed: observed,
		Revision: d.Revision,
		Since:    d.Since,
	}
	if f[8].Exists() {
		d.Event.Managers = []byte(f[8].Raw) // a copy: the body may be let go (see shareObject)
	}
	return d, nil
}

// A body in pieces (from format 9): the byte pieced, then pieces to the entry's end, each a
// literal (pieceBytes and a byte string) or a reference (pieceRef, how far before the entry's
// first byte the bytes lie, and their length, as uvarints) to bytes its commit wrote before it,
// in the same frame: the object's state, or the objects of another sink's entry of the same
// event. A body written whole is JSON: it begins with '{', never with pieced.
const (
	pieced     byte = 0
	pieceBytes byte = 1
	pieceRef   byte = 2
)

// errPiece is a body's piece that does not decode, or refers to bytes not before its entry.
var errPiece = errors.New("a piece of the body that does not decode")

// piece is one piece of a body in pieces: b, or the n bytes that lie back bytes before the
// entry.
type piece struct {
	ref     bool
	b       []byte
	back, n int
}

// nextPiece reads the piece v begins with, and returns the rest of v after it.
func nextPiece(v []byte) (piece, []byte, error) {
	switch v[0] {
	case pieceBytes:
		n, size := binary.Uvarint(v[1:])
		if size <= 0 || uint64(len(v)-1-size) < n {
			return piece{}, nil, errPiece
		}
		b := v[1+size : 1+size+int(n)]
		return piece{b: b}, v[1+size+int(n):], nil
	case pieceRef:
		back, s1 := binary.Uvarint(v[1:])
		if s1 <= 0 {
			return piece{}, nil, errPiece
		}
		n, s2 := binary.Uvarint(v[1+s1:])
		if s2 <= 0 || n > back || back > math.MaxInt32 {
			return piece{}, nil, errPiece
		}
		return piece{ref: true, back: int(back), n: int(n)}, v[1+s1+s2:], nil
	}
	return piece{}, nil, errPiece
}

// bodyAt is the offset in v, an encoded entry, of its body, and whether the body is in pieces.
func bodyAt(v []byte) (int, bool, error) {
	if len(v) < entryHeader {
		return 0, false, errors.New("truncated")
	}
	rest := v[entryHeader:]
	for range 3 { // the id, the ordering key, the filter error
		n, size := binary.Uvarint(rest)
		if size <= 0 || uint64(len(rest)-size) < n {
			return 0, false, errors.New("truncated")
		}
		rest = rest[size+int(n):]
	}
	return len(v) - len(rest), len(rest) > 0 && rest[0] == pieced, nil
}

// wholeSize is the length of v, an encoded entry that lies at off in its file, with its body
// whole: len(v) unless the body is in pieces. A body whose pieces do not decode, or refer to
// bytes not before the entry in its file, counts as whole: read back, it does not decode.
func wholeSize(v []byte, off int64) int {
	at, inPieces, err := bodyAt(v)
	if err != nil || !inPieces {
		return len(v)
	}
	n := at
	for rest := v[at+1:]; len(rest) > 0; {
		p, r, err := nextPiece(rest)
		if err != nil || int64(p.back) > off || n > math.MaxInt32-len(p.b)-p.n {
			return len(v)
		}
		n += len(p.b) + p.n
		rest = r
	}
	return n
}

// appendLiteral appends b as a literal piece.
func appendLiteral(buf, b []byte) []byte {
	buf = append(buf, pieceBytes)
	return appendBytes(buf, b)
}

// literalSize is the length of a literal piece of n bytes, refSize that of a reference.
func literalSize(n int) int { return 1 + uvarintSize(uint64(n)) + n }
func refSize(back, n int) int {
	return 1 + uvarintSize(uint64(back)) + uvarintSize(uint64(n))
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

func readString(v []byte) (string, []byte, error) {
	n, size := binary.Uvarint(v)
	if size <= 0 || uint64(len(v)-size) < n {
		return "", nil, errors.New("truncated")
	}
	return string(v[size : size+int(n)]), v[size+int(n):], nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
