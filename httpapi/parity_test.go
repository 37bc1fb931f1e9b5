package httpapi

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

func TestFieldSelectorsAcceptWhatTheAPIServerAccepts(t *testing.T) {
	pods := &config.Resource{Indexers: []config.Indexer{
		{Name: "byImage", Type: config.IndexJSONPath, Path: "{.spec.containers[*].image}"},
		{Name: "byPriority", Type: config.IndexJSONPath, Path: "{.spec.priorityClassName}"},
	}}
	tests := []struct {
		name     string
		gk       schema.GroupKind
		crd      []string
		cfg      *config.Resource
		anyPath  bool
		field    string
		wantPath string // "" for a refusal
	}{
		{"a pod's node", schema.GroupKind{Kind: "Pod"}, nil, pods, false, "spec.nodeName", "spec.nodeName"},
		{"a pod's hostname is not selectable", schema.GroupKind{Kind: "Pod"}, nil, pods, false, "spec.hostname", ""},
		{"a simple jsonPath indexer's path is", schema.GroupKind{Kind: "Pod"}, nil, pods, false, "spec.priorityClassName", "spec.priorityClassName"},
		{"a wildcard indexer's path is not", schema.GroupKind{Kind: "Pod"}, nil, pods, false, "spec.containers.image", ""},
		{"a configmap's name", schema.GroupKind{Kind: "ConfigMap"}, nil, &config.Resource{}, false, "metadata.name", "metadata.name"},
		{"a configmap's data", schema.GroupKind{Kind: "ConfigMap"}, nil, &config.Resource{}, false, "data.key", ""},
		{"a node has no namespace to select on", schema.GroupKind{Kind: "Node"}, nil, &config.Resource{}, false, "metadata.namespace", ""},
		{"a core event's source is its component", schema.GroupKind{Kind: "Event"}, nil, &config.Resource{}, false, "source", "source.component"},
		{"an events.k8s.io event's regarding", schema.GroupKind{Group: "events.k8s.io", Kind: "Event"}, nil, &config.Resource{}, false, "regarding.name", "regarding.name"},
		{"a CRD's selectable field", schema.GroupKind{Group: "example.com", Kind: "Gizmo"}, []string{"spec.color"}, &config.Resource{}, false, "spec.color", "spec.color"},
		{"a CRD's other field", schema.GroupKind{Group: "example.com", Kind: "Gizmo"}, []string{"spec.color"}, &config.Resource{}, false, "spec.size", ""},
		{"any path when opted in", schema.GroupKind{Kind: "ConfigMap"}, nil, &config.Resource{}, true, "data.key", "data.key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, err := selectableFields(tt.gk, tt.crd, tt.cfg, tt.anyPath).path(tt.field)
			switch {
			case tt.wantPath == "" && err == nil:
				t.Fatalf("%s accepted as %v; the apiserver refuses it", tt.field, path)
			case tt.wantPath == "" && (err.ErrStatus.Code != 400 || !strings.Contains(err.Error(), "field label not supported: "+tt.field)):
				t.Fatalf("refusal %v; want a 400 naming %s", err, tt.field)
			case tt.wantPath != "" && (err != nil || strings.Join(path, ".") != tt.wantPath):
				t.Fatalf("%s = %v, %v; want path %s", tt.field, path, err, tt.wantPath)
			}
		})
	}
}

// openAPIv2 is a small document in the shape of the apiserver's /openapi/v2.
const openAPIv2 = `{
  "swagger": "2.0",
  "paths": {
    "/api/v1/configmaps": {"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMapList"}}}}},
    "/api/v1/namespaces/{namespace}/configmaps/{name}": {
      "parameters": [{"name": "name", "in": "path"}],
      "get": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMap"}}}},
      "delete": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Status"}}}}
    },
    "/api/v1/watch/namespaces/{namespace}/configmaps": {"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent"}}}}},
    "/api/v1/namespaces/{namespace}/pods/{name}/log": {"get": {"responses": {"200": {"schema": {"type": "string"}}}}},
    "/api/v1/namespaces/{namespace}/secrets": {"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.api.core.v1.SecretList"}}}}},
    "/apis/apps/v1/namespaces/{namespace}/deployments/{name}": {"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"}}}}}
  },
  "definitions": {
    "io.k8s.api.core.v1.ConfigMap": {"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
      "properties": {"metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}}},
    "io.k8s.api.core.v1.ConfigMapList": {"properties": {"items": {"items": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMap"}}}},
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"properties": {"managedFields": {"items": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry"}}}},
    "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry": {},
    "io.k8s.apimachinery.pkg.apis.meta.v1.Status": {},
    "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent": {},
    "io.k8s.api.core.v1.Secret": {"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Secret"}]},
    "io.k8s.api.core.v1.SecretList": {},
    "io.k8s.api.apps.v1.Deployment": {"x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Deployment"}]}
  }
}`

func TestOpenAPIIsCutToTheServedReads(t *testing.T) {
	served := map[schema.GroupVersion][]metav1.APIResource{
		{Version: "v1"}: {{Name: "configmaps", Kind: "ConfigMap", Namespaced: true}},
	}
	cut, err := cutJSON([]byte(openAPIv2), served, []string{"definitions"}, "#/definitions/")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(cut, &doc); err != nil {
		t.Fatal(err)
	}

	var paths, ops, defs []string
	for p, item := range doc["paths"].(map[string]any) {
		paths = append(paths, p)
		for op := range item.(map[string]any) {
			ops = append(ops, p+" "+op)
		}
	}
	for d := range doc["definitions"].(map[string]any) {
		defs = append(defs, d)
	}
	slices.Sort(paths)
	slices.Sort(ops)
	slices.Sort(defs)
	if want := []string{"/api/v1/configmaps", "/api/v1/namespaces/{namespace}/configmaps/{name}"}; !slices.Equal(paths, want) {
		t.Errorf("paths %v; want %v (no watch paths, subresources or unserved resources)", paths, want)
	}
	if want := []string{"/api/v1/configmaps get", "/api/v1/namespaces/{namespace}/configmaps/{name} get", "/api/v1/namespaces/{namespace}/configmaps/{name} parameters"}; !slices.Equal(ops, want) {
		t.Errorf("operations %v; want %v (reads only)", ops, want)
	}
	if want := []string{"io.k8s.api.core.v1.ConfigMap", "io.k8s.api.core.v1.ConfigMapList", "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}; !slices.Equal(defs, want) {
		t.Errorf("definitions %v; want %v (what the served kind and paths reach)", defs, want)
	}
}

// BenchmarkTableRow is the cost of one table row per kind: the typed conversion and cells.
func BenchmarkTableRow(b *testing.B) {
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "web-0", "namespace": "a", "creationTimestamp": "2026-11-22T10:00:00Z", "labels": map[string]any{"app": "web"}},
		"spec":     map[string]any{"nodeName": "n1", "containers": []any{map[string]any{"name": "app", "image": "nginx:1.27"}, map[string]any{"name": "log", "image": "fluent-bit:3"}}},
		"status": map[string]any{"phase": "Running", "podIPs": []any{map[string]any{"ip": "10.0.0.5"}},
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
			"containerStatuses": []any{
				map[string]any{"name": "app", "ready": true, "restartCount": int64(2), "state": map[string]any{"running": map[string]any{"startedAt": "2026-11-22T10:00:05Z"}},
					"lastState": map[string]any{"terminated": map[string]any{"exitCode": int64(1), "finishedAt": "2026-11-22T10:00:04Z"}}},
				map[string]any{"name": "log", "ready": true, "state": map[string]any{"running": map[string]any{}}},
			}}}
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "settings", "namespace": "a", "creationTimestamp": "2026-11-22T10:00:00Z"},
		"data":     map[string]any{"a": "1", "b": "2"}}
	for _, bb := range []struct {
		name string
		gk   schema.GroupKind
		obj  map[string]any
	}{{"pod", schema.GroupKind{Kind: "Pod"}, pod}, {"configmap", schema.GroupKind{Kind: "ConfigMap"}, cm}, {"name and age", schema.GroupKind{Kind: "Lease"}, cm}} {
		p := printerFor(bb.gk, crdView{})
		u := object.New(&unstructured.Unstructured{Object: bb.obj})
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if cells, _ := p.cells(u); cells[0] == nil {
					b.Fatal("no name")
				}
			}
		})
	}
}
