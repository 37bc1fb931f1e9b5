package dynamicinformer

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
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

// ingest is the informers' transform for r: an object is stripped and kept as an object.Object with
// the values of the indexers ix, and with apiVersion and kind (those of gvk where the apiserver
// left them out). An object that came in as JSON already cut to what the cache keeps (a wire
// object read with r's cuts) is kept as it is; otherwise, and for an object the decoder built,
// the strip works on its maps, which are garbage from then on. It is idempotent:
// an object.Object passes through unchanged, as client-go hands a watch-list's objects, transformed as
// they streamed in, to the transform again on their way to the queue.
func ingest(r *config.Resource, ix []object.Indexer, gvk schema.GroupVersionKind) cache.TransformFunc {
	strip := NewTransform(r)
	apiVersion := gvk.GroupVersion().String()
	var scratch sync.Pool // encoding buffers: each object's JSON is kept exactly sized
	return func(obj any) (any, error) {
		var u *unstructured.Unstructured
		switch o := obj.(type) {
		case *wire:
			if o.cut {
				return object.OfJSON(o.raw, ix, o.managers), nil
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
		managers := managersOf(u)
		if _, err := strip(u); err != nil {
			return nil, err
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			u.SetAPIVersion(apiVersion)
			u.SetKind(gvk.Kind)
		}
		return object.NewIndexed(u, ix, managers, &scratch), nil
	}
}

// managersOf summarises u's managedFields (see object.ManagersOf), encoded again from the maps
// they were decoded into; nil for none.
func managersOf(u *unstructured.Unstructured) object.Managers {
	fields, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "metadata", "managedFields")
	if !ok {
		return nil
	}
	b, err := utiljson.Marshal(fields)
	if err != nil {
		return nil
	}
	return object.ManagersOf(b)
}
