package dynamicinformer

import (
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Object is one object as the cache keeps it: its JSON as the transforms left it (apiVersion
// and kind set, map keys sorted, as appendJSON writes it), and a header decoded once when it
// came in: namespace, name, uid, resourceVersion, labels, and the values of the resource's
// configured indexers. No tree of maps stays behind it: what needs the whole object as a value
// (a CEL filter, a table's columns, a field selector's path) reads the JSON, or decodes it on
// demand with Decode. An Object is immutable and shared by the cache, its snapshots and the
// events that carry it: nothing may modify what its methods return.
type Object struct {
	meta   metav1.ObjectMeta // the header's metadata: namespace, name, uid, resourceVersion, labels
	json   []byte
	values [][]string // per configured indexer, in the store's order: sorted, without repeats
}

// NewObject keeps u, as it is now, as an Object; u is not kept, and may be modified after.
func NewObject(u *unstructured.Unstructured) *Object {
	return newObject(u, nil)
}

// newObject keeps u with the values of the indexers ix (see Object.values): an indexer that
// fails on u gives it no value, as with client-go's indexers.
func newObject(u *unstructured.Unstructured, ix []indexer) *Object {
	o := &Object{meta: metav1.ObjectMeta{
		Namespace:       u.GetNamespace(),
		Name:            u.GetName(),
		UID:             u.GetUID(),
		ResourceVersion: u.GetResourceVersion(),
		Labels:          u.GetLabels(),
	}}
	buf := encodeBuffers.Get().(*[]byte)
	*buf = appendJSON((*buf)[:0], u.Object)
	o.json = append(make([]byte, 0, len(*buf)), *buf...) // exactly sized: kept for the object's life
	if cap(*buf) <= maxPooledBuffer {
		encodeBuffers.Put(buf)
	}
	if len(ix) > 0 {
		o.values = make([][]string, len(ix))
		for i, x := range ix {
			o.values[i] = x.values(u)
		}
	}
	return o
}

// maxPooledBuffer bounds the encoding buffers kept for reuse: one huge object does not pin
// its buffer.
const maxPooledBuffer = 256 << 10

var encodeBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// ObjectFromJSON keeps an object's JSON, as an Object's JSON returned it, as an Object; b is
// kept, and must not be modified after.
func ObjectFromJSON(b []byte) (*Object, error) {
	var h struct {
		Metadata struct {
			Namespace       string            `json:"namespace"`
			Name            string            `json:"name"`
			UID             types.UID         `json:"uid"`
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := utiljson.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("decode an object: %w", err)
	}
	m := h.Metadata
	return &Object{json: b, meta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels}}, nil
}

// JSON is the object's JSON. It is shared: callers must not modify it.
func (o *Object) JSON() []byte { return o.json }

// Decode is the object decoded from its JSON: a new tree of maps, the caller's own.
func (o *Object) Decode() (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := utiljson.Unmarshal(o.json, &u.Object); err != nil {
		return nil, fmt.Errorf("decode %s: %w", o.meta.Name, err)
	}
	return u, nil
}

// GetNamespace is the object's namespace, "" for a cluster-scoped object.
func (o *Object) GetNamespace() string { return o.meta.Namespace }

// GetName is the object's name.
func (o *Object) GetName() string { return o.meta.Name }

// GetUID is the object's uid.
func (o *Object) GetUID() types.UID { return o.meta.UID }

// GetResourceVersion is the object's resourceVersion.
func (o *Object) GetResourceVersion() string { return o.meta.ResourceVersion }

// GetLabels are the object's labels, shared: callers must not modify them.
func (o *Object) GetLabels() map[string]string { return o.meta.Labels }

// Labels are the object's labels, for selectors to match.
func (o *Object) Labels() labels.Labels { return labels.Set(o.meta.Labels) }

// GetObjectMeta is the header's metadata (namespace, name, uid, resourceVersion and labels; the
// rest is in the JSON only), for client-go's key functions (meta.Accessor). It is shared:
// callers must not modify it.
func (o *Object) GetObjectMeta() metav1.Object { return &o.meta }
