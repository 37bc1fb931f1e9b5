package dynamicinformer

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestIndexersComputeTheValuesOfEachObject runs the indexers indexersOf builds from a
// configuration on objects directly (their values sorted, without repeats); TestIndexersReturnTheRightObjects looks them up through a
// cache of the test bed's objects.
func TestIndexersComputeTheValuesOfEachObject(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(`
resources:
  - version: v1
    resource: pods
    indexers:
      - {name: byApp, type: label, key: app}
      - {name: byTeam, type: annotation, key: example.com/team}
      - {name: byImage, type: jsonPath, path: "{.spec.containers[*].image}"}
      - {name: byOwner, type: owner}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	indexers := map[string]object.Indexer{}
	for _, ix := range indexersOf(loadResource(t, path)) {
		indexers[ix.Name] = ix
	}
	pod := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{
			"namespace":   "shop",
			"name":        "web-1",
			"labels":      map[string]any{"app": "web"},
			"annotations": map[string]any{"example.com/team": "storefront"},
			"ownerReferences": []any{
				map[string]any{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u-rs"},
				map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "settings", "uid": "u-cm"},
			},
		},
		"spec": map[string]any{"containers": []any{
			map[string]any{"name": "app", "image": "nginx:1.27"},
			map[string]any{"name": "proxy", "image": "envoy:1.30"},
		}},
	}}
	bare := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bare"}}}
	for _, tt := range []struct {
		name  string
		index string
		obj   *unstructured.Unstructured
		want  []string
	}{
		{"a label indexer gives the label's value", "byApp", pod, []string{"web"}},
		{"an annotation indexer gives the annotation's value", "byTeam", pod, []string{"storefront"}},
		{"a jsonPath indexer gives every value the path matches", "byImage", pod, []string{"envoy:1.30", "nginx:1.27"}},
		{"an owner indexer gives each owner's kind/name and uid", "byOwner", pod, []string{OwnerKey("ConfigMap", "settings"), OwnerKey("ReplicaSet", "web"), "u-cm", "u-rs"}},
		{"an object without the label has no value", "byApp", bare, nil},
		{"an object without the annotation has no value", "byTeam", bare, nil},
		{"an object without owners has no owner value", "byOwner", bare, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ix, ok := indexers[tt.index]
			if !ok {
				t.Fatalf("no index %s among %v", tt.index, slices.Sorted(maps.Keys(indexers)))
			}
			if got := ix.Values(tt.obj); !slices.Equal(got, tt.want) {
				t.Errorf("%s of %s = %q, want %q", tt.index, tt.obj.GetName(), got, tt.want)
			}
		})
	}
}
