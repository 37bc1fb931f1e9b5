package object

// Slab keeps objects of JSON read in place (OfJSON's, without indexers or managers) and their
// headers in chunks it keeps from one use to the next: for a reader that hands out many
// objects for a moment (a page of a list read from disk) and knows when they are no longer
// used. The zero Slab is ready; it is not safe for concurrent use.
type Slab struct {
	objects [][]Object // chunks, the last filled; those after it kept from an earlier use
	headers [][]byte
	o, h    int // the chunk filled of each
}

const (
	slabObjects = 256
	slabHeaders = 32 << 10
)

// OfJSON is OfJSON(b, nil, nil), kept in s: valid until s is Reset.
func (s *Slab) OfJSON(b []byte) *Object {
	if s.o == len(s.objects) || len(s.objects[s.o]) == slabObjects {
		if s.o < len(s.objects) {
			s.o++
		}
		if s.o == len(s.objects) {
			s.objects = append(s.objects, make([]Object, 0, slabObjects))
		}
	}
	c := &s.objects[s.o]
	*c = append(*c, Object{})
	o := &(*c)[len(*c)-1]
	o.ofJSON(b, nil, nil, s)
	return o
}

// header is a header of length n and capacity c, from s's chunks (a large one its own).
func (s *Slab) header(n, c int) header {
	if c > slabHeaders/4 {
		return make(header, n, c)
	}
	if s.h == len(s.headers) || slabHeaders-len(s.headers[s.h]) < c {
		if s.h < len(s.headers) {
			s.h++
		}
		if s.h == len(s.headers) {
			s.headers = append(s.headers, make([]byte, 0, slabHeaders))
		}
	}
	b := s.headers[s.h]
	at := len(b)
	s.headers[s.h] = b[:at+c]
	return header(b[at : at+n : at+c])
}

// Reset makes s's chunks ready for another use: what it kept before must not be used after.
func (s *Slab) Reset() {
	for i := range s.objects {
		clear(s.objects[i]) // the JSON the objects kept
		s.objects[i] = s.objects[i][:0]
	}
	for i := range s.headers {
		s.headers[i] = s.headers[i][:0]
	}
	s.o, s.h = 0, 0
}
