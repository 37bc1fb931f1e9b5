package object

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

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
// reads the JSON in place. The header is packed into one small allocation of offsets (see
// header): its strings are, wherever the JSON holds them verbatim, read from the JSON itself,
// and the others are kept after the offsets. An Object is immutable and shared by the cache,
// its snapshots and the events that carry it: nothing may modify what its methods return. It
// may also keep a summary of the managedFields the transforms cut (see ManagersOf).
type Object struct {
	json     []byte
	hdr      header
	managers Managers
}

// New keeps u, as it is now, as an Object; u is not kept, and may be modified after.
func New(u *unstructured.Unstructured) *Object {
	return NewIndexed(u, nil, nil, nil)
}

// Indexer computes one index's values of an object, sorted and without repeats: Values from
// the object decoded, FromJSON (nil for an index that needs the object decoded) from its JSON
// in place, given its metadata as read from that JSON and its labels. An indexer that fails
// on an object gives it no value, as with client-go's indexers.
type Indexer struct {
	Name     string
	Values   func(u *unstructured.Unstructured) []string
	FromJSON func(meta gjson.Result, json []byte, labels LabelPairs) []string
}

// NewIndexed keeps u with the values of the indexers ix (see Object.IndexValue) and the summary
// of its managedFields managers (see ManagersOf; nil for none). scratch, when not nil, holds
// buffers to encode into, reused from one object to the next.
func NewIndexed(u *unstructured.Unstructured, ix []Indexer, managers Managers, scratch *sync.Pool) *Object {
	var o *Object
	if scratch == nil {
		o = &Object{json: appendJSON(nil, u.Object), managers: managers}
	} else {
		buf, _ := scratch.Get().(*[]byte)
		if buf == nil {
			buf = new([]byte)
		}
		*buf = appendJSON((*buf)[:0], u.Object)
		o = &Object{json: append(make([]byte, 0, len(*buf)), *buf...), managers: managers} // exactly sized: kept for the object's life
		if cap(*buf) <= MaxScratch {
			scratch.Put(buf)
		}
	}
	h := headerFields{namespace: u.GetNamespace(), name: u.GetName(), uid: string(u.GetUID()), resourceVersion: u.GetResourceVersion()}
	if m, _, _ := unstructured.NestedFieldNoCopy(u.Object, "metadata", "labels"); m != nil {
		labels, _ := m.(map[string]any)
		// On the stack for an object's few labels: the header keeps them as spans of its JSON.
		var keyBuf [16]string
		var labelBuf [32]string
		keys := keyBuf[:0]
		for k, v := range labels {
			if _, ok := v.(string); ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		h.labels = labelBuf[:0]
		for _, k := range keys {
			h.labels = append(h.labels, k, labels[k].(string))
		}
	}
	if len(ix) > 0 {
		h.values = make([][]string, len(ix))
		for i, x := range ix {
			h.values[i] = x.Values(u)
		}
	}
	o.hdr = packHeader(o.json, &h, nil)
	return o
}

// MaxScratch bounds the encoding buffers kept for reuse: one huge object does not pin its
// buffer.
const MaxScratch = 256 << 10

// FromJSON keeps an object's JSON, as an Object's JSON returned it, as an Object; b is kept,
// and must not be modified after.
func FromJSON(b []byte) (*Object, error) {
	if !gjson.ValidBytes(b) {
		return nil, errors.New("decode an object: not valid JSON")
	}
	return OfJSON(b, nil, nil), nil
}

// OfJSON keeps b, an object's valid JSON, as an Object with the values of the indexers ix,
// none of which may need the object decoded (each has FromJSON), and the summary of its
// managedFields managers (see ManagersOf; nil for none); b and managers are kept, and must not
// be modified after. Its header's strings are read from b in place.
func OfJSON(b []byte, ix []Indexer, managers Managers) *Object {
	o := &Object{}
	o.ofJSON(b, ix, managers, nil)
	return o
}

// ofJSON makes o the Object of b (see OfJSON), its header from s when not nil.
func (o *Object) ofJSON(b []byte, ix []Indexer, managers Managers, s *Slab) {
	var h headerFields
	var meta gjson.Result
	// An object's few labels are gathered on the stack: the header keeps them as spans of b.
	var pairBuf [16][2]string
	var labelBuf [32]string
	gjson.Parse(docOf(b)).ForEach(func(k, v gjson.Result) bool {
		if k.Str == "metadata" {
			meta = v
			return false
		}
		return true
	})
	meta.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "namespace":
			h.namespace = v.Str
		case "name":
			h.name = v.Str
		case "uid":
			h.uid = v.Str
		case "resourceVersion":
			h.resourceVersion = v.Str
		case "labels":
			pairs := pairBuf[:0]
			v.ForEach(func(k, v gjson.Result) bool {
				if v.Type == gjson.String {
					pairs = append(pairs, [2]string{k.Str, v.Str})
				}
				return true
			})
			slices.SortFunc(pairs, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
			h.labels = labelBuf[:0]
			for _, p := range pairs {
				h.labels = append(h.labels, p[0], p[1])
			}
		}
		return true
	})
	if len(ix) > 0 {
		h.values = make([][]string, len(ix))
		labels := slices.Clone(h.labels) // the indexers' own: the gathered ones stay on the stack
		for i, x := range ix {
			h.values[i] = x.FromJSON(meta, b, labels)
		}
	}
	o.json, o.hdr, o.managers = b, packHeader(b, &h, s), managers
}

// JSON is the object's JSON. It is shared: callers must not modify it.
func (o *Object) JSON() []byte { return o.json }

// Decode is the object decoded from its JSON: a new tree of maps, the caller's own.
func (o *Object) Decode() (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := utiljson.Unmarshal(o.json, &u.Object); err != nil {
		return nil, fmt.Errorf("decode %s: %w", o.GetName(), err)
	}
	return u, nil
}

// GetNamespace is the object's namespace, "" for a cluster-scoped object.
func (o *Object) GetNamespace() string { return o.hdr.str(o.json, fieldNamespace) }

// GetName is the object's name.
func (o *Object) GetName() string { return o.hdr.str(o.json, fieldName) }

// GetUID is the object's uid.
func (o *Object) GetUID() types.UID { return types.UID(o.hdr.str(o.json, fieldUID)) }

// GetResourceVersion is the object's resourceVersion.
func (o *Object) GetResourceVersion() string { return o.hdr.str(o.json, fieldResourceVersion) }

// Labels are the object's labels, for selectors to match, read in place.
func (o *Object) Labels() labels.Labels { return (*objectLabels)(o) }

// GetObjectMeta is the header's metadata (namespace, name, uid, resourceVersion and labels; the
// rest is in the JSON only), built for each call, for client-go's key functions
// (meta.Accessor).
func (o *Object) GetObjectMeta() metav1.Object {
	m := &metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetName(), UID: o.GetUID(), ResourceVersion: o.GetResourceVersion()}
	if n := o.hdr.labelCount(); n > 0 {
		m.Labels = make(map[string]string, n)
		for i := range n {
			k, v := o.hdr.label(o.json, i)
			m.Labels[k] = v
		}
	}
	return m
}

// IndexCount is the number of indexers the object was made with.
func (o *Object) IndexCount() int { return o.hdr.indexers() }

// IndexValueCount is the number of values the i-th of the indexers it was made with gave the
// object; none for an Object made without indexers (New, FromJSON).
func (o *Object) IndexValueCount(i int) int { return o.hdr.valueCount(i) }

// IndexValue is the j-th of the i-th indexer's values, which are sorted, without repeats.
func (o *Object) IndexValue(i, j int) string { return o.hdr.value(o.json, i, j) }

// objectLabels are an Object's labels as labels.Labels.
type objectLabels Object

func (l *objectLabels) Has(key string) bool { _, ok := l.Lookup(key); return ok }

func (l *objectLabels) Get(key string) string { v, _ := l.Lookup(key); return v }

// Lookup finds key among the labels, which are sorted by key.
func (l *objectLabels) Lookup(key string) (string, bool) {
	h, json := l.hdr, l.json
	i, found := sort.Find(h.labelCount(), func(i int) int {
		k, _ := h.label(json, i)
		return strings.Compare(key, k)
	})
	if !found {
		return "", false
	}
	_, v := h.label(json, i)
	return v, true
}

// LabelPairs are labels as they are read, before they are packed: key, value, key, value…,
// by key.
type LabelPairs []string

// Lookup finds key among the pairs.
func (p LabelPairs) Lookup(key string) (string, bool) {
	for i := 0; i < len(p); i += 2 {
		if p[i] == key {
			return p[i+1], true
		}
	}
	return "", false
}
