package chart

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestWithSubscriptionsEnabledTheChartLetsATeamSubscribeAndDynwatchDeliverWithItsGrants:
// the rendering with subscriptions.enabled installs the CRD and admission policies; carol,
// bound to the chart's subscriptions-edit role (labelled to aggregate into edit and admin) and
// to a role reading configmaps in one namespace, may create a Subscription there, which records her as its
// subject; dynwatch, as the
// release's ServiceAccount with only the rendered RBAC, marks it Ready and delivers her
// namespace's configmaps to it.
func TestWithSubscriptionsEnabledTheChartLetsATeamSubscribeAndDynwatchDeliverWithItsGrants(t *testing.T) {
	release, team := "dynwatch-subs", "subs-team"
	for _, ns := range []string{release, team} {
		namespace(t, ns)
	}
	var mu sync.Mutex
	var got []string
	receiver := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		var ev struct { // a CloudEvent in binary mode: the body is the event's data
			Object struct {
				Metadata struct{ Namespace, Name string }
			}
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err == nil {
			mu.Lock()
			got = append(got, ev.Object.Metadata.Namespace+"/"+ev.Object.Metadata.Name)
			mu.Unlock()
		}
	}))
	defer receiver.Close()
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("config:\n  resources:\n    - {version: v1, resource: configmaps}\n  subscriptions: {reviewEvery: 5s, egress: {allow: [127.0.0.1/32]}}\nsubscriptions:\n  enabled: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, release, "-f", values))
	var installed []*unstructured.Unstructured
	for _, o := range objs {
		if slices.Contains([]string{"CustomResourceDefinition", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, o.GetKind()) {
			installed = append(installed, o)
		}
	}
	apply(t, installed)
	applyRBAC(t, objs)
	// The test bed runs no controller manager, whose aggregation controller would add the
	// chart's roles to admin, edit and view: the test checks their labels, and binds them.
	edit := release + "-dw-dynwatch-subscriptions-edit"
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == edit {
			if l := o.GetLabels(); l["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" || l["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
				t.Errorf("the ClusterRole %s is not aggregated to edit and admin: labels %v", edit, l)
			}
		}
	}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "subs-configmap-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{edit, "subs-configmap-reader"} {
		if _, err := cs.RbacV1().RoleBindings(team).Create(t.Context(), &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "carol-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "carol"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	gvr := schema.GroupVersionResource{Group: "events.dynwatch.io", Version: "v1alpha1", Resource: "subscriptions"}
	carol := dynamic.NewForConfigOrDie(&rest.Config{Host: cluster.URL(), BearerToken: cluster.Token("carol"), TLSClientConfig: rest.TLSClientConfig{CAData: cluster.Config.CAData}})
	sub := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "events.dynwatch.io/v1alpha1", "kind": "Subscription", "metadata": map[string]any{"name": "changes"},
		"spec": map[string]any{"url": receiver.URL, "resources": []any{"configmaps"}},
	}}
	// The CRD, the aggregation into edit and the policies each take a moment to be in effect.
	testbed.Eventually(t, 60*time.Second, func() error {
		created, err := carol.Resource(gvr).Namespace(team).Create(t.Context(), sub, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if u, _, _ := unstructured.NestedString(created.Object, "spec", "subject", "username"); u != "carol" {
			_ = carol.Resource(gvr).Namespace(team).Delete(t.Context(), "changes", metav1.DeleteOptions{})
			return fmt.Errorf("the subscription was stored with subject %q, want carol: the mutating policy is not in effect yet", u)
		}
		return nil
	})

	sa := "system:serviceaccount:" + release + ":dw-dynwatch"
	kubeconfig, err := cluster.KubeconfigAs(sa, "system:serviceaccounts", "system:serviceaccounts:"+release, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	startRendered(t, objs, kubeconfig, sa)
	admin := dynamic.NewForConfigOrDie(cluster.Config)
	testbed.Eventually(t, 60*time.Second, func() error {
		u, err := admin.Resource(gvr).Namespace(team).Get(t.Context(), "changes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if c := c.(map[string]any); c["type"] == "Ready" && c["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("the subscription is not Ready: %v", conds)
	})
	if _, err := cs.CoreV1().ConfigMaps(team).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(got, team+"/hello") {
			return fmt.Errorf("the receiver has %v, not yet %s/hello", got, team)
		}
		return nil
	})
}
