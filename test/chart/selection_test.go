package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestRenderedRBACFollowsANamespaceSelector renders a resource selected by namespace labels,
// applies the rendered RBAC, and runs dynwatch as the chart's ServiceAccount: it becomes ready,
// so the rules suffice, and a SubjectAccessReview for each permission shows they grant no more
// than listing and watching the namespaces and the resource cluster-wide.
func TestRenderedRBACFollowsANamespaceSelector(t *testing.T) {
	release := "dynwatch-sel"
	namespace(t, release)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
replicaCount: 1
config:
  leaderElection: {enabled: false}
  resources:
    - {version: v1, resource: configmaps, namespaceSelector: "team in (a, b)"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, release, "-f", values))
	var manifest bytes.Buffer
	for _, o := range objs {
		if slices.Contains([]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}, o.GetKind()) {
			b, _ := o.MarshalJSON()
			manifest.Write(append(b, '\n'))
		}
	}
	path := filepath.Join(t.TempDir(), "rbac.json")
	if err := os.WriteFile(path, manifest.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cluster.Kubectl(t.Context(), "apply", "--server-side", "-f", path); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	sa := "system:serviceaccount:" + release + ":dw-dynwatch"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + release, "system:authenticated"}
	kubeconfig, err := cluster.KubeconfigAs(sa, groups...)
	if err != nil {
		t.Fatal(err)
	}
	startRendered(t, objs, kubeconfig, sa)

	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, tt := range []struct {
		verb, resource, namespace string
		allowed                   bool
	}{
		{"list", "namespaces", "", true},
		{"watch", "namespaces", "", true},
		{"get", "namespaces", "", false},
		{"update", "namespaces", "", false},
		{"list", "configmaps", "", true},
		{"watch", "configmaps", "", true},
		{"update", "configmaps", "kube-system", false},
		{"list", "secrets", "", false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: sa, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tt.verb, Resource: tt.resource, Namespace: tt.namespace},
		}}
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tt.allowed {
			t.Errorf("%s %s in %q: allowed=%v, want %v", tt.verb, tt.resource, tt.namespace, got.Status.Allowed, tt.allowed)
		}
	}
}

// TestANamespaceSelectorWithLeaderElectionIsRefused: the chart turns leader election on by
// default, which a namespaceSelector does not support yet; the rendering says what to change.
func TestANamespaceSelectorWithLeaderElectionIsRefused(t *testing.T) {
	_, err := helm(t, "template", "dw", chartDir, "--set", "config.resources[0].version=v1", "--set", "config.resources[0].resource=pods",
		"--set", "config.resources[0].namespaceSelector=team=a")
	if err == nil || !strings.Contains(err.Error(), "config.resources[0].namespaceSelector is not supported with leader election yet") {
		t.Errorf("helm template = %v; want the leader election message", err)
	}
}
