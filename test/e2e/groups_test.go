package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
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

	"github.com/dynwatch/dynwatch/test/testbed"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRD installs a namespaced CRD of kind in group, version v1, plural the kind
// lower-cased with an s, in the shared test bed.
func installCRD(t *testing.T, group, kind string) {
	t.Helper()
	installCRDIn(t, cluster.Config, group, kind)
}

// installCRDIn is installCRD in the cluster config reaches.
func installCRDIn(t *testing.T, config *rest.Config, group, kind string) {
	t.Helper()
	plural := strings.ToLower(kind) + "s"
	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON(fmt.Appendf(nil, `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"%[3]s.%[1]s"},
 "spec":{"group":"%[1]s","scope":"Namespaced","names":{"kind":"%[2]s","plural":"%[3]s","singular":"%[4]s","listKind":"%[2]sList"},
  "versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`,
		group, kind, plural, strings.ToLower(kind))); err != nil {
		t.Fatal(err)
	}
	if _, err := dynamic.NewForConfigOrDie(config).Resource(crdResource).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createCustom creates ns/name of kind in group, version v1, once its CRD is served.
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

// TestAWholeGroupPicksUpNewCRDsDropsDeletedOnesAndServesWithoutAForbiddenOne watches a
// whole group as a user who may read two of its resources (alphas and betas), not the third
// (gammas): betas, installed after the start, is picked up; alphas, deleted, goes, its objects
// leaving as DELETED; gammas is Stale on its own while the others serve and /readyz holds.
func TestAWholeGroupPicksUpNewCRDsDropsDeletedOnesAndServesWithoutAForbiddenOne(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	group := ns + ".example.com"
	installCRD(t, group, "Alpha")
	installCRD(t, group, "Gamma")
	createCustom(t, group, "Alpha", ns, "a1")

	user := "dynwatch-" + ns
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
	grantClusterID(t, user)
	kubeconfig, err := cluster.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil, false)
	p := start(t, kubeconfig, fmt.Sprintf(`
resources: [{group: %s, version: "*", resource: "*", staleAfter: 2s}]
webhooks: [{name: all, url: %q}]
discovery: {interval: 1s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, group, rc.URL))
	// Ready once alphas has synced and gammas, forbidden, is Stale rather than Syncing.
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, metrics, _ := p.WaitListening(t.Context())
	received := func(typ, name string) error {
		for _, r := range rc.got() {
			if r.payload.Type == typ && r.name() == name {
				return nil
			}
		}
		return fmt.Errorf("the webhook has no %s for %s", typ, name)
	}
	testbed.Eventually(t, 30*time.Second, func() error { return received("ADDED", "a1") })

	// A CRD of the group installed after the start is picked up.
	installCRD(t, group, "Beta")
	createCustom(t, group, "Beta", ns, "b1")
	testbed.Eventually(t, 30*time.Second, func() error {
		code, body, err := get(t.Context(), api+"/apis/"+group+"/v1/namespaces/"+ns+"/betas")
		if err != nil {
			return err
		}
		var list unstructured.UnstructuredList
		if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil || len(list.Items) != 1 || list.Items[0].GetName() != "b1" {
			return fmt.Errorf("listing betas: %d %s; want b1", code, body)
		}
		return received("ADDED", "b1")
	})

	// A CRD deleted: its objects leave as DELETED and the resource goes.
	if err := dynamic.NewForConfigOrDie(cluster.Config).Resource(crdResource).Delete(t.Context(), "alphas."+group, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if err := received("DELETED", "a1"); err != nil {
			return err
		}
		code, _, err := get(t.Context(), api+"/apis/"+group+"/v1/namespaces/"+ns+"/alphas")
		if err != nil {
			return err
		}
		if code != http.StatusNotFound {
			return fmt.Errorf("listing alphas after its CRD was deleted: %d; want 404", code)
		}
		return nil
	})

	st, err := p.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, r := range st.Resources {
		states[r.Resource] = string(r.State)
		if r.Resource != "*.*."+group && r.Entry != "*.*."+group {
			t.Errorf("/status entry %s does not name the configured entry *.*.%s: %+v", r.Resource, group, r)
		}
	}
	want := map[string]string{"*.*." + group: "Expanded", "betas.v1." + group: "Synced", "gammas.v1." + group: "Stale"}
	if !st.Ready || fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("/status: ready %t, states %v; want ready, with %v", st.Ready, states, want)
	}
	if members := st.Resources[0].Members; !slices.Equal(members, []string{"betas.v1." + group, "gammas.v1." + group}) {
		t.Errorf("the entry's members %v; want betas and gammas", members)
	}
	if code, body, err := get(t.Context(), metrics+"/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz = %d %s %v with a Stale member; want 200", code, body, err)
	}
	if code, _, err := get(t.Context(), api+"/apis/"+group+"/v1/namespaces/"+ns+"/gammas"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("listing gammas, never listed: %d %v; want 503", code, err)
	}
}
