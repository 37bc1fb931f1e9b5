package history

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/klauspost/compress/zstd"

	"github.com/dynwatch/dynwatch/object"
)

// A block is one frame of a resource's log (see package wal): blockFormat, its epoch (a
// uvarint; see Log), then its records one after another, compressed together with zstd. A
// record is a kind, then its fields: numbers as uvarints (times as varints), strings and byte
// strings each preceded by their length. A block of format 1, without an epoch, is read as of
// an epoch of its own.
const (
	blockFormat   byte = 2
	blockFormatV1 byte = 1
)

// The records' kinds.
const (
	// kindAdded, kindModified and kindDeleted are a change: revision, time, flags, key, uid,
	// managers, the object after it (for a delete, the apiserver's last word, at the delete's
	// resourceVersion), and the object before it, when its segment holds no earlier record
	// of the key (else empty: the earlier record is the state before it).
	kindAdded byte = iota + 1
	kindModified
	kindDeleted
	// kindGap is a revision before which the log may miss changes: a restart that could not
	// resume its watch, a relist, a change dropped while the disk was full. Revision only.
	kindGap
)

// The causes of a gap, which the log does not write: they decide how the gap moves its epochs.
const (
	// gapLost: changes before the gap were left out (dropped, or not written).
	gapLost byte = iota
	// gapListEnd: a list taken at the gap's revision ends, and what changed before it that the
	// history missed the list's records say.
	gapListEnd
	// gapRelisted: a change a relist found follows the changes it missed.
	gapRelisted
	// gapRetention: retention drops what is before the gap; what it keeps is whole.
	gapRetention
)

// flagListed marks a change a list found rather than a watch: its time is the list's, and it
// may stand for several changes the watch did not see.
const flagListed = 1

// record is one record of a resource's log, decoded. Its byte strings alias the block it was
// read from.
type record struct {
	kind     byte
	rev      uint64
	time     int64 // unix nanoseconds: when dynwatch observed the change
	flags    uint64
	key      string // namespace/name
	uid      string
	managers []byte
	obj      []byte
	prev     []byte
	cause    byte // of a gap: gapLost, gapListEnd, gapRelisted or gapRetention; not written
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

func appendBytes(buf, b []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	return append(buf, b...)
}

// appendRecord appends r's encoding to buf.
func appendRecord(buf []byte, r *record) []byte {
	buf = append(buf, r.kind)
	buf = binary.AppendUvarint(buf, r.rev)
	if r.kind == kindGap {
		return buf
	}
	buf = binary.AppendVarint(buf, r.time)
	buf = binary.AppendUvarint(buf, r.flags)
	buf = appendString(buf, r.key)
	buf = appendString(buf, r.uid)
	buf = appendBytes(buf, r.managers)
	buf = appendBytes(buf, r.obj)
	return appendBytes(buf, r.prev)
}

var errShort = errors.New("a record cut short")

// reader reads a block's records; the first error stops it.
type reader struct {
	buf []byte
	err error
	// inPlace reads each record's key in place, not copied: for a buffer never written again
	// (a cached block), whose records are read briefly.
	inPlace bool
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if uint64(len(r.buf)) < n {
		r.err = errShort
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

// skip passes over the next record without decoding it.
func (r *reader) skip() {
	if r.err != nil || len(r.buf) == 0 {
		r.err = cmp.Or(r.err, errShort)
		return
	}
	kind := r.buf[0]
	r.buf = r.buf[1:]
	r.uvarint() // revision
	switch kind {
	case kindGap:
	case kindAdded, kindModified, kindDeleted:
		r.varint()    // time
		r.uvarint()   // flags
		for range 5 { // key, uid, managers, object, the object before
			r.bytes()
		}
	default:
		r.err = fmt.Errorf("a record of unknown kind %d", kind)
	}
}

// next reads the next record into rec; false at the end of the block or at an error (r.err).
func (r *reader) next(rec *record) bool {
	if r.err != nil || len(r.buf) == 0 {
		return false
	}
	*rec = record{kind: r.buf[0]}
	r.buf = r.buf[1:]
	rec.rev = r.uvarint()
	switch rec.kind {
	case kindGap:
	case kindAdded, kindModified, kindDeleted:
		rec.time = r.varint()
		rec.flags = r.uvarint()
		if k := r.bytes(); r.inPlace && len(k) > 0 {
			rec.key = unsafe.String(&k[0], len(k))
		} else {
			rec.key = string(k)
		}
		r.bytes() // the uid: written for what may come to need it, read by nothing yet
		rec.managers, rec.obj, rec.prev = r.bytes(), r.bytes(), r.bytes()
	default:
		r.err = fmt.Errorf("a record of unknown kind %d", rec.kind)
	}
	return r.err == nil
}

// codec compresses and decompresses blocks. Both are safe for concurrent use.
type codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
	// cache holds blocks decoded for reads.
	cache *blockCache
}

func newCodec() (*codec, error) {
	// A window of 64 KiB holds a block (blockSize) and its largest record short of 32 KiB; the
	// encoder's tables then take about 1 MB, where zstd's defaults take over 15. The fastest
	// level takes half the default's time for 2% more bytes (docs/benchmarks-history.md).
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithWindowSize(64<<10), zstd.WithLowerEncoderMem(true))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxMemory(64<<20))
	if err != nil {
		return nil, err
	}
	return &codec{enc: enc, dec: dec, cache: newBlockCache(cacheBytes)}, nil
}

// block is the frame payload of records, raw (their encoding), of epoch.
func (c *codec) block(dst, raw []byte, epoch uint32) []byte {
	// Sized for what a block of objects compresses to (about 45%, docs/benchmarks-history.md):
	// the encoder, in low memory mode, would otherwise grow it from a few bytes, a dozen times.
	dst = slices.Grow(dst[:0], binary.MaxVarintLen32+1+len(raw)*3/5)
	return c.enc.EncodeAll(raw, binary.AppendUvarint(append(dst, blockFormat), uint64(epoch)))
}

// records is a block's records, raw, from its frame payload, appended to dst, and its epoch:
// noEpoch for a block of format 1.
func (c *codec) records(payload, dst []byte) ([]byte, uint32, error) {
	if len(payload) == 0 {
		return nil, 0, errors.New("an empty block")
	}
	var epoch uint64
	switch payload[0] {
	case blockFormatV1:
		payload = payload[1:]
	case blockFormat:
		e, n := binary.Uvarint(payload[1:])
		if n <= 0 || e > math.MaxUint32 {
			return nil, 0, errors.New("a block's epoch unreadable")
		}
		epoch, payload = e, payload[1+n:]
	default:
		return nil, 0, errors.New("not a block of a known format")
	}
	raw, err := c.dec.DecodeAll(payload, dst)
	return raw, uint32(epoch), err
}

// kindOf is the record kind of an event type.
func kindOf(t object.EventType) byte {
	switch t {
	case object.Added:
		return kindAdded
	case object.Modified:
		return kindModified
	}
	return kindDeleted
}

// typeOf is the event type of a change's record kind.
func typeOf(kind byte) object.EventType {
	switch kind {
	case kindAdded:
		return object.Added
	case kindModified:
		return object.Modified
	}
	return object.Deleted
}
