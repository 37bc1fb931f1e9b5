package dynamicinformer

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

func configMap(ns, name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
}

func create(t *testing.T, cms ...*corev1.ConfigMap) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, cm := range cms {
		if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCachesObjectsOfTheListedNamespacesOnly(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 3)
	create(t, configMap(ns[0], "a", nil), configMap(ns[2], "excluded", nil))
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s, %s]}
`, ns[0], ns[1]))
	waitReady(t, m)
	create(t, configMap(ns[1], "b", nil), configMap(ns[2], "excluded-too", nil))
	r := resource(t, m, "configmaps.v1")
	cacheHas(t, r, ns[0]+"/a", ns[1]+"/b")
	if _, ok := r.Snapshot().Get(ns[1], "b"); !ok {
		t.Errorf("Get(%s, b) found nothing", ns[1])
	}
	if _, ok := r.Snapshot().Get(ns[2], "excluded"); ok {
		t.Errorf("Get found an object of a namespace that is not watched")
	}
	if st := r.Status(); st.Objects != 2 || !st.Synced || st.Plural != "configmaps" || !st.Namespaced {
		t.Errorf("status = %+v, want 2 synced namespaced configmaps", st)
	}
}

func TestSelectorsAreAppliedByTheServer(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	create(t,
		configMap(ns, "web", map[string]string{"app": "web"}),
		configMap(ns, "web-skipped", map[string]string{"app": "web"}),
		configMap(ns, "db", map[string]string{"app": "db"}),
		configMap(ns, "unlabelled", nil))
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%s]
    labelSelector: "app in (web, api)"
    fieldSelector: "metadata.name!=web-skipped"
`, ns))
	waitReady(t, m)
	r := resource(t, m, "configmaps.v1")
	cacheHas(t, r, ns+"/web")
	create(t, configMap(ns, "api", map[string]string{"app": "api"}), configMap(ns, "other", map[string]string{"app": "x"}))
	cacheHas(t, r, ns+"/api", ns+"/web")
}

func TestTransformStripsFieldsBeforeTheCache(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	// Two server-side apply managers, and kubectl's last-applied annotation.
	for i, manager := range []string{"deployer", "operator"} {
		key := fmt.Sprintf("k%d", i)
		cm := corev1apply.ConfigMap("applied", ns).
			WithAnnotations(map[string]string{
				LastAppliedAnnotation: `{"kind":"ConfigMap"}`,
				"example.com/team":    "storefront",
			}).
			WithData(map[string]string{key: "v", "password": "hunter2"})
		if _, err := cs.CoreV1().ConfigMaps(ns).Apply(t.Context(), cm, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	live, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "applied", metav1.GetOptions{})
	if err != nil || len(live.ManagedFields) < 2 {
		t.Fatalf("the live object should have managedFields of two managers: %v, %v", live.ManagedFields, err)
	}
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s], transform: {removeFields: [data.password]}}
`, ns))
	waitReady(t, m)
	r := resource(t, m, "configmaps.v1")
	cacheHas(t, r, ns+"/applied")
	kept, _ := r.Snapshot().Get(ns, "applied")
	obj := decoded(t, kept)
	if obj.GetManagedFields() != nil {
		t.Errorf("managedFields are still cached: %v", obj.GetManagedFields())
	}
	if a := obj.GetAnnotations(); a[LastAppliedAnnotation] != "" || a["example.com/team"] != "storefront" {
		t.Errorf("annotations = %v, want last-applied gone and the team kept", a)
	}
	data, _, _ := unstructured.NestedStringMap(obj.Object, "data")
	if _, ok := data["password"]; ok || data["k0"] != "v" || data["k1"] != "v" {
		t.Errorf("data = %v, want k0 and k1 without password", data)
	}
}

func TestIndexersReturnTheRightObjects(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	owner := configMap(ns, "owner", map[string]string{"app": "web"})
	owner.Annotations = map[string]string{"example.com/team": "storefront"}
	created, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), owner, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := func(name, node string, images ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}}
		for i, img := range images {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: img})
		}
		return p
	}
	owned := pod("owned", "n1", "nginx:1.27", "envoy:1.30")
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: created.UID}}
	for _, p := range []*corev1.Pod{owned, pod("other", "n2", "nginx:1.27")} {
		if _, err := cs.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%[1]s]
    indexers:
      - {name: byApp, type: label, key: app}
      - {name: byTeam, type: annotation, key: example.com/team}
  - version: v1
    resource: pods
    namespaces: [%[1]s]
    indexers:
      - {name: byNode, type: jsonPath, path: "{.spec.nodeName}"}
      - {name: byImage, type: jsonPath, path: "{.spec.containers[*].image}"}
      - {name: byOwner, type: owner}
`, ns))
	waitReady(t, m)
	cms, pods := resource(t, m, "configmaps.v1"), resource(t, m, "pods.v1")
	cacheHas(t, pods, ns+"/other", ns+"/owned")
	tests := []struct {
		r            *Resource
		index, value string
		want         string
	}{
		{cms, "byApp", "web", ns + "/owner"},
		{cms, "byApp", "db", ""},
		{cms, "byTeam", "storefront", ns + "/owner"},
		{cms, "namespace", ns, ns + "/owner"},
		{pods, "byNode", "n1", ns + "/owned"},
		{pods, "byImage", "nginx:1.27", ns + "/other " + ns + "/owned"},
		{pods, "byImage", "envoy:1.30", ns + "/owned"},
		{pods, "byOwner", OwnerKey("ConfigMap", "owner"), ns + "/owned"},
		{pods, "byOwner", string(created.UID), ns + "/owned"},
	}
	for _, tt := range tests {
		snap := tt.r.Snapshot()
		var objs []*object.Object
		if tt.index == "namespace" {
			objs = scanned(snap, tt.value)
		} else {
			by, ok := snap.ByIndex(tt.index, tt.value)
			if !ok {
				t.Errorf("ByIndex(%s, %s): no such index", tt.index, tt.value)
				continue
			}
			objs = scanned(by, "")
		}
		if got := names(objs); got != tt.want {
			t.Errorf("%s ByIndex(%s, %q) = %q, want %q", tt.r.Name(), tt.index, tt.value, got, tt.want)
		}
	}
	if _, ok := pods.Snapshot().ByIndex("byNothing", "x"); ok {
		t.Errorf("ByIndex of an unknown index succeeded")
	}
}

func TestEventsCarryTheRightObjects(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	create(t, configMap(ns, "before", nil))
	rec := &recorder{}
	m := watchConfigMaps(t, ns, rec)
	cs := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	cm := configMap(ns, "cm", nil)
	cm.Data = map[string]string{"v": "1"}
	create(t, cm)
	live, err := cs.Get(t.Context(), "cm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Data["v"] = "2"
	if _, err := cs.Update(t.Context(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.Delete(t.Context(), "cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		if n := len(rec.find(ns, "cm")); n != 3 {
			return fmt.Errorf("%d events for cm, want 3", n)
		}
		return nil
	})
	events := rec.find(ns, "cm")
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	data := func(u *unstructured.Unstructured) string {
		if u == nil {
			return "<nil>"
		}
		v, _, _ := unstructured.NestedString(u.Object, "data", "v")
		return v
	}
	want := []struct {
		typ      object.EventType
		obj, old string
	}{{object.Added, "1", "<nil>"}, {object.Modified, "2", "1"}, {object.Deleted, "2", "<nil>"}}
	for i, w := range want {
		e := events[i]
		obj, old := decoded(t, e.Object), decoded(t, e.OldObject)
		if e.Type != w.typ || data(obj) != w.obj || data(old) != w.old || e.Resource != gvr || e.InitialList {
			t.Errorf("event %d = %s obj=%s old=%s gvr=%v initial=%v; want %s obj=%s old=%s", i,
				e.Type, data(obj), data(old), e.Resource, e.InitialList, w.typ, w.obj, w.old)
		}
		if obj.GetManagedFields() != nil {
			t.Errorf("event %d carries managedFields: events must carry transformed objects", i)
		}
	}
	if before := rec.find(ns, "before"); len(before) != 1 || !before[0].InitialList || before[0].Type != object.Added {
		t.Errorf("events for an object that existed at start = %+v, want one initial-list ADDED", before)
	}
	if got := metricValue(t, m, "dynwatch_informer_events_total", "configmaps.v1", "MODIFIED"); got != 1 {
		t.Errorf("dynwatch_informer_events_total{type=MODIFIED} = %v, want 1", got)
	}
}

// crd returns a namespaced CRD in group, kind Thing, version v1.
func crd(group string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "things." + group},
		"spec": map[string]any{
			"group": group,
			"names": map[string]any{"kind": "Thing", "plural": "things", "singular": "thing", "listKind": "ThingList"},
			"scope": "Namespaced",
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// TestTheInitialListIsHandedOverInKeyOrder: the objects of the initial list reach subscribers in
// key order, as the apiserver lists them, though client-go's streamed list (WatchList, on by
// default) hands the store its objects in no order: a history reads a page of listed objects
// from a few blocks only when they were written in order.
func TestTheInitialListIsHandedOverInKeyOrder(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	for i := range 60 {
		create(t, configMap(ns, fmt.Sprintf("cm-%02d", (i*37)%60), nil)) // created out of order
	}
	rec := &recorder{}
	watchConfigMaps(t, ns, rec)
	rec.mu.Lock()
	var listed []string
	for _, e := range rec.events {
		if e.InitialList && e.Object.GetNamespace() == ns {
			listed = append(listed, e.Object.GetName())
		}
	}
	rec.mu.Unlock()
	if len(listed) != 60 || !slices.IsSorted(listed) {
		t.Fatalf("the initial list handed over %d objects in the order %v; want 60, by name", len(listed), listed)
	}
}

func TestCRDCreatedAfterStartIsWatchedAndStopsWhenDeleted(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	group := ns + ".example.com"
	rec := &recorder{}
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
  - {group: %s, version: v1, kind: Thing}
`, ns, group), rec)
	waitReady(t, m)
	things := resource(t, m, "Thing.v1."+group)
	if st := things.Status(); st.State != StateNotServed || !strings.Contains(st.Reason, group) {
		t.Fatalf("before the CRD exists, status = %+v; want NotServed naming the group", st)
	}

	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd(group), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	thingGVR := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "things"}
	thing := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": "Thing", "metadata": map[string]any{"name": "gear", "namespace": ns},
	}}
	// The CRD takes a moment to be served; creating the object is the proof it is.
	testbed.Eventually(t, 30*time.Second, func() error {
		_, err := dyn.Resource(thingGVR).Namespace(ns).Create(t.Context(), thing, metav1.CreateOptions{})
		return err
	})
	cacheHas(t, things, ns+"/gear")
	if st := things.Status(); st.State != StateSynced || st.Plural != "things" {
		t.Fatalf("after the CRD appeared, status = %+v; want Synced things", st)
	}
	waitReady(t, m)
	if got, ok := m.Lookup(thingGVR); !ok || got != things {
		t.Errorf("Lookup(%v) = %v, %v; want the Thing resource", thingGVR, got, ok)
	}

	if err := dyn.Resource(crdGVR).Delete(t.Context(), "things."+group, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if st := things.Status(); st.State != StateNotServed {
			return fmt.Errorf("after the CRD was deleted, state = %s (%s)", st.State, st.LastError)
		}
		return nil
	})
	if things.running() || things.Snapshot().Len() != 0 {
		t.Errorf("informers still run or cache still holds objects after the CRD went away")
	}
	if evs := rec.find(ns, "gear"); len(evs) != 2 || evs[1].Type != object.Deleted {
		t.Errorf("events for the custom object = %d, want ADDED then DELETED", len(evs))
	}
	// Stopped, not retrying: the watch error count does not grow while it is not served.
	errs := metricValue(t, m, "dynwatch_informer_watch_errors_total", things.Name())
	if errs > 5 {
		t.Errorf("%v watch errors after the CRD was deleted: a retry loop", errs)
	}
	if _, ok := m.Lookup(thingGVR); ok {
		t.Errorf("Lookup still finds the resource of a deleted CRD")
	}
}

func TestReadinessFollowsAccess(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	create(t, configMap(ns, "a", nil))
	user := "limited-" + ns
	limited := rest.CopyConfig(cluster.Config)
	limited.Impersonate = rest.ImpersonationConfig{UserName: user}
	m := startManager(t, limited, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
`, ns))
	r := resource(t, m, "configmaps.v1")
	testbed.Eventually(t, 20*time.Second, func() error {
		st := r.Status()
		if st.State != StateSyncing || !strings.Contains(st.LastError, "forbidden") {
			return fmt.Errorf("status = %+v, want Syncing with a forbidden error", st)
		}
		return nil
	})
	if ok, lag := m.Ready(); ok || len(lag) != 1 || !strings.Contains(lag[0], "configmaps.v1") {
		t.Fatalf("Ready() = %v, %v; want not ready naming configmaps.v1", ok, lag)
	}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-configmaps"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	if _, err := cs.RbacV1().Roles(ns).Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 60*time.Second, func() error {
		if ok, lag := m.Ready(); !ok {
			return fmt.Errorf("not ready: %v", lag)
		}
		return nil
	})
	cacheHas(t, r, ns+"/a")
}

// Processing is tested directly for what a live cluster cannot produce on demand.

func TestARelistDatesItsDeletesByTheListAndAResyncChangesNothing(t *testing.T) {
	testbed.Need(t)
	rec := &recorder{}
	m := startManager(t, cluster.Config, "resources: [{version: v1, resource: configmaps, namespaces: [none]}]\n", rec)
	r := resource(t, m, "configmaps.v1")
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	process := r.process(gvr, "ns", &moves{}, newStore(nil))
	obj := object.New(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"namespace": "ns", "name": "gone", "resourceVersion": "7", "uid": string(types.UID("u1")),
	}}})
	for i, d := range []cache.Delta{
		{Type: cache.ReplacedAll, Object: cache.ReplacedAllInfo{ResourceVersion: "8", Objects: []any{obj}}},
		{Type: cache.SyncAll, Object: cache.SyncAllInfo{}},
		{Type: cache.ReplacedAll, Object: cache.ReplacedAllInfo{ResourceVersion: "42"}},
	} {
		if err := process(cache.Deltas{d}, i == 0); err != nil {
			t.Fatal(err)
		}
	}
	events := rec.find("ns", "gone")
	if len(events) != 2 || events[0].Type != object.Added || events[1].Type != object.Deleted || events[1].Object != obj {
		t.Fatalf("events = %+v; want ADDED, then one DELETED carrying the cached object", events)
	}
	// The object's resourceVersion is from before the deletion; the relist's is after it.
	if e := events[1]; e.Since != 8 || e.Revision != 42 || e.InOrder || e.Stream != "ns" {
		t.Fatalf("relist delete: since %d, revision %d, in order %t, stream %q; want 8, 42, false, ns", e.Since, e.Revision, e.InOrder, e.Stream)
	}
}

// TestAMetadataOnlyCacheKeepsTheMetadataAsTheApiserverSentIt: a metadata-only cache keeps each
// object's metadata as the JSON the apiserver sends (PartialObjectMetadata, asked for as JSON),
// byte for byte where no transform cuts it, from its initial list and from its watch, as the
// caches of whole objects keep theirs: nothing is decoded and encoded again.
func TestAMetadataOnlyCacheKeepsTheMetadataAsTheApiserverSentIt(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	listed := configMap(ns, "listed", map[string]string{"app": "web", "tier": "front"})
	listed.Annotations = map[string]string{"team": "storefront"}
	create(t, listed)
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%s]
    cache: metadata
    transform: {stripManagedFields: false}
`, ns))
	waitReady(t, m)
	create(t, configMap(ns, "watched", map[string]string{"app": "api"}))
	r := resource(t, m, "configmaps.v1")
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, name := range []string{"listed", "watched"} {
		testbed.Eventually(t, 10*time.Second, func() error {
			sent, err := cs.CoreV1().RESTClient().Get().Namespace(ns).Resource("configmaps").Name(name).
				SetHeader("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1").DoRaw(t.Context())
			if err != nil {
				return err
			}
			kept, ok := r.Snapshot().Get(ns, name)
			if !ok {
				return fmt.Errorf("%s is not cached", name)
			}
			if got, want := string(kept.JSON()), strings.TrimSpace(string(sent)); got != want {
				return fmt.Errorf("%s is cached as\n%s\nwant what the apiserver sends:\n%s", name, got, want)
			}
			return nil
		})
	}
}

// TestAMetadataOnlyCacheKeepsNothingButMetadata: with cache: metadata the apiserver sends only
// metadata, and that is what the cache keeps and the events carry, as PartialObjectMetadata,
// with the transforms and indexers over metadata applied.
func TestAMetadataOnlyCacheKeepsNothingButMetadata(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	rec := &recorder{}
	m := startManager(t, cluster.Config, fmt.Sprintf(`
resources:
  - version: v1
    resource: configmaps
    namespaces: [%s]
    cache: metadata
    transform: {removeFields: [metadata.annotations.secret]}
    indexers: [{name: byApp, type: label, key: app}]
`, ns), rec)
	waitReady(t, m)
	cm := configMap(ns, "cm", map[string]string{"app": "web"})
	cm.Annotations = map[string]string{"secret": "s3cret", "team": "storefront"}
	cm.Data = map[string]string{"big": strings.Repeat("x", 4096)}
	create(t, cm)
	r := resource(t, m, "configmaps.v1")
	cacheHas(t, r, ns+"/cm")
	kept, _ := r.Snapshot().Get(ns, "cm")
	obj := decoded(t, kept)
	if obj.GetKind() != "PartialObjectMetadata" || obj.GetAPIVersion() != "meta.k8s.io/v1" {
		t.Errorf("cached as %s %s, want meta.k8s.io/v1 PartialObjectMetadata", obj.GetAPIVersion(), obj.GetKind())
	}
	if _, has := obj.Object["data"]; has || len(obj.Object) != 3 {
		t.Errorf("the cached object has %v, want apiVersion, kind and metadata only", slices.Sorted(maps.Keys(obj.Object)))
	}
	if a := obj.GetAnnotations(); a["secret"] != "" || a["team"] != "storefront" || obj.GetUID() == "" || obj.GetResourceVersion() == "" {
		t.Errorf("metadata: annotations %v, uid %q, resourceVersion %q; want the team kept, the secret removed, uid and resourceVersion", a, obj.GetUID(), obj.GetResourceVersion())
	}
	by, _ := r.Snapshot().ByIndex("byApp", "web")
	if got := names(scanned(by, "")); got != ns+"/cm" {
		t.Errorf("byApp=web holds %q, want the configmap", got)
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		if evs := rec.find(ns, "cm"); len(evs) != 1 || decoded(t, evs[0].Object).GetKind() != "PartialObjectMetadata" {
			return fmt.Errorf("events: %+v, want one ADDED of the metadata", evs)
		}
		return nil
	})
}
