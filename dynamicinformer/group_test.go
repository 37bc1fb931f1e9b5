package dynamicinformer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

func TestAWholeGroupSelectsThePreferredVersionOfEachListableResource(t *testing.T) {
	api := func(name string, namespaced bool, verbs ...string) metav1.APIResource {
		return metav1.APIResource{Name: name, Namespaced: namespaced, Verbs: verbs}
	}
	lw := []string{"get", "list", "watch"}
	s := served{
		versions: map[string][]string{"example.com": {"v2", "v1beta1", "v1"}},
		resources: map[schema.GroupVersion][]metav1.APIResource{
			{Group: "example.com", Version: "v2"}:      {api("widgets", true, lw...), api("widgets/status", true, lw...), api("reviews", true, "create")},
			{Group: "example.com", Version: "v1beta1"}: {api("widgets", true, lw...), api("gadgets", true, lw...), api("nodes", false, lw...)},
			{Group: "example.com", Version: "v1"}:      {api("gadgets", true, lw...), api("secretwidgets", true, lw...), api("pinned", true, lw...), api("legacy", true, lw...)},
		},
	}
	claimed := map[schema.GroupResource]string{{Group: "example.com", Resource: "pinned"}: "pinned.v1.example.com"}
	tests := []struct {
		name, yaml   string
		members      []string
		left         []string
		stateWithout State
	}{
		{"every version: the preferred one, else the first that serves the resource", `{group: example.com, version: "*", resource: "*", excludeResources: [secretwidgets]}`,
			[]string{"gadgets.v1beta1", "legacy.v1", "nodes.v1beta1", "widgets.v2"},
			[]string{"pinned (configured as pinned.v1.example.com)", "reviews (no list and watch)", "secretwidgets (excludeResources)"}, ""},
		{"one version", `{group: example.com, version: v1, resource: "*"}`,
			[]string{"gadgets.v1", "legacy.v1", "secretwidgets.v1"},
			[]string{"pinned (configured as pinned.v1.example.com)"}, ""},
		{"namespaces leave cluster-scoped resources out", `{group: example.com, version: v1beta1, resource: "*", namespaces: [a]}`,
			[]string{"gadgets.v1beta1", "widgets.v1beta1"},
			[]string{"nodes (cluster-scoped, and namespaces, excludeNamespaces or namespaceSelector are set)"}, ""},
		{"a version the group does not serve", `{group: example.com, version: v3, resource: "*"}`, nil, nil, StateNotServed},
		{"a group not served", `{group: nowhere.example.com, version: "*", resource: "*"}`, nil, nil, StateNotServed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := loadResources(t, "resources: ["+tt.yaml+"]\n")[0]
			members, left := selectMembers(s, &cfg, claimed)
			var got []string
			for _, x := range members {
				got = append(got, strings.TrimSuffix(x.gvr.Resource+"."+x.gvr.Version, "."))
			}
			if !slices.Equal(got, tt.members) || !slices.Equal(left, tt.left) {
				t.Errorf("members %v, left out %v; want %v, %v", got, left, tt.members, tt.left)
			}
			st, reason := groupState(s, &cfg, len(members), left)
			want := StateExpanded
			if tt.stateWithout != "" {
				want = tt.stateWithout
			}
			if st != want || (st == StateNotServed && !strings.Contains(reason, cfg.Group)) {
				t.Errorf("group state %s (%s); want %s naming the group", st, reason, want)
			}
		})
	}
}

// loadResources loads the resources of a YAML configuration.
func loadResources(t testing.TB, yaml string) []config.Resource {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Resources
}

// kindCRD returns a namespaced CRD of kind in group, version v1, whose plural is the kind
// lower-cased with an s.
func kindCRD(group, kind string) *unstructured.Unstructured {
	c := crd(group)
	plural := strings.ToLower(kind) + "s"
	c.SetName(plural + "." + group)
	_ = unstructured.SetNestedStringMap(c.Object, map[string]string{"kind": kind, "plural": plural, "singular": strings.ToLower(kind), "listKind": kind + "List"}, "spec", "names")
	return c
}

// createCustom creates the object ns/name of kind in group, version v1, retrying while its CRD
// is not served yet.
func createCustom(t *testing.T, group, kind, ns, name string) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: strings.ToLower(kind) + "s"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": kind, "metadata": map[string]any{"name": name, "namespace": ns},
	}}
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	testbed.Eventually(t, 30*time.Second, func() error {
		_, err := dyn.Resource(gvr).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
		return err
	})
}

// watchedAs waits until the manager watches the resource named name and returns it.
func watchedAs(t *testing.T, m started, name string) *Resource {
	t.Helper()
	var found *Resource
	testbed.Eventually(t, 30*time.Second, func() error {
		for _, r := range m.Resources() {
			if r.Name() == name {
				found = r
				return nil
			}
		}
		return fmt.Errorf("%s is not watched", name)
	})
	return found
}

func TestAWholeGroupFollowsItsCRDsAndAForbiddenMemberIsStaleAlone(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	group := ns + ".example.com"
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	for _, kind := range []string{"Alpha", "Gamma"} {
		if _, err := dyn.Resource(crdGVR).Create(t.Context(), kindCRD(group, kind), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createCustom(t, group, "Alpha", ns, "a1")
	// The manager's user may read alphas and betas of the group, not gammas.
	user := "group-" + ns
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: []string{"alphas", "betas"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	limited := rest.CopyConfig(cluster.Config)
	limited.Impersonate = rest.ImpersonationConfig{UserName: user}
	rec := &recorder{}
	m := startManager(t, limited, fmt.Sprintf(`resources: [{group: %s, version: "*", resource: "*", staleAfter: 2s}]`+"\n", group), rec)

	alphas, gammas := watchedAs(t, m, "alphas.v1."+group), watchedAs(t, m, "gammas.v1."+group)
	cacheHas(t, alphas, ns+"/a1")
	testbed.Eventually(t, 30*time.Second, func() error {
		if st := gammas.Status(); st.State != StateStale || !strings.Contains(st.Reason, "forbidden") || st.Entry != "*.*."+group {
			return fmt.Errorf("gammas: %+v; want Stale for being forbidden, from entry *.*.%s", st, group)
		}
		if ok, lag := m.Ready(); !ok {
			return fmt.Errorf("not ready: %v; a Stale member must not hold readiness back", lag)
		}
		return nil
	})
	if st := m.Status()[0]; st.State != StateExpanded || !slices.Equal(st.Members, []string{"alphas.v1." + group, "gammas.v1." + group}) {
		t.Errorf("the entry's status %+v; want Expanded with its two members", st)
	}
	if metricValue(t, m, "dynwatch_informer_stale", gammas.Name()) != 1 || metricValue(t, m, "dynwatch_informer_synced", alphas.Name()) != 1 {
		t.Errorf("metrics do not show gammas stale and alphas synced")
	}

	// A CRD of the group installed after the start is picked up.
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), kindCRD(group, "Beta"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createCustom(t, group, "Beta", ns, "b1")
	cacheHas(t, watchedAs(t, m, "betas.v1."+group), ns+"/b1")
	betaGVR := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "betas"}
	if _, ok := m.Lookup(betaGVR); !ok {
		t.Errorf("Lookup(%v) finds nothing", betaGVR)
	}

	// One deleted goes, its objects as DELETED.
	if err := dyn.Resource(crdGVR).Delete(t.Context(), "alphas."+group, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	alphaGVR := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "alphas"}
	testbed.Eventually(t, 30*time.Second, func() error {
		if _, ok := m.Lookup(alphaGVR); ok {
			return fmt.Errorf("alphas is still watched")
		}
		return nil
	})
	if evs := rec.find(ns, "a1"); len(evs) != 2 || evs[1].Type != object.Deleted || evs[1].Resource != alphaGVR {
		t.Errorf("events of a1: %d, want ADDED then DELETED", len(evs))
	}
	if names := m.Status()[0].Members; !slices.Equal(names, []string{"betas.v1." + group, "gammas.v1." + group}) {
		t.Errorf("members after alphas was deleted: %v", names)
	}
}

func TestAMemberAReloadExcludesLeavesWithItsObjectsAsDeleted(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	group := ns + ".example.com"
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	for _, kind := range []string{"Thing", "Other"} {
		if _, err := dyn.Resource(crdGVR).Create(t.Context(), kindCRD(group, kind), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createCustom(t, group, "Thing", ns, "gear")
	createCustom(t, group, "Other", ns, "cog")
	rec := &recorder{}
	yaml := `resources: [{group: %s, version: "*", resource: "*", namespaces: [%s]%s}]` + "\n"
	m := startManager(t, cluster.Config, fmt.Sprintf(yaml, group, ns, ""), rec)
	cacheHas(t, watchedAs(t, m, "things.v1."+group), ns+"/gear")
	others := watchedAs(t, m, "others.v1."+group)
	cacheHas(t, others, ns+"/cog")

	m.Update(loadResources(t, fmt.Sprintf(yaml, group, ns, ", excludeResources: [things]")))
	thingGVR := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "things"}
	testbed.Eventually(t, 30*time.Second, func() error {
		if _, ok := m.Lookup(thingGVR); ok {
			return fmt.Errorf("things is still watched")
		}
		return nil
	})
	evs := rec.find(ns, "gear")
	if len(evs) != 2 || evs[1].Type != object.Deleted || evs[1].Resource != thingGVR || evs[1].Stream != ns || evs[1].Revision != 0 || evs[1].InOrder {
		t.Fatalf("events of gear: %+v; want ADDED, then a DELETED of its stream, with no revision", evs)
	}
	// The member kept restarts with the new configuration: its object is listed again, and
	// was not deleted.
	cog := rec.find(ns, "cog")
	if slices.ContainsFunc(cog, func(e object.Event) bool { return e.Type == object.Deleted }) {
		t.Errorf("events of cog: %+v; a member still watched must not delete its objects", cog)
	}
	if st := m.Status()[0]; st.State != StateExpanded || !strings.Contains(st.Reason, "things (excludeResources)") {
		t.Errorf("the entry's status %+v; want Expanded naming things as excluded", st)
	}
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetValue() == "things.v1."+group {
					t.Errorf("%s still has a series for the excluded member", f.GetName())
				}
			}
		}
	}
}
