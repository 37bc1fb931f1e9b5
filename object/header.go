package object

import (
	"encoding/binary"
	"strings"
	"unsafe"
)

// header is an Object's header packed into one allocation of bytes, which the collector does
// not scan, read in place by the Object's methods:
//
//	labels   uint32            the number of labels
//	indexers uint32            the number of indexers the object has values for
//	ends     [indexers]uint32  each indexer's end among the values, in the store's order
//	spans    [4 + 2·labels + values]{offset, length uint32}
//	extra    []byte            the strings the JSON does not hold verbatim
//
// Spans 0 to 3 are the namespace, name, uid and resourceVersion; then each label's key and
// value, by key; then each indexer's values, sorted. A span's offset is into the object's JSON
// or, with its top bit set, into extra. For a configmap with three labels and three indexers,
// an Object keeps 151 bytes besides its JSON; with the header as strings and slices (four
// strings and three slices in the Object, an array of label strings, a slice of values per
// indexer) it kept 343 (TestAnObjectKeepsLittleBesideItsJSON).
type header []byte

// The header's first four spans.
const (
	fieldNamespace = iota
	fieldName
	fieldUID
	fieldResourceVersion
	fields
)

// inExtra marks a span's offset as one into the header's extra strings.
const inExtra = 1 << 31

// headerFields is a header as it is read, before it is packed: strings read from the object's
// JSON, or copies, or the decoder's.
type headerFields struct {
	namespace, name, uid, resourceVersion string
	labels                                LabelPairs
	values                                [][]string // per indexer, in the store's order: sorted, without repeats
}

// strings is how many strings h has.
func (h *headerFields) strings() int {
	n := 4 + len(h.labels)
	for _, vs := range h.values {
		n += len(vs)
	}
	return n
}

// at is h's ith string in the order of a header's spans. Read one at a time, not gathered in a
// slice: strings put in a slice that may grow on the heap would take h's labels there with them
// (OfJSON gathers them on its stack).
func (h *headerFields) at(i int) string {
	switch i {
	case 0:
		return h.namespace
	case 1:
		return h.name
	case 2:
		return h.uid
	case 3:
		return h.resourceVersion
	}
	if i -= 4; i < len(h.labels) {
		return h.labels[i]
	}
	i -= len(h.labels)
	for _, vs := range h.values {
		if i < len(vs) {
			return vs[i]
		}
		i -= len(vs)
	}
	return ""
}

// packHeader packs h for an object whose JSON is json: each string the JSON holds verbatim
// (read from it in place, or found in it) is kept as its place in the JSON, the others are
// copied into the header, so that nothing the decoder built stays alive. The header is new, or
// for a Slab, the slab's.
func packHeader(json []byte, h *headerFields, s *Slab) header {
	doc := docOf(json)
	n := h.strings()
	var offBuf [32]int
	offs, extra := offBuf[:0], 0
	for i := range n {
		s := h.at(i)
		off := 0
		if s != "" {
			if off = offsetIn(doc, s); off < 0 {
				extra += len(s)
			}
		}
		offs = append(offs, off)
	}
	spansAt := 8 + 4*len(h.values)
	extraAt := spansAt + 8*n
	var b header
	if s != nil {
		b = s.header(extraAt, extraAt+extra)
	} else {
		b = make(header, extraAt, extraAt+extra)
	}
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(h.labels)/2))
	le.PutUint32(b[4:], uint32(len(h.values)))
	end := 0
	for i, vs := range h.values {
		end += len(vs)
		le.PutUint32(b[8+4*i:], uint32(end))
	}
	for i := range n {
		s, off := h.at(i), offs[i]
		if off < 0 { // kept in the header
			off = inExtra | (len(b) - extraAt)
			b = append(b, s...)
		}
		at := spansAt + 8*i
		le.PutUint32(b[at:], uint32(off))
		le.PutUint32(b[at+4:], uint32(len(s)))
	}
	return b
}

// offsetIn is where s is in doc: where it is read from, when it was read from doc in place,
// else where doc holds the same bytes; -1 when it does not.
func offsetIn(doc, s string) int {
	if p, d := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(doc))); p >= d && p+uintptr(len(s)) <= d+uintptr(len(doc)) {
		return int(p - d)
	}
	return strings.Index(doc, s)
}

// u32 is the number at at; 0 past the header's end, so that the zero Object's header reads as
// empty.
func (h header) u32(at int) int {
	if at+4 > len(h) {
		return 0
	}
	return int(binary.LittleEndian.Uint32(h[at:]))
}

func (h header) indexers() int { return h.u32(4) }

// span is the i-th string, read from the object's JSON json or from the header.
func (h header) span(json []byte, i int) string {
	at := 8 + 4*h.indexers() + 8*i
	off, n := h.u32(at), h.u32(at+4)
	if n == 0 {
		return ""
	}
	src := json
	if off&inExtra != 0 {
		src, off = h[8+4*h.indexers()+8*h.spans():], off&^inExtra
	}
	return unsafe.String(&src[off], n)
}

// spans is the number of spans.
func (h header) spans() int {
	values := 0
	if n := h.indexers(); n > 0 {
		values = h.u32(8 + 4*(n-1))
	}
	return fields + 2*h.labelCount() + values
}

func (h header) str(json []byte, field int) string { return h.span(json, field) }

func (h header) labelCount() int { return h.u32(0) }

// label is the i-th label, by key.
func (h header) label(json []byte, i int) (key, value string) {
	return h.span(json, fields+2*i), h.span(json, fields+2*i+1)
}

// valueRange is where the values of the i-th indexer are among the values.
func (h header) valueRange(i int) (from, to int) {
	if i >= h.indexers() {
		return 0, 0
	}
	if i > 0 {
		from = h.u32(8 + 4*(i-1))
	}
	return from, h.u32(8 + 4*i)
}

// valueCount is the number of values the i-th indexer gave the object.
func (h header) valueCount(i int) int {
	from, to := h.valueRange(i)
	return to - from
}

// value is the j-th value of the i-th indexer.
func (h header) value(json []byte, i, j int) string {
	from, _ := h.valueRange(i)
	return h.span(json, fields+2*h.labelCount()+from+j)
}
