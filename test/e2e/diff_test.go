package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestEveryDiffTurnsTheOldObjectIntoTheNewOne makes 1,000 random updates of 20 configmaps
// (data keys set and removed, labels set and removed, annotations) and checks every MODIFIED
// event of two sinks, one with JSON Patches and one with merge patches beside both objects:
// the patch applied to oldObject gives object, exactly. A third sink takes merge patches alone
// and must receive no objects with them.
func TestEveryDiffTurnsTheOldObjectIntoTheNewOne(t *testing.T) {
	t.Parallel()
	const objects, updates = 20, 1000
	ns := namespace(t)
	sinks := map[string]*receiver{"json": newReceiver(t, nil, false), "merge": newReceiver(t, nil, false), "alone": newReceiver(t, nil, false)}
	startWithWebhooks(t, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks:
  - {name: json, url: "%s", workers: 8, payload: {diff: jsonPatch}}
  - {name: merge, url: "%s", workers: 8, payload: {diff: mergePatch, object: full}}
  - {name: alone, url: "%s", workers: 8, payload: {diff: mergePatch, object: none}}
`, ns, sinks["json"].URL, sinks["merge"].URL, sinks["alone"].URL))

	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for i := range objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("d-%02d", i), Labels: map[string]string{"app": "a"}}, Data: map[string]string{"k0": "v"}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rv := map[string]string{} // each object's resourceVersion
	list := func() []corev1.ConfigMap {
		l, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	for _, cm := range list() {
		rv[cm.Name] = cm.ResourceVersion
	}
	changes := 0 // updates that changed something: the apiserver makes no event of the others
	r := rand.New(rand.NewPCG(28, 3))
	value := func() any { // a new value, or null: the member is removed
		if r.IntN(4) == 0 {
			return nil
		}
		return fmt.Sprintf("v%d", r.IntN(1000))
	}
	for range updates {
		patch := map[string]any{}
		switch r.IntN(3) {
		case 0:
			patch["data"] = map[string]any{fmt.Sprintf("k%d", r.IntN(5)): value(), fmt.Sprintf("k%d", r.IntN(5)): value()}
		case 1:
			patch["metadata"] = map[string]any{"labels": map[string]any{fmt.Sprintf("l%d", r.IntN(3)): value()}}
		default:
			patch["metadata"] = map[string]any{"annotations": map[string]any{"example.com/note": value()}}
			patch["data"] = map[string]any{"k9": fmt.Sprint(r.Int64())}
		}
		b, _ := json.Marshal(patch)
		name := fmt.Sprintf("d-%02d", r.IntN(objects))
		cm, err := cs.CoreV1().ConfigMaps(ns).Patch(t.Context(), name, types.MergePatchType, b, metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.ResourceVersion != rv[name] {
			rv[name] = cm.ResourceVersion
			changes++
		}
	}
	t.Logf("%d of %d updates changed their object", changes, updates)
	// Each sink receives every change: wait for each object's last, by its event id.
	for name, rc := range sinks {
		testbed.Eventually(t, 2*time.Minute, func() error {
			ids := map[string]bool{}
			for _, req := range rc.got() {
				ids[req.ceID] = true
			}
			for _, cm := range list() {
				id := fmt.Sprintf("%s.%s.", cm.UID, cm.ResourceVersion)
				if !ids[id+"modified"] && !ids[id+"added"] {
					return fmt.Errorf("%s has not received %s", name, id+"modified")
				}
			}
			return nil
		})
		got := rc.got()
		modified := 0
		for _, req := range got {
			var ev struct {
				Type                     string
				Object, OldObject, Patch json.RawMessage
				PatchType                string
				OldResourceVersion       string
			}
			if err := json.Unmarshal(req.body, &ev); err != nil {
				t.Fatalf("%s: %v: %s", name, err, req.body)
			}
			if ev.Type != "MODIFIED" {
				continue
			}
			modified++
			if name == "alone" {
				if ev.Object != nil || ev.OldObject != nil || ev.PatchType != "application/merge-patch+json" || ev.Patch == nil || ev.OldResourceVersion == "" {
					t.Fatalf("alone: a MODIFIED event with objects, or without its patch or base: %s", req.body)
				}
				continue
			}
			if rv, _, _ := unstructured.NestedString(decodeObject(t, ev.OldObject), "metadata", "resourceVersion"); rv != ev.OldResourceVersion {
				t.Fatalf("%s: oldResourceVersion %q, oldObject's %q", name, ev.OldResourceVersion, rv)
			}
			var patched []byte
			var err error
			if name == "json" {
				var p jsonpatch.Patch
				if p, err = jsonpatch.DecodePatch(ev.Patch); err == nil {
					patched, err = p.Apply(ev.OldObject)
				}
			} else {
				patched, err = jsonpatch.MergePatch(ev.OldObject, ev.Patch)
			}
			if err != nil {
				t.Fatalf("%s: apply %s: %v", name, ev.Patch, err)
			}
			if !sameJSON(t, patched, ev.Object) {
				t.Fatalf("%s: oldObject %s\npatched with %s\ngives %s\nwant %s", name, ev.OldObject, ev.Patch, patched, ev.Object)
			}
		}
		if modified != changes {
			t.Errorf("%s received %d MODIFIED events, want %d", name, modified, changes)
		}
	}
}

func decodeObject(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// sameJSON reports whether a and b are the same JSON value, numbers compared as written.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	for _, x := range []struct {
		b []byte
		v *any
	}{{a, &va}, {b, &vb}} {
		dec := json.NewDecoder(bytes.NewReader(x.b))
		dec.UseNumber()
		if err := dec.Decode(x.v); err != nil {
			t.Fatalf("%v: %s", err, x.b)
		}
	}
	return reflect.DeepEqual(va, vb)
}
