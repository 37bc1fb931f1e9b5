package chart

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRenderedRBACFollowsANamespaceSelector renders a resource selected by namespace labels,
// with the chart's defaults (two replicas, leader election), applies the rendered RBAC, and runs dynwatch as the chart's ServiceAccount: it becomes ready,
// so the rules suffice, and a SubjectAccessReview for each permission shows they grant no more
// than listing and watching the namespaces and the resource cluster-wide.
func TestRenderedRBACFollowsANamespaceSelector(t *testing.T) {
	release := "dynwatch-sel"
	namespace(t, release)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
config:
  resources:
    - {version: v1, resource: configmaps, namespaceSelector: "team in (a, b)"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, release, "-f", values))
	applyRBAC(t, objs)
	sa := "system:serviceaccount:" + release + ":dw-dynwatch"
	kubeconfig, err := cluster.KubeconfigAs(sa, "system:serviceaccounts", "system:serviceaccounts:"+release, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	startRendered(t, objs, kubeconfig, sa)
	checkAccess(t, release, []access{
		{verb: "list", resource: "namespaces", allowed: true},
		{verb: "watch", resource: "namespaces", allowed: true},
		{verb: "get", resource: "namespaces"},
		{verb: "update", resource: "namespaces"},
		{verb: "list", resource: "configmaps", allowed: true},
		{verb: "watch", resource: "configmaps", allowed: true},
		{verb: "update", resource: "configmaps", namespace: "kube-system"},
		{verb: "list", resource: "secrets"},
	})
}
