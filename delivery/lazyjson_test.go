package delivery

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// evaluateDecoded is how a filter ran before it read the JSON lazily: on both objects decoded
// whole into maps. What a filter decides must not depend on which way it reads.
func evaluateDecoded(p cel.Program, e object.Event) (bool, error) {
	obj, err := e.Object.Decode()
	if err != nil {
		return false, err
	}
	vars := map[string]any{"type": string(e.Type), "object": obj.Object, "oldObject": nil,
		"resource": map[string]string{"group": e.Resource.Group, "version": e.Resource.Version, "resource": e.Resource.Resource}}
	if e.OldObject != nil {
		old, err := e.OldObject.Decode()
		if err != nil {
			return false, err
		}
		vars["oldObject"] = old.Object
	}
	return decision(p.Eval(vars))
}

// TestAFilterDecidesOnTheJSONAsOnTheDecodedObject: every kind of expression a filter may hold
// (keys, presence, missing keys and indexes, sizes, membership, iteration, macros, equality of
// maps and lists, numbers of both kinds, types, null) decides the same, with the same error,
// on the JSON read lazily as on the objects decoded whole, for a configmap and a pod, as a
// MODIFIED (oldObject set) and an ADDED (oldObject null) event, and on a configmap of 1,000
// keys with filters that look keys up inside an iteration over them. (That a lookup does not
// scan again is held by test/e2e's TestOneTenantsBigObjectHoldsUpNoOneElse and
// TestAFilterThatCannotDecideLosesNothingSilently, on 40,000 and 1,000 keys, which a scan per
// lookup made run for minutes.)
func TestAFilterDecidesOnTheJSONAsOnTheDecodedObject(t *testing.T) {
	filters := []string{
		`object.metadata.labels["app"] == "web"`,
		`has(object.data) && has(object.metadata.annotations)`,
		`has(object.spec) || !has(object.metadata.finalizers)`,
		`has(object.spec.containers) && !has(object.spec.hostNetwork)`,
		`object.metadata.labels.missing == "x"`,
		`object.metadata.nope.x == 1`,
		`size(object.metadata.labels) == 3 && object.metadata.labels.size() > 0`,
		`"app" in object.metadata.labels && !("nope" in object.metadata.labels)`,
		`object.kind == "Pod" && object.spec.containers[0].name == "c0"`,
		`object.kind == "Pod" && object.spec.containers[9].name == "x"`,
		`object.kind == "Pod" && object.spec.containers.exists(c, c.image.startsWith("registry.example"))`,
		`object.kind == "Pod" && object.spec.containers.all(c, size(c.env) == 10)`,
		`object.kind == "Pod" && object.spec.containers.map(c, c.name) == ["c0", "c1", "c2"]`,
		`object.kind == "Pod" && "c1" in object.spec.containers.map(c, c.name)`,
		`object.kind == "Pod" && object.status.containerStatuses[0].restartCount == 0`,
		`object.kind == "Pod" && object.status.containerStatuses[0].restartCount < 1.5`,
		`object.kind == "Pod" && object.spec.containers[1].ports[0].containerPort == 8081`,
		`object.kind == "Pod" && object.spec.containers[0].ports == [{"containerPort": 8080, "protocol": "TCP"}]`,
		`object.kind == "Pod" && object.status.containerStatuses[0].ready`,
		`object.metadata.labels == oldObject.metadata.labels`,
		`object == oldObject`,
		`type(object.metadata) == map && type(object.metadata.name) == string`,
		`oldObject == null || object.metadata.resourceVersion != oldObject.metadata.resourceVersion`,
		`object.metadata.labels.filter(k, k.startsWith("app")).size() >= 1`,
		`object.metadata.name + "x" == "cm-00001x"`,
		`object.metadata.labels["tier"] in ["web", "db"]`,
		`object.metadata.labels.all(k, object.metadata.labels[k] != "")`,
		`object.metadata.annotations`,
		`has(object.metadata.ownerReferences) && object.metadata.ownerReferences[0].kind == "ReplicaSet"`,
		`type == "MODIFIED" && resource.resource == "configmaps"`,
		// Lookups inside an iteration over the keys, as test/e2e's tenants' filters make: on
		// the configmap of 1,000 keys, the pairwise one passes its cost limit.
		`object.data.all(k, size(k) < 64 && size(object.data[k]) < 64)`,
		`type != "MODIFIED" || object.data.exists(k, !(k in oldObject.data) || oldObject.data[k] != object.data[k])`,
		`object.data.all(a, object.data.all(b, a == b || object.data[a] != object.data[b]))`,
		`has(object.spec) && object.spec.containers.all(c, object.spec.containers[0].name <= c.name)`,
	}
	var yaml strings.Builder
	yaml.WriteString("resources: [{version: v1, resource: configmaps}]\nwebhooks:\n")
	for i, f := range filters {
		fmt.Fprintf(&yaml, "  - {name: f%d, url: \"http://127.0.0.1:1/\", filter: '%s'}\n", i, strings.ReplaceAll(f, "'", "''"))
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	many := benchConfigMap()
	data := map[string]any{}
	for i := range 1000 {
		data[fmt.Sprintf("key-%04d", i)] = fmt.Sprintf("value-%d", i)
	}
	many.Object["data"] = data
	var events []object.Event
	for _, u := range []*unstructured.Unstructured{benchConfigMap(), benchPod(), many} {
		old := u.DeepCopy()
		u.SetResourceVersion("2")
		old.SetResourceVersion("1")
		res := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
		events = append(events,
			object.Event{Type: object.Modified, Resource: res, Object: object.New(u), OldObject: object.New(old)},
			object.Event{Type: object.Added, Resource: res, Object: object.New(u)})
	}
	decided := map[string]int{}
	for i, sc := range cfg.Sinks() {
		p := sc.Shared().Program
		for _, e := range events {
			lazy, lazyErr := evaluate(p, e)
			whole, wholeErr := evaluateDecoded(p, e)
			what := fmt.Sprintf("%s on a %s %s", filters[i], e.Object.GetName(), e.Type)
			if lazy != whole || fmt.Sprint(lazyErr) != fmt.Sprint(wholeErr) {
				t.Errorf("%s: read lazily %t, %v; decoded whole %t, %v", what, lazy, lazyErr, whole, wholeErr)
			}
			decided[fmt.Sprint(lazy, lazyErr != nil)]++
		}
	}
	// The filters are chosen so that each outcome occurs: a test of true alone could not fail.
	for _, outcome := range []string{"true false", "false false", "false true"} {
		if decided[outcome] == 0 {
			t.Errorf("no filter decided %q (decided: %v)", outcome, decided)
		}
	}
}

// TestAMapAnswersAKeyLookedUpAgainWithoutReadingItWhole: a key looked up again is answered
// with the value found the first time, without the map reading all of its members (what made
// a filter on a 4 KB pod read the whole pod to find metadata a second time); the first
// scannedLookups distinct keys, found or not, are each scanned for, and the next indexes the map
// whole, keeping the values already given.
func TestAMapAnswersAKeyLookedUpAgainWithoutReadingItWhole(t *testing.T) {
	obj := object.New(benchPod())
	m := newJSONMap(gjson.ParseBytes(obj.JSON()))
	metadata, found := m.Find(types.String("metadata"))
	if !found {
		t.Fatal("metadata not found")
	}
	again, found := m.Find(types.String("metadata"))
	if !found || again != metadata {
		t.Fatalf("metadata looked up again: %v (found %t), not the value found first", again, found)
	}
	if m.members != nil {
		t.Fatalf("the map read all of its %d members for a key looked up again", len(m.members))
	}
	for i := range scannedLookups - 1 {
		if v, found := m.Find(types.String(fmt.Sprintf("missing-%d", i))); found || v != nil {
			t.Fatalf("a missing key found: %v", v)
		}
	}
	if m.members != nil {
		t.Fatalf("indexed after %d distinct keys; want after %d", scannedLookups, scannedLookups+1)
	}
	if _, found := m.Find(types.String("missing-0")); found {
		t.Fatal("a missing key found when looked up again")
	}
	spec, found := m.Find(types.String("spec"))
	if !found || m.members == nil {
		t.Fatalf("the key after %d distinct ones: found %t, indexed %t; want both", scannedLookups, found, m.members != nil)
	}
	if v, _ := m.Find(types.String("metadata")); v != metadata {
		t.Error("metadata once indexed is not the value found first")
	}
	if v, _ := m.Find(types.String("spec")); v != spec {
		t.Error("spec looked up again in the index is another value")
	}
}
