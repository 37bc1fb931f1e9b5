package dynamicinformer

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
)

// NewIndexers returns the cache indexers of a configured resource: the namespace index, which
// every cache has, and one index per configured indexer.
func NewIndexers(r *config.Resource) cache.Indexers {
	indexers := cache.Indexers{config.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for i := range r.Indexers {
		indexers[r.Indexers[i].Name] = indexFunc(&r.Indexers[i])
	}
	return indexers
}

// configuredIndexers are the resource's configured indexers, without the namespace index.
func configuredIndexers(r *config.Resource) cache.Indexers {
	indexers := NewIndexers(r)
	delete(indexers, config.NamespaceIndex)
	return indexers
}

// OwnerKey is the owner index value for an owner reference of the given kind and name; an
// owner is also indexed by its uid.
func OwnerKey(kind, name string) string { return kind + "/" + name }

func indexFunc(ix *config.Indexer) cache.IndexFunc {
	var values func(u *unstructured.Unstructured) ([]string, error)
	switch ix.Type {
	case config.IndexLabel:
		values = func(u *unstructured.Unstructured) ([]string, error) {
			return mapValue(u.GetLabels(), ix.Key), nil
		}
	case config.IndexAnnotation:
		values = func(u *unstructured.Unstructured) ([]string, error) {
			return mapValue(u.GetAnnotations(), ix.Key), nil
		}
	case config.IndexJSONPath:
		values = func(u *unstructured.Unstructured) ([]string, error) {
			return ix.JSONPath.Values(u.Object)
		}
	case config.IndexOwner:
		values = func(u *unstructured.Unstructured) ([]string, error) {
			refs := u.GetOwnerReferences()
			keys := make([]string, 0, 2*len(refs))
			for _, ref := range refs {
				keys = append(keys, OwnerKey(ref.Kind, ref.Name), string(ref.UID))
			}
			return keys, nil
		}
	}
	return func(obj any) ([]string, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("index %s: unexpected object type %T", ix.Name, obj)
		}
		return values(u)
	}
}

func mapValue(m map[string]string, key string) []string {
	if v, ok := m[key]; ok {
		return []string{v}
	}
	return nil
}
