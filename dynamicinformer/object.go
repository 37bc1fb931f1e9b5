package dynamicinformer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/tidwall/gjson"
)

// Object is one object as the cache keeps it: its JSON as the transforms left it, with
// apiVersion and kind set (the apiserver's bytes less what was cut, or, for an object that was
// decoded, with map keys sorted as appendJSON writes them), and a header read once when it
// came in: namespace, name, uid, resourceVersion, labels, and the values of the resource's
// configured indexers. No tree of maps stays behind it: what needs the whole object as a value
// (a CEL filter, a table's columns) decodes it on demand with Decode, and a field selector
// reads the JSON in place. The header's strings are, wherever the JSON holds them verbatim,
// substrings of the JSON itself, so the header adds little beyond its string headers. An
// Object is immutable and shared by the cache, its snapshots and the events that carry it:
// nothing may modify what its methods return.
type Object struct {
	namespace, name, uid, resourceVersion string
	labels                                []string // key, value, key, value…, by key
	json                                  []byte
	values                                [][]string // per configured indexer, in the store's order: sorted, without repeats
}

// NewObject keeps u, as it is now, as an Object; u is not kept, and may be modified after.
func NewObject(u *unstructured.Unstructured) *Object {
	return newObject(u, nil, nil)
}

// newObject keeps u with the values of the indexers ix (see Object.values): an indexer that
// fails on u gives it no value, as with client-go's indexers. scratch, when not nil, holds
// buffers to encode into, reused from one object to the next.
func newObject(u *unstructured.Unstructured, ix []indexer, scratch *sync.Pool) *Object {
	var o *Object
	if scratch == nil {
		o = &Object{json: appendJSON(nil, u.Object)}
	} else {
		buf, _ := scratch.Get().(*[]byte)
		if buf == nil {
			buf = new([]byte)
		}
		*buf = appendJSON((*buf)[:0], u.Object)
		o = &Object{json: append(make([]byte, 0, len(*buf)), *buf...)} // exactly sized: kept for the object's life
		if cap(*buf) <= maxScratch {
			scratch.Put(buf)
		}
	}
	doc := o.doc()
	o.namespace, o.name = within(doc, u.GetNamespace()), within(doc, u.GetName())
	o.uid, o.resourceVersion = within(doc, string(u.GetUID())), within(doc, u.GetResourceVersion())
	if m, _, _ := unstructured.NestedFieldNoCopy(u.Object, "metadata", "labels"); m != nil {
		labels, _ := m.(map[string]any)
		keys := make([]string, 0, len(labels))
		for k, v := range labels {
			if _, ok := v.(string); ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		o.labels = make([]string, 0, 2*len(keys))
		for _, k := range keys {
			o.labels = append(o.labels, within(doc, k), within(doc, labels[k].(string)))
		}
	}
	if len(ix) > 0 {
		o.values = make([][]string, len(ix))
		for i, x := range ix {
			vs := x.values(u)
			for j := range vs {
				vs[j] = within(doc, vs[j])
			}
			o.values[i] = vs
		}
	}
	return o
}

// doc is the object's JSON as a string, sharing its memory: the JSON is never modified.
func (o *Object) doc() string { return unsafe.String(unsafe.SliceData(o.json), len(o.json)) }

// within is s as a substring of doc when doc holds its bytes anywhere (a JSON string that
// needed no escaping is there verbatim), so that keeping it costs no memory of its own; else a
// copy of s, so that nothing of what the decoder built is kept.
func within(doc, s string) string {
	if p, d := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(doc))); p >= d && p+uintptr(len(s)) <= d+uintptr(len(doc)) {
		return s // read from doc in place
	}
	if i := strings.Index(doc, s); i >= 0 {
		return doc[i : i+len(s)]
	}
	return strings.Clone(s)
}

// maxScratch bounds the encoding buffers kept for reuse: one huge object does not pin its
// buffer.
const maxScratch = 256 << 10

// ObjectFromJSON keeps an object's JSON, as an Object's JSON returned it, as an Object; b is
// kept, and must not be modified after.
func ObjectFromJSON(b []byte) (*Object, error) {
	if !gjson.ValidBytes(b) {
		return nil, errors.New("decode an object: not valid JSON")
	}
	return objectOf(b, nil), nil
}

// objectOf keeps b, an object's JSON, as an Object with the values of the indexers ix, none of
// which may need the object decoded (see cutsOf); b is kept, and must not be modified after.
// Its header's strings are read from b in place.
func objectOf(b []byte, ix []indexer) *Object {
	o := &Object{json: b}
	doc := o.doc()
	var meta gjson.Result
	gjson.Parse(doc).ForEach(func(k, v gjson.Result) bool {
		if k.Str == "metadata" {
			meta = v
			return false
		}
		return true
	})
	meta.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "namespace":
			o.namespace = within(doc, v.Str)
		case "name":
			o.name = within(doc, v.Str)
		case "uid":
			o.uid = within(doc, v.Str)
		case "resourceVersion":
			o.resourceVersion = within(doc, v.Str)
		case "labels":
			var pairs [][2]string
			v.ForEach(func(k, v gjson.Result) bool {
				if v.Type == gjson.String {
					pairs = append(pairs, [2]string{within(doc, k.Str), within(doc, v.Str)})
				}
				return true
			})
			slices.SortFunc(pairs, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
			o.labels = make([]string, 0, 2*len(pairs))
			for _, p := range pairs {
				o.labels = append(o.labels, p[0], p[1])
			}
		}
		return true
	})
	if len(ix) > 0 {
		o.values = make([][]string, len(ix))
		for i, x := range ix {
			vs := x.fromJSON(meta, o)
			for j := range vs {
				vs[j] = within(doc, vs[j])
			}
			o.values[i] = vs
		}
	}
	return o
}

// JSON is the object's JSON. It is shared: callers must not modify it.
func (o *Object) JSON() []byte { return o.json }

// Decode is the object decoded from its JSON: a new tree of maps, the caller's own.
func (o *Object) Decode() (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := utiljson.Unmarshal(o.json, &u.Object); err != nil {
		return nil, fmt.Errorf("decode %s: %w", o.name, err)
	}
	return u, nil
}

// GetNamespace is the object's namespace, "" for a cluster-scoped object.
func (o *Object) GetNamespace() string { return o.namespace }

// GetName is the object's name.
func (o *Object) GetName() string { return o.name }

// GetUID is the object's uid.
func (o *Object) GetUID() types.UID { return types.UID(o.uid) }

// GetResourceVersion is the object's resourceVersion.
func (o *Object) GetResourceVersion() string { return o.resourceVersion }

// Labels are the object's labels, for selectors to match, read in place.
func (o *Object) Labels() labels.Labels { return (*objectLabels)(o) }

// GetObjectMeta is the header's metadata (namespace, name, uid, resourceVersion and labels; the
// rest is in the JSON only), built for each call, for client-go's key functions
// (meta.Accessor).
func (o *Object) GetObjectMeta() metav1.Object {
	m := &metav1.ObjectMeta{Namespace: o.namespace, Name: o.name, UID: types.UID(o.uid), ResourceVersion: o.resourceVersion}
	if len(o.labels) > 0 {
		m.Labels = make(map[string]string, len(o.labels)/2)
		for i := 0; i < len(o.labels); i += 2 {
			m.Labels[o.labels[i]] = o.labels[i+1]
		}
	}
	return m
}

// objectLabels are an Object's labels as labels.Labels.
type objectLabels Object

func (l *objectLabels) Has(key string) bool { _, ok := l.Lookup(key); return ok }

func (l *objectLabels) Get(key string) string { v, _ := l.Lookup(key); return v }

func (l *objectLabels) Lookup(key string) (string, bool) {
	for i := 0; i < len(l.labels); i += 2 {
		if l.labels[i] == key {
			return l.labels[i+1], true
		}
	}
	return "", false
}
