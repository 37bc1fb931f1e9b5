package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
)

func TestParsePathNamesWhatTheKubernetesAPIDoes(t *testing.T) {
	core := schema.GroupVersion{Version: "v1"}
	apps := schema.GroupVersion{Group: "apps", Version: "v1"}
	tests := []struct {
		path string
		want target
		ok   bool
	}{
		{"/api", target{discovery: "root", legacy: true}, true},
		{"/api/v1", target{discovery: "version", legacy: true, gv: core}, true},
		{"/apis", target{discovery: "root"}, true},
		{"/apis/apps", target{discovery: "group", gv: schema.GroupVersion{Group: "apps"}}, true},
		{"/apis/apps/v1", target{discovery: "version", gv: apps}, true},
		{"/api/v1/configmaps", target{legacy: true, gv: core, resource: "configmaps"}, true},
		{"/api/v1/nodes/n1", target{legacy: true, gv: core, resource: "nodes", name: "n1"}, true},
		{"/api/v1/namespaces/kube-system", target{legacy: true, gv: core, resource: "namespaces", name: "kube-system"}, true},
		{"/api/v1/namespaces/a/configmaps", target{legacy: true, gv: core, namespace: "a", resource: "configmaps"}, true},
		{"/apis/apps/v1/namespaces/a/deployments/web", target{gv: apps, namespace: "a", resource: "deployments", name: "web"}, true},
		{"/apis/apps/v1/namespaces/a/deployments/web/revisions", target{gv: apps, namespace: "a", resource: "deployments", name: "web", subresource: "revisions"}, true},
		{"/api/v1/nodes/n1/revisions", target{legacy: true, gv: core, resource: "nodes", name: "n1", subresource: "revisions"}, true},
		{"/apis/apps/v1/namespaces/a/deployments/web/scale/x", target{}, false},
		{"/api/v1/pods/a/b/c", target{}, false},
		{"/healthz", target{}, false},
	}
	for _, tt := range tests {
		got, ok := parsePath(tt.path)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("parsePath(%q) = %+v, %v; want %+v, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}

func obj(ns, name string) *object.Object { return labelled(ns, name, nil) }

func labelled(ns, name string, labels map[string]string) *object.Object {
	u := &unstructured.Unstructured{}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return object.New(u)
}

// sources are the two ways a page finds its candidates: an index's objects, in no order, and
// a scan of the cache in key order.
var sources = map[string]func(objs []*object.Object) lookup{
	"index": func(objs []*object.Object) lookup {
		return lookup{strategy: "index/test", objs: slices.Clone(objs)}
	},
	"scan": func(objs []*object.Object) lookup {
		return lookup{strategy: "scan", inOrder: true, ordered: dynamicinformer.NewSnapshot(objs...)}
	},
}

// TestPagingIsStableWhileObjectsChange lists in pages of 3 while objects are created and
// deleted between pages: every object that exists throughout is returned exactly once.
func TestPagingIsStableWhileObjectsChange(t *testing.T) {
	for name, source := range sources {
		t.Run(name, func(t *testing.T) {
			var objs []*object.Object
			for i := range 10 {
				objs = append(objs, obj("ns", fmt.Sprintf("obj-%02d", i)))
			}
			seen := map[string]int{}
			q, serr := parseQuery(url.Values{"limit": {"3"}}, 500)
			if serr != nil {
				t.Fatal(serr)
			}
			for page := 0; ; page++ {
				p, err := q.paginate(t.Context(), source(objs), "")
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range p.items {
					seen[o.GetName()]++
				}
				if p.last == "" {
					break
				}
				if want := int64(len(objs)) - int64(len(p.items)) - int64(countBefore(objs, q.after)); p.remaining == nil || *p.remaining != want {
					t.Errorf("page %d: remainingItemCount %v does not count the %d objects after it", page, p.remaining, want)
				}
				// Between pages: one object before the cursor goes, two arrive on both sides of it.
				objs = slices.DeleteFunc(objs, func(o *object.Object) bool { return o.GetName() == fmt.Sprintf("obj-%02d", page) })
				objs = append(objs, obj("ns", fmt.Sprintf("new-a%d", page)), obj("ns", fmt.Sprintf("obj-%02d-new", 9-page)))
				if q, serr = parseQuery(url.Values{"limit": {"3"}, "continue": {encodeContinue("42", p.last, 1)}}, 500); serr != nil {
					t.Fatal(serr)
				}
			}
			for i := 3; i < 10; i++ { // obj-00..02 were deleted after being listed; the rest stayed
				if name := fmt.Sprintf("obj-%02d", i); seen[name] != 1 {
					t.Errorf("%s was listed %d times, want exactly once", name, seen[name])
				}
			}
			for name, n := range seen {
				if n != 1 {
					t.Errorf("%s was listed %d times", name, n)
				}
			}
		})
	}
}

// TestPagesOfASelectorAreCutAsTheApiserverCutsThem: in key order, across namespaces, with no
// remainingItemCount (the apiserver counts only lists without selectors), and every match
// listed once over the pages, whatever the source.
func TestPagesOfASelectorAreCutAsTheApiserverCutsThem(t *testing.T) {
	var objs []*object.Object
	var want []string
	for i := range 30 {
		ns := []string{"b", "a-x", "a"}[i%3] // "a-x" sorts after "a" as a namespace, before it as a key prefix
		var labels map[string]string
		if i%2 == 0 {
			labels = map[string]string{"pick": "yes"}
		}
		o := labelled(ns, fmt.Sprintf("o%02d", 29-i), labels)
		objs = append(objs, o)
	}
	sorted := slices.Clone(objs)
	slices.SortFunc(sorted, object.CompareObjects)
	for _, o := range sorted {
		if o.Labels().Get("pick") == "yes" {
			want = append(want, object.KeyOf(o))
		}
	}
	for name, source := range sources {
		t.Run(name, func(t *testing.T) {
			var got []string
			v := url.Values{"limit": {"4"}, "labelSelector": {"pick=yes"}}
			for range 20 {
				q, serr := parseQuery(v, 500)
				if serr != nil {
					t.Fatal(serr)
				}
				p, err := q.paginate(t.Context(), source(objs), "")
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range p.items {
					got = append(got, object.KeyOf(o))
				}
				if p.remaining != nil {
					t.Errorf("a page of a selected list has remainingItemCount %d", *p.remaining)
				}
				if p.last == "" {
					break
				}
				v.Set("continue", encodeContinue("7", p.last, 1))
			}
			if !slices.Equal(got, want) {
				t.Errorf("pages listed\n%v\nwant\n%v", got, want)
			}
		})
	}
}

func countBefore(objs []*object.Object, after string) int {
	n := 0
	for _, o := range objs {
		if object.CompareKeys(object.KeyOf(o), after) <= 0 {
			n++
		}
	}
	return n
}

func TestPageSizeIsCapped(t *testing.T) {
	var objs []*object.Object
	for i := range 20 {
		objs = append(objs, obj("ns", fmt.Sprintf("o%02d", i)))
	}
	for _, limit := range []string{"", "0", "1000"} {
		q, serr := parseQuery(url.Values{"limit": {limit}}, 7)
		if serr != nil {
			t.Fatal(serr)
		}
		for name, source := range sources {
			if p, _ := q.paginate(t.Context(), source(objs), ""); len(p.items) != 7 || p.last == "" || p.remaining == nil || *p.remaining != 13 {
				t.Errorf("%s, limit=%q with a cap of 7: %d items, remaining %v, continue %q", name, limit, len(p.items), p.remaining, p.last)
			}
		}
	}
}

func TestAScanStopsWhenItsRequestEnds(t *testing.T) {
	objs := make([]*object.Object, 10*checkEvery)
	for i := range objs {
		objs[i] = obj("ns", fmt.Sprintf("obj-%05d", i))
	}
	q, serr := parseQuery(url.Values{}, 500)
	if serr != nil {
		t.Fatal(serr)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, source := range sources {
		if _, err := q.paginate(ctx, source(objs), ""); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: paginate with an ended context = %v, want context.Canceled", name, err)
		}
	}
}
