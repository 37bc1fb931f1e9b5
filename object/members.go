package object

import (
	"bytes"
	"encoding/json"
	"unsafe"
)

// Reading valid JSON in place: the members of an object found by skipping over their values,
// without decoding any of them. An informer's cut (what it strips
// from an object it keeps), its indexers and ManagersOf read an object's JSON so, once per
// change: each reads the few members it needs and passes over the rest.

// Member is one member of a JSON object: its key, quoted, at doc[Start:KeyEnd], its value at
// doc[Value:End].
type Member struct{ Start, KeyEnd, Value, End int }

// Is reports whether m's key is k, without making a string of it (but for a key with an
// escape in it, which no object the apiserver sends has in the members read so).
func (m Member) Is(doc []byte, k string) bool {
	raw := doc[m.Start:m.KeyEnd]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1:len(raw)-1]) == k // a comparison: the compiler makes no string
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s == k
}

// FindMember is the index of the Member of ms named key, -1 if none.
func FindMember(doc []byte, ms []Member, key string) int {
	for i, m := range ms {
		if m.Is(doc, key) {
			return i
		}
	}
	return -1
}

// Members appends to out the members of the object of valid JSON doc whose '{' is at open.
func Members(doc []byte, open int, out []Member) []Member {
	i := SkipSpace(doc, open+1)
	if i >= len(doc) || doc[i] == '}' {
		return out
	}
	for i < len(doc) {
		var m Member
		m.Start = i
		m.KeyEnd = skipString(doc, i)
		i = SkipSpace(doc, m.KeyEnd)
		m.Value = SkipSpace(doc, min(i+1, len(doc))) // past the ':'
		m.End = skipValue(doc, m.Value)
		out = append(out, m)
		i = SkipSpace(doc, m.End)
		if i >= len(doc) || doc[i] != ',' {
			break
		}
		i = SkipSpace(doc, i+1)
	}
	return out
}

// memberScan reads the members of an object of valid JSON one at a time, its caller reading
// or passing over each value: where it reads them all, the object is read once.
type memberScan struct {
	doc []byte
	i   int // the next member's opening quote, or the object's '}'
}

// scanMembers starts reading the members of the object of doc whose '{' is at open.
func scanMembers(doc []byte, open int) memberScan {
	return memberScan{doc: doc, i: SkipSpace(doc, open+1)}
}

// next is the next member's key, unquoted (sharing the document's memory unless it has an
// escape), and where its value starts; false after the last.
func (s *memberScan) next() (key string, value int, ok bool) {
	if s.i >= len(s.doc) || s.doc[s.i] != '"' {
		return "", 0, false
	}
	key, keyEnd := stringValue(s.doc, s.i)
	colon := SkipSpace(s.doc, keyEnd)
	return key, SkipSpace(s.doc, min(colon+1, len(s.doc))), true
}

// passed moves on past the value the caller read or skipped, which ends at end.
func (s *memberScan) passed(end int) {
	s.i = SkipSpace(s.doc, end)
	if s.i < len(s.doc) && s.doc[s.i] == ',' {
		s.i = SkipSpace(s.doc, s.i+1)
	}
}

// end is the end of the object, once every member is passed.
func (s *memberScan) end() int { return min(s.i+1, len(s.doc)) }

// SkipSpace is the index of the first byte of doc from i that is not JSON's white space.
func SkipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\n' || doc[i] == '\r' || doc[i] == '\t') {
		i++
	}
	return i
}

// skipString is the end of the string whose opening quote is at i.
func skipString(doc []byte, i int) int {
	end, _ := scanString(doc, i)
	return end
}

// scanString is the end of the string whose opening quote is at i, and whether it has no
// escape in it. Its first bytes are read one by one: the keys of an object and the strings of
// its metadata are shorter than a search's set-up. A longer string is searched for its end.
func scanString(doc []byte, i int) (end int, plain bool) {
	const short = 32
	j, plain := i+1, true
	for stop := min(len(doc), i+1+short); j < stop; j++ {
		switch doc[j] {
		case '\\':
			plain = false
			j++ // the escaped byte is not the string's end
		case '"':
			return j + 1, plain
		}
	}
	for j < len(doc) {
		q := bytes.IndexByte(doc[j:], '"')
		if q < 0 {
			break
		}
		j += q
		if !Escaped(doc[i+1 : j]) {
			return j + 1, bytes.IndexByte(doc[i+1:j], '\\') < 0
		}
		j++
	}
	return len(doc), false
}

// stringValue is the JSON value that starts at doc[i], unquoted when it is a string and ""
// when it is not, and its end. A string shares doc's memory, unless it has an escape in it.
func stringValue(doc []byte, i int) (string, int) {
	if i >= len(doc) || doc[i] != '"' {
		return "", skipValue(doc, i)
	}
	end, plain := scanString(doc, i)
	if !plain {
		var s string
		_ = json.Unmarshal(doc[i:end], &s)
		return s, end
	}
	raw := doc[i+1 : end-1]
	return unsafe.String(unsafe.SliceData(raw), len(raw)), end
}

// skipValue is the end of the value that starts at i.
func skipValue(doc []byte, i int) int {
	if i >= len(doc) {
		return i
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		depth := 0
		for i < len(doc) {
			switch doc[i] {
			case '"':
				i = skipString(doc, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // a number, true, false or null
		for i < len(doc) && bytes.IndexByte([]byte(",}] \t\r\n"), doc[i]) < 0 {
			i++
		}
		return i
	}
}

// Escaped reports whether the quote that follows s is escaped: preceded by an odd number of
// backslashes.
func Escaped(s []byte) bool {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}
