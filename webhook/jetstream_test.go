package webhook

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/journal"
)

func deliveryOf(t *testing.T, gvr schema.GroupVersionResource, namespace, name string) *Delivery {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Thing", "metadata": map[string]any{"name": name}}}
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	return &Delivery{Entry: journal.Entry{Event: dynamicinformer.Event{Resource: gvr, Object: dynamicinformer.NewObject(u)}}}
}

func TestEveryObjectsSubjectIsFiveTokensWhateverItsName(t *testing.T) {
	for _, c := range []struct {
		name                     string
		gvr                      schema.GroupVersionResource
		namespace, object, want string
	}{
		{"a core namespaced object", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "default", "app-config",
			"dynwatch.configmaps._.default.app-config"},
		{"a dotted name and group", schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"}, "web", "www.example.com",
			"dynwatch.ingresses.networking%2Ek8s%2Eio.web.www%2Eexample%2Ecom"},
		{"a cluster-scoped object", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, "", "system:aggregate-to-view",
			"dynwatch.clusterroles.rbac%2Eauthorization%2Ek8s%2Eio._.system%3Aaggregate-to-view"},
		{"wildcards, white space, an underscore and UTF-8", schema.GroupVersionResource{Group: "x.io", Version: "v1", Resource: "things"}, "ns", "a*b>c d_é",
			"dynwatch.things.x%2Eio.ns.a%2Ab%3Ec%20d%5F%C3%A9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Subject("dynwatch", deliveryOf(t, c.gvr, c.namespace, c.object))
			if got != c.want {
				t.Fatalf("subject %q, want %q", got, c.want)
			}
			if n := strings.Count(got, "."); n != 4 {
				t.Fatalf("subject %q has %d dots, want 4", got, n)
			}
			if strings.ContainsAny(got, "*> \t") {
				t.Fatalf("subject %q holds a wildcard or white space", got)
			}
		})
	}
}

func TestAStreamCoversThePrefixOnlyWithAFilterThatHoldsEverySubjectUnderIt(t *testing.T) {
	for _, c := range []struct {
		filters []string
		prefix  string
		want    bool
	}{
		{[]string{"dynwatch.>"}, "dynwatch", true},
		{[]string{">"}, "dynwatch", true},
		{[]string{"dynwatch.*.*.*.*"}, "dynwatch", true},
		{[]string{"*.configmaps.>"}, "dynwatch", false},
		{[]string{"dynwatch.configmaps.>"}, "dynwatch", false},
		{[]string{"dynwatch.*.*.*"}, "dynwatch", false},
		{[]string{"other.>", "prod.dynwatch.>"}, "prod.dynwatch", true},
		{[]string{"prod.>"}, "prod.dynwatch", true},
		{[]string{"dynwatch"}, "dynwatch", false},
	} {
		if got := covers(c.filters, c.prefix); got != c.want {
			t.Errorf("covers(%q, %q) = %v, want %v", c.filters, c.prefix, got, c.want)
		}
	}
}
