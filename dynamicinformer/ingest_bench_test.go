package dynamicinformer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// BenchmarkIngest is what bringing one object into the cache costs, from its JSON as a list or a
// watch brings it: cut to what the cache keeps without decoding it (the default), or decoded
// into maps, transformed and encoded again, which a jsonPath indexer or a removeFields path
// asks for. The object is a configmap as test/bench writes them: about 4.3 KB as the apiserver
// serves it, managedFields of two field managers and kubectl's last-applied annotation included.
func BenchmarkIngest(b *testing.B) {
	raw := benchConfigMapJSON(b)
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	for _, c := range []struct{ name, indexers string }{
		{"cut-from-the-JSON", `[{name: byApp, type: label, key: app}]`},
		{"decoded-for-a-jsonPath-indexer", `[{name: byApp, type: label, key: app}, {name: byNote, type: jsonPath, path: "{.data.operator-note}"}]`},
	} {
		cfg := loadResources(b, "resources: [{version: v1, resource: configmaps, indexers: "+c.indexers+"}]\n")[0]
		r := reader{cuts: cutsOf(&cfg), typed: typeMembers("v1", "ConfigMap")}
		transform := ingest(&cfg, indexersOf(&cfg), gvk)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				w, err := r.read(raw, false)
				if err != nil {
					b.Fatal(err)
				}
				o, err := transform(w)
				if err != nil {
					b.Fatal(err)
				}
				if got := o.(*object.Object); got.GetName() != "cm-00001" || strings.Contains(string(got.JSON()), "managedFields") {
					b.Fatalf("ingested %s", got.JSON())
				}
			}
		})
	}
}

// benchConfigMapJSON is a configmap as the apiserver serves test/bench's (see applyConfigMap).
func benchConfigMapJSON(b *testing.B) []byte {
	data := map[string]any{"config.json": strings.Repeat("a1", 550), "settings.ini": strings.Repeat("b2", 200), "operator-note": strings.Repeat("c3", 100)}
	lastApplied, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "cm-00001", "namespace": "bench"}, "data": data})
	fields := func(manager string, keys ...string) map[string]any {
		f := map[string]any{}
		for _, k := range keys {
			f["f:"+k] = map[string]any{}
		}
		return map[string]any{"manager": manager, "operation": "Apply", "apiVersion": "v1", "time": "2026-11-26T10:00:00Z", "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{"f:data": f, "f:metadata": map[string]any{"f:labels": map[string]any{"f:app": map[string]any{}, "f:tier": map[string]any{}}}}}
	}
	raw, err := json.Marshal(map[string]any{
		"kind": "ConfigMap", "apiVersion": "v1",
		"metadata": map[string]any{
			"name": "cm-00001", "namespace": "bench", "uid": "6c1c7a5e-3f0e-4a57-9d8b-1f2e3d4c5b6a", "resourceVersion": "4242", "creationTimestamp": "2026-11-26T10:00:00Z",
			"labels":        map[string]any{"app": "app-01", "app.kubernetes.io/name": "app-01", "tier": "web"},
			"annotations":   map[string]any{"kubectl.kubernetes.io/last-applied-configuration": string(lastApplied), "example.com/team": "team-1"},
			"managedFields": []any{fields("deployer", "config.json", "settings.ini"), fields("operator", "operator-note")},
		},
		"data": data,
	})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}
