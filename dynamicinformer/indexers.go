package dynamicinformer

import (
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// indexersOf are r's configured indexers, by name: the order of an object.Object's values and of the
// store's indexes. The namespace index, which every cache has, is the store's order itself.
func indexersOf(r *config.Resource) []object.Indexer {
	out := make([]object.Indexer, 0, len(r.Indexers))
	for i := range r.Indexers {
		ix := &r.Indexers[i]
		f := indexFunc(ix)
		x := object.Indexer{Name: ix.Name, Values: func(u *unstructured.Unstructured) []string {
			vs, err := f(u)
			if err != nil {
				return nil // an object the index function fails on is in none of its values
			}
			slices.Sort(vs)
			return slices.Compact(vs)
		}}
		if g := jsonIndexFunc(ix); g != nil {
			x.FromJSON = func(meta gjson.Result, json []byte, labels object.LabelPairs) []string {
				vs := g(meta, json, labels)
				slices.Sort(vs)
				return slices.Compact(vs)
			}
		}
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b object.Indexer) int { return strings.Compare(a.Name, b.Name) })
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

// jsonIndexFunc is indexFunc's function read from an object's metadata, meta, read from its
// JSON, json, and its labels; nil for a jsonPath indexer.
func jsonIndexFunc(ix *config.Indexer) func(meta gjson.Result, json []byte, labels object.LabelPairs) []string {
	switch ix.Type {
	case config.IndexLabel:
		return func(_ gjson.Result, _ []byte, labels object.LabelPairs) []string {
			if v, ok := labels.Lookup(ix.Key); ok {
				return []string{v}
			}
			return nil
		}
	case config.IndexAnnotation:
		return func(meta gjson.Result, json []byte, _ object.LabelPairs) []string {
			a := field(meta, "annotations")
			if !a.IsObject() || a.Index == 0 {
				return nil
			}
			// Read without gjson's ForEach, which would unescape every value (the last-applied
			// one where it is kept) to find one.
			var buf [16]object.Member
			ms := object.Members(json, a.Index, buf[:0])
			i := object.FindMember(json, ms, ix.Key)
			if i < 0 || json[ms[i].Value] != '"' {
				return nil
			}
			return []string{gjson.Parse(docOf(json[ms[i].Value:ms[i].End])).Str}
		}
	case config.IndexOwner:
		return func(meta gjson.Result, _ []byte, _ object.LabelPairs) []string {
			var keys []string
			field(meta, "ownerReferences").ForEach(func(_, ref gjson.Result) bool {
				var kind, name, uid string
				ref.ForEach(func(k, v gjson.Result) bool {
					switch k.Str {
					case "kind":
						kind = v.Str
					case "name":
						name = v.Str
					case "uid":
						uid = v.Str
					}
					return true
				})
				keys = append(keys, OwnerKey(kind, name), uid)
				return true
			})
			return keys
		}
	default:
		return nil
	}
}

// field is the member of obj named key, read without gjson's path syntax (a key may hold dots).
func field(obj gjson.Result, key string) gjson.Result {
	var out gjson.Result
	obj.ForEach(func(k, v gjson.Result) bool {
		if k.Str == key {
			out = v
			return false
		}
		return true
	})
	return out
}

func mapValue(m map[string]string, key string) []string {
	if v, ok := m[key]; ok {
		return []string{v}
	}
	return nil
}
