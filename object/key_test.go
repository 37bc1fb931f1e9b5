package object

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestResourceNamesParseBackToTheirResource(t *testing.T) {
	for _, tc := range []struct {
		name string
		gvr  schema.GroupVersionResource
		want string
	}{
		{"a core resource has no group", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "configmaps.v1"},
		{"a grouped resource ends with its group", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, "deployments.v1.apps"},
		{"a group with dots stays whole", schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1beta1", Resource: "ingresses"}, "ingresses.v1beta1.networking.k8s.io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ResourceName(tc.gvr); got != tc.want {
				t.Fatalf("ResourceName(%v) = %q; want %q", tc.gvr, got, tc.want)
			}
			back, err := ParseResourceName(tc.want)
			if err != nil || back != tc.gvr {
				t.Fatalf("ParseResourceName(%q) = %v, %v; want %v", tc.want, back, err, tc.gvr)
			}
			key := OrderingKey(tc.gvr, "ns", "name")
			if r, err := OrderingKeyResource(key); err != nil || r != tc.gvr {
				t.Fatalf("OrderingKeyResource(%q) = %v, %v; want %v", key, r, err, tc.gvr)
			}
			if ns := OrderingKeyNamespace(key); ns != "ns" {
				t.Fatalf("OrderingKeyNamespace(%q) = %q; want ns", key, ns)
			}
			if key := OrderingKey(tc.gvr, "", "node"); OrderingKeyNamespace(key) != "" {
				t.Fatalf("OrderingKeyNamespace(%q) = %q; want none for a cluster-scoped object", key, OrderingKeyNamespace(key))
			}
		})
	}
}

func TestMalformedResourceNamesAreRefused(t *testing.T) {
	for _, name := range []string{
		"", "configmaps", "configmaps.", ".v1", "Configmaps.v1",
		"/v1, Resource=configmaps", "example.com/v1alpha1, Resource=widgets", "widgets.v1.Example.com", "a b.v1",
	} {
		if gvr, err := ParseResourceName(name); err == nil {
			t.Errorf("ParseResourceName(%q) = %v; want an error", name, gvr)
		}
	}
	if _, err := OrderingKeyResource("configmaps.v1/ns/name"); err == nil {
		t.Error("an ordering key with no | parsed")
	}
}

func TestKeysAreClientGosAndSplitBack(t *testing.T) {
	for _, tc := range []struct{ namespace, name, key string }{
		{"ns", "cm", "ns/cm"},
		{"", "node-1", "node-1"},
	} {
		if got := Key(tc.namespace, tc.name); got != tc.key {
			t.Errorf("Key(%q, %q) = %q; want %q", tc.namespace, tc.name, got, tc.key)
		}
		if ns, n := SplitKey(tc.key); ns != tc.namespace || n != tc.name {
			t.Errorf("SplitKey(%q) = %q, %q; want %q, %q", tc.key, ns, n, tc.namespace, tc.name)
		}
	}
}

// TestIsKeyOfIsTheKeyCompared checks IsKeyOf against Key compared, for keys that share a
// namespace, a name, a length or a place of the slash with the namespace and name asked about.
func TestIsKeyOfIsTheKeyCompared(t *testing.T) {
	keys := []string{"ns/cm", "ns/cm2", "ns/c", "n/scm", "nscm", "ns/cm/", "ns-cm", "/nscm", "cm", "ns/", "/cm", ""}
	for _, key := range keys {
		for _, n := range []struct{ namespace, name string }{{"ns", "cm"}, {"", "cm"}, {"", "ns/cm"}, {"n", "s/cm"}, {"ns", ""}, {"", ""}} {
			if got, want := IsKeyOf(key, n.namespace, n.name), key == Key(n.namespace, n.name); got != want {
				t.Errorf("IsKeyOf(%q, %q, %q) = %v; want %v", key, n.namespace, n.name, got, want)
			}
		}
	}
}

// TestListOrderIsTheApiserversAndTheSameForKeysAndObjects: cluster-scoped first, then by
// namespace, then name. Compared as whole strings, "a-b/a" would sort before "a/x" ('-' is
// less than '/'), which is why keys are split first.
func TestListOrderIsTheApiserversAndTheSameForKeysAndObjects(t *testing.T) {
	want := []string{"zz-cluster-scoped", "a/x", "a/y", "a-b/a", "b/a"}
	shuffled := []string{"b/a", "a-b/a", "a/y", "zz-cluster-scoped", "a/x"}
	keys := slices.Clone(shuffled)
	slices.SortFunc(keys, CompareKeys)
	if !slices.Equal(keys, want) {
		t.Errorf("keys sorted: %q; want %q", keys, want)
	}
	var objs []*unstructured.Unstructured
	for _, k := range shuffled {
		ns, name := SplitKey(k)
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetNamespace(ns)
		u.SetName(name)
		objs = append(objs, u)
	}
	slices.SortFunc(objs, CompareObjects)
	var got []string
	for _, o := range objs {
		got = append(got, KeyOf(o))
	}
	if !slices.Equal(got, want) {
		t.Errorf("objects sorted: %q; want %q", got, want)
	}
}

func TestRevisionIsTheResourceVersionAsAnInteger(t *testing.T) {
	for rv, want := range map[string]uint64{"12345": 12345, "": 0, "abc": 0, "-1": 0, "18446744073709551615": 1<<64 - 1} {
		if got := Revision(rv); got != want {
			t.Errorf("Revision(%q) = %d; want %d", rv, got, want)
		}
	}
}
