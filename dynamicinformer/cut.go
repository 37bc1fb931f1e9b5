package dynamicinformer

import (
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
	var topBuf, metaBuf [16]object.Member
	open := object.SkipSpace(doc, 0)
	top := object.Members(doc, open, topBuf[:0])
	meta, hasType := -1, false
	for i, m := range top {
		switch {
		case m.Is(doc, "apiVersion"), m.Is(doc, "kind"):
			hasType = true
		case m.Is(doc, "metadata"):
			if doc[m.Value] == '{' {
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
		ms := object.Members(doc, m.Value, metaBuf[:0])
		if i := object.FindMember(doc, ms, "managedFields"); i >= 0 {
			managers = object.ManagersOf(doc[ms[i].Value:ms[i].End])
		}
		if kept, changed := c.metadata(doc, ms, keptBuf[:0]); changed {
			segs = append(segs.doc(from, m.Value), kept...)
			from = m.End
		}
	}
	return segs.doc(from, len(doc)).bytes(doc), managers
}

// metadata appends to out the metadata of members ms less what c cuts, and reports whether it
// cut anything (if not, what it returns is to be ignored).
func (c cuts) metadata(doc []byte, ms []object.Member, out segments) (segments, bool) {
	changed := false
	out = out.lit("{")
	n := 0
	for _, m := range ms {
		if c.managedFields && m.Is(doc, "managedFields") {
			changed = true
			continue
		}
		if c.lastApplied && m.Is(doc, "annotations") && doc[m.Value] == '{' {
			var buf [16]object.Member
			as := object.Members(doc, m.Value, buf[:0])
			if i := object.FindMember(doc, as, LastAppliedAnnotation); i >= 0 {
				changed = true
				if len(as) == 1 {
					continue // its last annotation: no annotations
				}
				if n++; n > 1 {
					out = out.lit(",")
				}
				out = out.doc(m.Start, m.Value)
				out = out.lit("{")
				k := 0
				for j, a := range as {
					if j == i {
						continue
					}
					if k++; k > 1 {
						out = out.lit(",")
					}
					out = out.doc(a.Start, a.End)
				}
				out = out.lit("}")
				continue
			}
		}
		if n++; n > 1 {
			out = out.lit(",")
		}
		out = out.doc(m.Start, m.End)
	}
	out = out.lit("}")
	return out, changed
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
