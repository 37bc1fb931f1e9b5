package dynamicinformer

import (
	"bytes"
	"encoding/json"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
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
	b := append([]byte(`"apiVersion":`), object.AppendString(nil, apiVersion)...)
	b = append(append(b, `,"kind":`...), object.AppendString(nil, kind)...)
	return string(b)
}

// apply is doc, an object's valid JSON, less what c cuts, with typed (see typeMembers) put in
// first where doc has neither apiVersion nor kind (a list's items may leave them out): a new
// slice, exactly sized. What it keeps is as it was, byte for byte; an object that lost its
// last annotation loses its annotations. It reads doc without decoding any of it but the keys,
// and its managedFields, which it returns summarised (object.ManagersOf; nil for none).
func (c cuts) apply(doc []byte, typed string) (cut []byte, managers object.Managers) {
	var segBuf, keptBuf [32]segment
	segs := segments(segBuf[:0])
	var topBuf, metaBuf [16]jsonMember
	open := skipSpace(doc, 0)
	top := objectMembers(doc, open, topBuf[:0])
	meta, hasType := -1, false
	for i, m := range top {
		switch {
		case m.is(doc, "apiVersion"), m.is(doc, "kind"):
			hasType = true
		case m.is(doc, "metadata"):
			if doc[m.value] == '{' {
				meta = i
			}
		}
	}
	from := 0
	if !hasType {
		segs = segs.doc(0, open+1).lit(typed)
		if len(top) > 0 {
			segs = segs.lit(",")
		}
		from = open + 1
	}
	if meta >= 0 {
		m := top[meta]
		ms := objectMembers(doc, m.value, metaBuf[:0])
		if i := find(doc, ms, "managedFields"); i >= 0 {
			managers = object.ManagersOf(doc[ms[i].value:ms[i].end])
		}
		if kept, changed := c.metadata(doc, ms, keptBuf[:0]); changed {
			segs = append(segs.doc(from, m.value), kept...)
			from = m.end
		}
	}
	return segs.doc(from, len(doc)).bytes(doc), managers
}

// metadata appends to out the metadata of members ms less what c cuts, and reports whether it
// cut anything (if not, what it returns is to be ignored).
func (c cuts) metadata(doc []byte, ms []jsonMember, out segments) (segments, bool) {
	changed := false
	out = out.lit("{")
	n := 0
	for _, m := range ms {
		if c.managedFields && m.is(doc, "managedFields") {
			changed = true
			continue
		}
		if c.lastApplied && m.is(doc, "annotations") && doc[m.value] == '{' {
			var buf [16]jsonMember
			as := objectMembers(doc, m.value, buf[:0])
			if i := find(doc, as, LastAppliedAnnotation); i >= 0 {
				changed = true
				if len(as) == 1 {
					continue // its last annotation: no annotations
				}
				if n++; n > 1 {
					out = out.lit(",")
				}
				out = out.doc(m.start, m.value)
				out = out.lit("{")
				k := 0
				for j, a := range as {
					if j == i {
						continue
					}
					if k++; k > 1 {
						out = out.lit(",")
					}
					out = out.doc(a.start, a.end)
				}
				out = out.lit("}")
				continue
			}
		}
		if n++; n > 1 {
			out = out.lit(",")
		}
		out = out.doc(m.start, m.end)
	}
	out = out.lit("}")
	return out, changed
}

// jsonMember is one member of a JSON object: its key, quoted, at doc[start:keyEnd], its value at
// doc[value:end].
type jsonMember struct{ start, keyEnd, value, end int }

// is reports whether m's key is k, without making a string of it (but for a key with an
// escape in it, which no object the apiserver sends has in the members cut).
func (m jsonMember) is(doc []byte, k string) bool {
	raw := doc[m.start:m.keyEnd]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1:len(raw)-1]) == k // a comparison: the compiler makes no string
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s == k
}

// find is the index of the jsonMember of ms named key, -1 if none.
func find(doc []byte, ms []jsonMember, key string) int {
	for i, m := range ms {
		if m.is(doc, key) {
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
// The caller gives them room on its stack (segments(buf[:0])), which they outgrow only for an
// object of many members; each method returns them, as append does.
type segments []segment

type segment struct {
	from, to int
	lit      string
}

func (s segments) doc(from, to int) segments {
	if from < to {
		return append(s, segment{from: from, to: to})
	}
	return s
}

func (s segments) lit(l string) segments { return append(s, segment{lit: l}) }

// bytes is the segments of doc joined, exactly sized.
func (s segments) bytes(doc []byte) []byte {
	n := 0
	for _, g := range s {
		n += g.to - g.from + len(g.lit)
	}
	out := make([]byte, 0, n)
	for _, g := range s {
		out = append(append(out, doc[g.from:g.to]...), g.lit...)
	}
	return out
}
