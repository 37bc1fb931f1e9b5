package delivery

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// BenchmarkFilter is what a sink's CEL filter costs per event: read lazily from the JSON the
// cache keeps (what a sink does: only what the expression names is decoded), against the way
// before, decoding the object and the old object whole into maps first, and against running
// the program alone on maps already decoded (what a cache of maps paid). The objects are as
// the benchmark's (test/bench) are cached: a configmap of about 2 KB, a pod of about 4 KB with
// three containers and its status; the event is a MODIFIED. Issue 51's target: 10 µs for the pod.
func BenchmarkFilter(b *testing.B) {
	const filter = `object.metadata.labels["app"] == "web" && (oldObject == null || object.metadata.resourceVersion != oldObject.metadata.resourceVersion)`
	d := run(b, "  - {name: f, url: \"http://127.0.0.1:1/\", filter: '"+filter+"'}\n") // nothing is queued: no request is made
	sink := d.current()[0]
	program := sink.cfg().Program
	for _, u := range []*unstructured.Unstructured{benchConfigMap(), benchPod()} {
		old := u.DeepCopy()
		u.SetResourceVersion("2")
		old.SetResourceVersion("1")
		e := object.Event{Type: object.Modified, Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Object: object.New(u), OldObject: object.New(old)}
		name := fmt.Sprintf("%s-%dB", u.GetKind(), len(e.Object.JSON()))
		b.Run(name+"/read-lazily-from-the-cache's-JSON", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := sink.Selects(e); !ok || err != nil {
					b.Fatalf("selected %t, %v; want true", ok, err)
				}
			}
		})
		b.Run(name+"/decoded-whole-from-the-cache's-JSON", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := evaluateDecoded(program, e); !ok || err != nil {
					b.Fatalf("selected %t, %v; want true", ok, err)
				}
			}
		})
		b.Run(name+"/on-maps-already-decoded", func(b *testing.B) {
			vars := map[string]any{"type": string(e.Type), "object": u.Object, "oldObject": old.Object,
				"resource": map[string]string{"group": "", "version": "v1", "resource": "configmaps"}}
			b.ReportAllocs()
			for b.Loop() {
				out, _, err := program.Eval(vars)
				if err != nil || out.Value() != true {
					b.Fatalf("the filter gave %v, %v; want true", out, err)
				}
			}
		})
	}
}

// benchConfigMap is a configmap as test/bench's are cached: managedFields and the last-applied
// annotation stripped, three data keys of hex, three labels and an annotation.
func benchConfigMap() *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"data": map[string]any{"config.json": strings.Repeat("a1", 550), "settings.ini": strings.Repeat("b2", 200), "operator-note": strings.Repeat("c3", 100)},
	}}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace("bench")
	u.SetName("cm-00001")
	u.SetUID("6c1c7a5e-3f0e-4a57-9d8b-1f2e3d4c5b6a")
	u.SetLabels(map[string]string{"app": "web", "app.kubernetes.io/name": "web", "tier": "web"})
	u.SetAnnotations(map[string]string{"example.com/team": "team-1"})
	return u
}

// benchPod is a running pod with three containers, their environment and resources, and its
// status: conditions and the containers' states.
func benchPod() *unstructured.Unstructured {
	var containers, statuses, conditions []any
	for i := range 3 {
		var env []any
		for j := range 10 {
			env = append(env, map[string]any{"name": fmt.Sprintf("SETTING_%d_%d", i, j), "value": strings.Repeat("v", 24)})
		}
		containers = append(containers, map[string]any{
			"name": fmt.Sprintf("c%d", i), "image": fmt.Sprintf("registry.example/team/app-%d:1.2.%d", i, i), "env": env,
			"ports":     []any{map[string]any{"containerPort": int64(8080 + i), "protocol": "TCP"}},
			"resources": map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "128Mi"}, "limits": map[string]any{"memory": "256Mi"}},
		})
		statuses = append(statuses, map[string]any{
			"name": fmt.Sprintf("c%d", i), "ready": true, "restartCount": int64(0), "image": fmt.Sprintf("registry.example/team/app-%d:1.2.%d", i, i),
			"imageID": "registry.example/team/app@sha256:" + strings.Repeat("0f", 32), "containerID": "containerd://" + strings.Repeat("ab", 32),
			"state": map[string]any{"running": map[string]any{"startedAt": "2026-11-26T10:00:00Z"}},
		})
	}
	for _, c := range []string{"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"} {
		conditions = append(conditions, map[string]any{"type": c, "status": "True", "lastTransitionTime": "2026-11-26T10:00:00Z"})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec":   map[string]any{"containers": containers, "nodeName": "node-1", "restartPolicy": "Always", "serviceAccountName": "default"},
		"status": map[string]any{"phase": "Running", "conditions": conditions, "containerStatuses": statuses, "podIP": "10.0.0.12", "hostIP": "192.168.0.3", "qosClass": "Burstable"},
	}}
	u.SetAPIVersion("v1")
	u.SetKind("Pod")
	u.SetNamespace("bench")
	u.SetName("pod-00001")
	u.SetUID("0d9f8e7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f")
	u.SetLabels(map[string]string{"app": "web", "pod-template-hash": "5d8f7c9b0", "tier": "web"})
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f7c9b0", UID: "1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b"}})
	return u
}
