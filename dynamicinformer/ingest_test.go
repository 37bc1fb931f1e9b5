package dynamicinformer

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// TestAnObjectComesInAsItsTransformedJSONAndAHeader: the informers' transform strips the
// object, keeps it as its JSON (apiVersion and kind filled in where the apiserver left them
// out) with a header and its indexers' values, and passes an object.Object it is handed again
// through unchanged; the JSON decodes to the stripped object, and an object.Object read back from
// that JSON has the same header.
func TestAnObjectComesInAsItsTransformedJSONAndAHeader(t *testing.T) {
	cfg := loadResources(t, `
resources:
  - version: v1
    resource: configmaps
    transform: {removeFields: [data.password]}
    indexers: [{name: byTeam, type: annotation, key: team}, {name: byApp, type: label, key: app}]
`)[0]
	in := func() *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{
				"namespace": "shop", "name": "settings", "uid": "u-1", "resourceVersion": "42",
				"labels":        map[string]any{"app": "web", "note": "a<b"},
				"annotations":   map[string]any{"team": "storefront", LastAppliedAnnotation: `{"data":{"password":"p"}}`},
				"managedFields": []any{map[string]any{"manager": "kubectl"}},
			},
			"data": map[string]any{"password": "p", "user": "u", "n": "<&>"},
		}}
	}
	ingested, err := ingest(&cfg, indexersOf(&cfg), schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})(in())
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ingested.(*object.Object)
	if !ok {
		t.Fatalf("ingested as %T, want *object.Object", ingested)
	}
	want := in()
	_, _ = NewTransform(&cfg)(want)
	want.SetAPIVersion("v1")
	want.SetKind("ConfigMap")
	if wantJSON, _ := json.Marshal(want.Object); string(o.JSON()) != string(wantJSON) {
		t.Errorf("JSON = %s\nwant %s (the stripped object as encoding/json writes it)", o.JSON(), wantJSON)
	}
	if o.GetNamespace() != "shop" || o.GetName() != "settings" || o.GetUID() != types.UID("u-1") || o.GetResourceVersion() != "42" || o.Labels().Get("app") != "web" || o.Labels().Has("team") {
		t.Errorf("header = %+v", o.GetObjectMeta())
	}
	if o.Labels().Get("note") != "a<b" {
		t.Errorf("label note = %q, want a<b (escaped in the JSON, so kept as a copy)", o.Labels().Get("note"))
	}
	// The header's strings that the JSON holds verbatim are read from it: they cost no memory
	// of their own, and keep nothing of the decoder's.
	start := uintptr(unsafe.Pointer(unsafe.SliceData(o.JSON())))
	var key, value string
	for k, v := range o.GetObjectMeta().GetLabels() {
		if k == "app" {
			key, value = k, v
		}
	}
	for _, s := range []string{o.GetNamespace(), o.GetName(), string(o.GetUID()), o.GetResourceVersion(), key, value, o.IndexValue(0, 0), o.IndexValue(1, 0)} {
		if p := uintptr(unsafe.Pointer(unsafe.StringData(s))); p < start || p >= start+uintptr(len(o.JSON())) {
			t.Errorf("header string %q is not read from the object's JSON", s)
		}
	}
	// By name: byApp, then byTeam.
	if got := valuesOf(o); !slices.EqualFunc(got, [][]string{{"web"}, {"storefront"}}, slices.Equal) {
		t.Errorf("indexer values = %q, want [[web] [storefront]]", got)
	}
	if again, _ := ingest(&cfg, indexersOf(&cfg), schema.GroupVersionKind{})(o); again != o {
		t.Errorf("an object.Object ingested again came out as %v, want it unchanged", again)
	}
	u, err := o.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["data"].(map[string]any)["password"]; ok || u.GetManagedFields() != nil || u.GetKind() != "ConfigMap" {
		t.Errorf("decoded = %v, want the stripped object with its kind", u.Object)
	}
	back, err := object.FromJSON(o.JSON())
	if err != nil {
		t.Fatal(err)
	}
	if back.GetNamespace() != o.GetNamespace() || back.GetName() != o.GetName() || back.GetUID() != o.GetUID() ||
		back.GetResourceVersion() != o.GetResourceVersion() || back.Labels().Get("app") != "web" || string(back.JSON()) != string(o.JSON()) {
		t.Errorf("read back from its JSON: %+v, want the header of %+v", back.GetObjectMeta(), o.GetObjectMeta())
	}
	if _, err := object.FromJSON([]byte(`{"metadata":`)); err == nil {
		t.Errorf("ObjectFromJSON took truncated JSON without an error")
	}
}

// TestAnObjectKeepsLittleBesideItsJSON: what an object.Object keeps besides its JSON, for a
// configmap with three labels and three indexers, is its header packed in one allocation:
// 151 bytes with the object.Object itself. The header as strings and slices (four strings and three
// slices in the object.Object, an array of label strings, one slice of values per indexer) kept 343.
func TestAnObjectKeepsLittleBesideItsJSON(t *testing.T) {
	cfg := loadResources(t, `
resources:
  - version: v1
    resource: configmaps
    indexers: [{name: byApp, type: label, key: app}, {name: byTier, type: label, key: tier}, {name: byTeam, type: annotation, key: team}]
`)[0]
	ix := indexersOf(&cfg)
	const n = 10000
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings-%05d","namespace":"shop","uid":"0b7c4d2e-5f6a-4b8c-9d0e-1f2a3b4c%04d","resourceVersion":"%d","labels":{"app":"web","tier":"front","version":"v%d"},"annotations":{"team":"storefront"}},"data":{"user":"u"}}`, i, i, 1000+i, i%7)
	}
	objs := make([]*object.Object, n)
	perObject := keptPer(n, func() {
		for i, b := range docs {
			objs[i] = object.OfJSON(b, ix, nil)
		}
	})
	t.Logf("an object.Object keeps %d bytes besides its JSON", perObject)
	if perObject > 256 {
		t.Errorf("an object.Object keeps %d bytes besides its JSON; want at most 256", perObject)
	}
	if o := objs[n-1]; o.GetName() != "settings-09999" || o.Labels().Get("version") != "v3" || !slices.Equal(valuesOf(o)[1], []string{"storefront"}) {
		t.Errorf("the last object's header: %+v, values %q", o.GetObjectMeta(), valuesOf(o))
	}
	runtime.KeepAlive(objs)
}
