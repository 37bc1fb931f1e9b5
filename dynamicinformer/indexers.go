package dynamicinformer

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/config"
)

// indexer is one configured indexer: its name, and the values it gives an object, computed
// once as the object comes in (see Object).
type indexer struct {
	name   string
	values func(u *unstructured.Unstructured) []string
}

// indexersOf are r's configured indexers, by name: the order of an Object's values and of the
// store's indexes. The namespace index, which every cache has, is the store's order itself.
func indexersOf(r *config.Resource) []indexer {
	out := make([]indexer, 0, len(r.Indexers))
	for i := range r.Indexers {
		ix := &r.Indexers[i]
		f := indexFunc(ix)
		out = append(out, indexer{name: ix.Name, values: func(u *unstructured.Unstructured) []string {
			vs, err := f(u)
			if err != nil {
				return nil // an object the index function fails on is in none of its values
			}
			slices.Sort(vs)
			return slices.Compact(vs)
		}})
	}
	slices.SortFunc(out, func(a, b indexer) int { return strings.Compare(a.name, b.name) })
	return out
}

// OwnerKey is the owner index value for an owner reference of the given kind and name; an
// owner is also indexed by its uid.
func OwnerKey(kind, name string) string { return kind + "/" + name }

func indexFunc(ix *config.Indexer) func(u *unstructured.Unstructured) ([]string, error) {
	switch ix.Type {
	case config.IndexLabel:
		return func(u *unstructured.Unstructured) ([]string, error) {
			return mapValue(u.GetLabels(), ix.Key), nil
		}
	case config.IndexAnnotation:
		return func(u *unstructured.Unstructured) ([]string, error) {
			return mapValue(u.GetAnnotations(), ix.Key), nil
		}
	case config.IndexJSONPath:
		return func(u *unstructured.Unstructured) ([]string, error) {
			return ix.JSONPath.Values(u.Object)
		}
	default: // config.IndexOwner; the configuration admits no other type
		return func(u *unstructured.Unstructured) ([]string, error) {
			refs := u.GetOwnerReferences()
			keys := make([]string, 0, 2*len(refs))
			for _, ref := range refs {
				keys = append(keys, OwnerKey(ref.Kind, ref.Name), string(ref.UID))
			}
			return keys, nil
		}
	}
}

func mapValue(m map[string]string, key string) []string {
	if v, ok := m[key]; ok {
		return []string{v}
	}
	return nil
}
