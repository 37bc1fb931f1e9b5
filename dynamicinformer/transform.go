package dynamicinformer

import (
	"fmt"
	"sync"

	"github.com/tidwall/gjson"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
)

// LastAppliedAnnotation is the annotation kubectl apply keeps the last applied configuration in.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// NewTransform returns the cache transform for a configured resource: it strips managedFields
// and the last-applied annotation (unless turned off), the values of core v1 secrets' data
// (unless keepSecretData; the keys stay, empty) and their stringData, and every removeFields path. A secret's last-applied annotation repeats its
// data, so it goes with the data whatever stripLastAppliedConfiguration says: no secret value
// reaches the cache, and so none reaches the API, the state store or a webhook. It modifies objects in place, is idempotent,
// and passes anything that is not an *unstructured.Unstructured through unchanged.
func NewTransform(r *config.Resource) cache.TransformFunc {
	stripManaged := *r.Transform.StripManagedFields
	stripSecretData := r.IsSecrets() && !r.Transform.KeepSecretData
	stripLastApplied := *r.Transform.StripLastAppliedConfiguration || stripSecretData
	paths := r.Transform.Paths
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		if stripManaged {
			unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
		}
		if stripLastApplied {
			if annotations := u.GetAnnotations(); annotations != nil {
				if _, ok := annotations[LastAppliedAnnotation]; ok {
					unstructured.RemoveNestedField(u.Object, "metadata", "annotations", LastAppliedAnnotation)
					if len(annotations) == 1 {
						unstructured.RemoveNestedField(u.Object, "metadata", "annotations")
					}
				}
			}
		}
		if stripSecretData {
			// The keys stay, so that the key count kubectl shows is right; no value does.
			if data, ok := u.Object["data"].(map[string]any); ok {
				for k := range data {
					data[k] = ""
				}
			}
			delete(u.Object, "stringData")
		}
		for _, p := range paths {
			p.Remove(u.Object)
		}
		return u, nil
	}
}

// ingest is the informers' transform for r: an object is stripped and kept as an Object with
// the values of the indexers ix, and with apiVersion and kind (those of gvk where the apiserver
// left them out). An object that came in as JSON already cut to what the cache keeps (a wire
// object read with r's cuts) is kept as it is; otherwise, and for an object the decoder built,
// the strip works on its maps, which are garbage from then on. It is idempotent:
// an Object passes through unchanged, as client-go hands a watch-list's objects, transformed as
// they streamed in, to the transform again on their way to the queue.
func ingest(r *config.Resource, ix []indexer, gvk schema.GroupVersionKind) cache.TransformFunc {
	strip := NewTransform(r)
	apiVersion := gvk.GroupVersion().String()
	var scratch sync.Pool // encoding buffers: each object's JSON is kept exactly sized
	return func(obj any) (any, error) {
		var u *unstructured.Unstructured
		switch o := obj.(type) {
		case *wire:
			if o.cut {
				return objectOf(o.raw, ix), nil
			}
			u = &unstructured.Unstructured{}
			if err := utiljson.Unmarshal(o.raw, &u.Object); err != nil {
				return nil, fmt.Errorf("decode %s/%s: %w", o.Namespace, o.Name, err)
			}
		case *unstructured.Unstructured:
			u = o
		default:
			return obj, nil
		}
		if _, err := strip(u); err != nil {
			return nil, err
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			u.SetAPIVersion(apiVersion)
			u.SetKind(gvk.Kind)
		}
		return newObject(u, ix, &scratch), nil
	}
}

// cuts are the transforms of a resource that its objects' JSON can be cut to without decoding
// it: the managedFields and the last-applied annotation. ingest keeps such a resource's objects
// as the apiserver sent them, less what is cut; what else is configured (a secret's data,
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

// apply is doc, an object's JSON, less what c cuts, with apiVersion and kind put in first where
// doc has neither (a list's items may leave them out): a new slice, exactly sized. What it keeps
// is as it was, byte for byte; an object that lost its last annotation loses its annotations.
func (c cuts) apply(doc []byte, apiVersion, kind string) []byte {
	var out pieces
	top := gjson.Parse(docOf(doc))
	var typed, members bool
	var meta gjson.Result
	top.ForEach(func(k, v gjson.Result) bool {
		members = true
		switch k.Str {
		case "apiVersion", "kind":
			typed = true
		case "metadata":
			meta = v
		}
		return true
	})
	from := 0
	if !typed {
		open := top.Index + 1 // past the object's '{'
		out.add(doc[:open])
		out.add(fmt.Appendf(nil, `"apiVersion":%s,"kind":%s`, AppendString(nil, apiVersion), AppendString(nil, kind)))
		if members {
			out.add(comma)
		}
		from = open
	}
	if kept, changed := c.metadata(doc, meta); changed {
		out.add(doc[from:meta.Index])
		out.addAll(kept)
		from = meta.Index + len(meta.Raw)
	}
	out.add(doc[from:])
	return out.bytes()
}

// metadata is meta, the object's metadata, less what c cuts, as pieces of doc, and whether it
// cut anything.
func (c cuts) metadata(doc []byte, meta gjson.Result) (pieces, bool) {
	var kept pieces
	changed := false
	kept.add(open)
	meta.ForEach(func(k, v gjson.Result) bool {
		member := doc[k.Index : v.Index+len(v.Raw)]
		switch {
		case c.managedFields && k.Str == "managedFields":
			changed = true
			return true
		case c.lastApplied && k.Str == "annotations" && v.IsObject():
			annotations, cut := cutMember(doc, v, LastAppliedAnnotation)
			if !cut {
				break
			}
			changed = true
			if len(annotations.parts) == 2 { // nothing left between the braces
				return true
			}
			if len(kept.parts) > 1 {
				kept.add(comma)
			}
			kept.add(doc[k.Index:v.Index])
			kept.addAll(annotations)
			return true
		}
		if len(kept.parts) > 1 {
			kept.add(comma)
		}
		kept.add(member)
		return true
	})
	kept.add(closing)
	return kept, changed
}

// cutMember is obj, an object in doc, without its member named key, as pieces of doc, and
// whether it had one.
func cutMember(doc []byte, obj gjson.Result, key string) (pieces, bool) {
	var kept pieces
	cut := false
	kept.add(open)
	obj.ForEach(func(k, v gjson.Result) bool {
		if k.Str == key {
			cut = true
			return true
		}
		if len(kept.parts) > 1 {
			kept.add(comma)
		}
		kept.add(doc[k.Index : v.Index+len(v.Raw)])
		return true
	})
	kept.add(closing)
	return kept, cut
}

var open, comma, closing = []byte("{"), []byte(","), []byte("}")

// pieces are slices to be joined into one.
type pieces struct {
	parts [][]byte
	n     int
}

func (p *pieces) add(b []byte) {
	p.parts = append(p.parts, b)
	p.n += len(b)
}

func (p *pieces) addAll(q pieces) {
	p.parts = append(p.parts, q.parts...)
	p.n += q.n
}

// bytes is the pieces joined, exactly sized.
func (p *pieces) bytes() []byte {
	out := make([]byte, 0, p.n)
	for _, b := range p.parts {
		out = append(out, b...)
	}
	return out
}
