package dynamicinformer

import (
	"bytes"
	"encoding/json"

	"github.com/dynwatch/dynwatch/config"
)

// cuts are the transforms of a resource that its objects' JSON can be cut to without decoding
// it: the managedFields and the last-applied annotation. Such a resource's objects are kept as
// the apiserver sent them, less what is cut; what else may be configured (a secret's data,
// removeFields paths, a jsonPath indexer) needs the object decoded.
type cuts struct{ managedFields, lastApplied bool }

// cutsOf are r's transforms as cuts; nil when they need its objects decoded.
func cutsOf(r *config.Resource) *cuts {
	if (r.IsSecrets() && !r.Transform.KeepSecretData) || len(r.Transform.Paths) > 0 {
		return nil
	}
	for i := range r.Indexers {
		if r.Indexers[i].Type == config.IndexJSONPath {
			return nil
		}
	}
	return &cuts{managedFields: *r.Transform.StripManagedFields, lastApplied: *r.Transform.StripLastAppliedConfiguration}
}

// typeMembers are the members "apiVersion":...,"kind":... of an object of that apiVersion and
// kind, which apply puts in an object that has neither.
func typeMembers(apiVersion, kind string) string {
	b := append([]byte(`"apiVersion":`), AppendString(nil, apiVersion)...)
	b = append(append(b, `,"kind":`...), AppendString(nil, kind)...)
	return string(b)
}

// apply is doc, an object's valid JSON, less what c cuts, with typed (see typeMembers) put in
// first where doc has neither apiVersion nor kind (a list's items may leave them out): a new
// slice, exactly sized. What it keeps is as it was, byte for byte; an object that lost its
// last annotation loses its annotations. It reads doc without decoding any of it but the keys.
func (c cuts) apply(doc []byte, typed string) []byte {
	var segs segments
	var topBuf, metaBuf [16]jsonMember
	open := skipSpace(doc, 0)
	top := objectMembers(doc, open, topBuf[:0])
	meta, hasType := -1, false
	for i, m := range top {
		switch m.key(doc) {
		case "apiVersion", "kind":
			hasType = true
		case "metadata":
			if doc[m.value] == '{' {
				meta = i
			}
		}
	}
	from := 0
	if !hasType {
		segs.doc(0, open+1)
		segs.lit(typed)
		if len(top) > 0 {
			segs.lit(",")
		}
		from = open + 1
	}
	if meta >= 0 {
		m := top[meta]
		var kept segments
		if c.metadata(doc, objectMembers(doc, m.value, metaBuf[:0]), &kept) {
			segs.doc(from, m.value)
			segs.add(kept)
			from = m.end
		}
	}
	segs.doc(from, len(doc))
	return segs.bytes(doc)
}

// metadata adds to out the metadata of members ms less what c cuts, and reports whether it
// cut anything (if not, out is to be ignored).
func (c cuts) metadata(doc []byte, ms []jsonMember, out *segments) bool {
	changed := false
	out.lit("{")
	n := 0
	for _, m := range ms {
		key := m.key(doc)
		if c.managedFields && key == "managedFields" {
			changed = true
			continue
		}
		if c.lastApplied && key == "annotations" && doc[m.value] == '{' {
			var buf [16]jsonMember
			as := objectMembers(doc, m.value, buf[:0])
			if i := find(doc, as, LastAppliedAnnotation); i >= 0 {
				changed = true
				if len(as) == 1 {
					continue // its last annotation: no annotations
				}
				if n++; n > 1 {
					out.lit(",")
				}
				out.doc(m.start, m.value)
				out.lit("{")
				k := 0
				for j, a := range as {
					if j == i {
						continue
					}
					if k++; k > 1 {
						out.lit(",")
					}
					out.doc(a.start, a.end)
				}
				out.lit("}")
				continue
			}
		}
		if n++; n > 1 {
			out.lit(",")
		}
		out.doc(m.start, m.end)
	}
	out.lit("}")
	return changed
}

// jsonMember is one member of a JSON object: its key, quoted, at doc[start:keyEnd], its value at
// doc[value:end].
type jsonMember struct{ start, keyEnd, value, end int }

// key is m's key, unquoted.
func (m jsonMember) key(doc []byte) string {
	raw := doc[m.start:m.keyEnd]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]) // compared, not kept: the compiler does not copy
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// find is the index of the jsonMember of ms named key, -1 if none.
func find(doc []byte, ms []jsonMember, key string) int {
	for i, m := range ms {
		if m.key(doc) == key {
			return i
		}
	}
	return -1
}

// objectMembers appends to out the members of the object of valid JSON doc whose '{' is at open.
func objectMembers(doc []byte, open int, out []jsonMember) []jsonMember {
	i := skipSpace(doc, open+1)
	if i >= len(doc) || doc[i] == '}' {
		return out
	}
	for i < len(doc) {
		var m jsonMember
		m.start = i
		m.keyEnd = skipString(doc, i)
		i = skipSpace(doc, m.keyEnd)
		m.value = skipSpace(doc, i+1) // past the ':'
		m.end = skipValue(doc, m.value)
		out = append(out, m)
		i = skipSpace(doc, m.end)
		if i >= len(doc) || doc[i] != ',' {
			break
		}
		i = skipSpace(doc, i+1)
	}
	return out
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\n' || doc[i] == '\r' || doc[i] == '\t') {
		i++
	}
	return i
}

// skipString is the end of the string whose opening quote is at i.
func skipString(doc []byte, i int) int {
	for j := i + 1; j < len(doc); {
		q := bytes.IndexByte(doc[j:], '"')
		if q < 0 {
			break
		}
		j += q
		if !escaped(doc[i+1 : j]) {
			return j + 1
		}
		j++
	}
	return len(doc)
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

// segments are the pieces of an output: ranges of the input and literals, joined by bytes.
type segments struct {
	buf  [32]segment
	list []segment
}

type segment struct {
	from, to int
	lit      string
}

func (s *segments) doc(from, to int) {
	if from < to {
		s.add1(segment{from: from, to: to})
	}
}

func (s *segments) lit(l string) { s.add1(segment{lit: l}) }

func (s *segments) add1(g segment) {
	if s.list == nil {
		s.list = s.buf[:0]
	}
	s.list = append(s.list, g)
}

func (s *segments) add(t segments) {
	for _, g := range t.list {
		s.add1(g)
	}
}

// bytes is the segments of doc joined, exactly sized.
func (s *segments) bytes(doc []byte) []byte {
	n := 0
	for _, g := range s.list {
		n += g.to - g.from + len(g.lit)
	}
	out := make([]byte, 0, n)
	for _, g := range s.list {
		out = append(append(out, doc[g.from:g.to]...), g.lit...)
	}
	return out
}
