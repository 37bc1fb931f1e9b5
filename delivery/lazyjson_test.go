package delivery

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// evaluateDecoded is how a filter ran before it read the JSON lazily: on both objects decoded
// whole into maps. What a filter decides must not depend on which way it reads.
func evaluateDecoded(p cel.Program, e object.Event) (bool, error) {
	vars, err := decodedVariables(e)
	if err != nil {
		return false, err
	}
	return decision(p.Eval(vars))
}

// decodedVariables are a filter's variables for e with both objects decoded whole into maps.
func decodedVariables(e object.Event) (map[string]any, error) {
	obj, err := e.Object.Decode()
	if err != nil {
		return nil, err
	}
	vars := map[string]any{"type": string(e.Type), "object": obj.Object, "oldObject": nil,
		"resource": map[string]string{"group": e.Resource.Group, "version": e.Resource.Version, "resource": e.Resource.Resource}}
	if e.OldObject != nil {
		old, err := e.OldObject.Decode()
		if err != nil {
			return nil, err
		}
		vars["oldObject"] = old.Object
	}
	return vars, nil
}

// costOf is what CEL's cost tracking charged for an evaluation; 0 without its details.
func costOf(d *cel.EvalDetails) uint64 {
	if d == nil || d.ActualCost() == nil {
		return 0
	}
	return *d.ActualCost()
}

// TestAFilterDecidesOnTheJSONAsOnTheDecodedObject: every kind of expression a filter may hold
// (keys, presence, missing keys and indexes, sizes, membership, iteration, macros, equality of
// maps and lists, empty ones among them, numbers of both kinds, types, null) decides the same,
// with the same error, and is charged the same cost by CEL's cost tracking, on the JSON read
// lazily as on the objects decoded whole, for a configmap, one with empty data and a pod, as a
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
		`null != oldObject && oldObject.metadata.name == object.metadata.name`,
		`object.data == {} || object.data != null && object.metadata.labels != {"app": "web"}`,
		`{} == object.data || object.metadata.annotations == {"example.com/team": "team-1"}`,
		`object.data != true && object.metadata.labels != 1 && object.metadata.labels != "a"`,
		`object.metadata.labels != "ab" && object.spec.containers != [] && [] != object.spec.containers`,
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
	empty := benchConfigMap()
	empty.SetName("cm-empty")
	empty.Object["data"] = map[string]any{}
	for _, u := range []*unstructured.Unstructured{benchConfigMap(), benchPod(), many, empty} {
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
			lazyOut, lazyDetails, lazyErr := p.Eval(&eventActivation{e: e})
			vars, err := decodedVariables(e)
			if err != nil {
				t.Fatal(err)
			}
			wholeOut, wholeDetails, wholeErr := p.Eval(vars)
			lazy, lazyErr := decision(lazyOut, lazyDetails, lazyErr)
			whole, wholeErr := decision(wholeOut, wholeDetails, wholeErr)
			what := fmt.Sprintf("%s on a %s %s", filters[i], e.Object.GetName(), e.Type)
			if lazy != whole || fmt.Sprint(lazyErr) != fmt.Sprint(wholeErr) {
				t.Errorf("%s: read lazily %t, %v; decoded whole %t, %v", what, lazy, lazyErr, whole, wholeErr)
			}
			if c, w := costOf(lazyDetails), costOf(wholeDetails); c != w {
				t.Errorf("%s: read lazily it cost %d; decoded whole, %d", what, c, w)
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

// TestAnObjectComparedWithNullIsNotCounted: CEL's cost tracking charges == and != by the smaller
// operand's size; compared with null (`oldObject == null`), an object's count of members cannot
// change the charge, and the object is not read whole to count them (what cost a third of a
// filter's time on a pod of 4 KB). The charge is the same as on the decoded objects
// (TestAFilterDecidesOnTheJSONAsOnTheDecodedObject).
func TestAnObjectComparedWithNullIsNotCounted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	const filter = `oldObject == null || object.metadata.resourceVersion != oldObject.metadata.resourceVersion`
	if err := os.WriteFile(path, []byte("resources: [{version: v1, resource: configmaps}]\nwebhooks: [{name: f, url: 'http://127.0.0.1:1/', filter: '"+filter+"'}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	u := benchPod()
	old := u.DeepCopy()
	u.SetResourceVersion("2")
	old.SetResourceVersion("1")
	a := &eventActivation{e: object.Event{Type: object.Modified, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object: object.New(u), OldObject: object.New(old)}}
	if ok, err := decision(cfg.Webhooks[0].Program.Eval(a)); !ok || err != nil {
		t.Fatalf("the filter gave %t, %v; want true", ok, err)
	}
	if n := a.oldObject.(*jsonMap).size; n >= 0 {
		t.Errorf("the old object's %d members were counted to compare it with null", n)
	}
}

// TestAJSONMapOrListSaysWhetherItIsEmpty: what CEL's cost tracking is told in place of a count
// (config.Emptier), read from the first bytes, whitespace and all, or from the count once made.
func TestAJSONMapOrListSaysWhetherItIsEmpty(t *testing.T) {
	for raw, want := range map[string]bool{`{}`: true, `[]`: true, "{ \n\t}": true, "[\r\n ]": true, " {} ": true,
		`{"a":1}`: false, `[0]`: false, ` {"a":{}}`: false, "[ []]": false, `[null]`: false} {
		v := jsonValue(gjson.Parse(raw))
		e, ok := v.(config.Emptier)
		if !ok {
			t.Fatalf("%q is read as a %T, not an Emptier", raw, v)
		}
		if got := e.IsEmpty(); got != want {
			t.Errorf("%q: empty %t, want %t", raw, got, want)
		}
		if got := v.(interface{ Size() ref.Val }).Size() == types.Int(0); got != want {
			t.Errorf("%q: counted %v members, against empty %t", raw, v.(interface{ Size() ref.Val }).Size(), want)
		}
		if got := e.IsEmpty(); got != want {
			t.Errorf("%q once counted: empty %t, want %t", raw, got, want)
		}
	}
}
