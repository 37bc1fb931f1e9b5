// Package chart tests the Helm chart in charts/dynwatch: lint and schema, server-side dry-run
// of every ci/ rendering against the real apiserver, the default config through dynwatch's own
// loader, and least privilege: the rendered RBAC lets dynwatch run, and nothing more.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

const chartDir = "../../charts/dynwatch"

var cluster *testbed.Cluster

// Every test here runs helm, which the test bed builds: under -short none runs.
func TestMain(m *testing.M) { os.Exit(testbed.MainAll(m, &cluster)) }

func ciValues(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if len(files) < 4 {
		t.Fatalf("found %d ci values files, want at least 4", len(files))
	}
	return files
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), cluster.Binaries.Helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func render(t *testing.T, namespace string, args ...string) string {
	t.Helper()
	out, err := helm(t, append([]string{"template", "dw", chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects splits a rendering into its objects.
func objects(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatal(err)
		}
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

func namespace(t *testing.T, name string) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	_, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

func TestLintStrictPassesForEveryCIValuesFile(t *testing.T) {
	for _, f := range ciValues(t) {
		if out, err := helm(t, "lint", "--strict", chartDir, "-f", f); err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
		} else if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("%s: %s", filepath.Base(f), out)
		}
	}
}

func TestBadValuesAreRefused(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"an unknown top-level value", "replicas: 2\n", "replicas"},
		{"a replica count that is no number", "replicaCount: two\n", "replicaCount"},
		{"a resource without version", "config: {resources: [{resource: pods}]}\n", "version"},
		{"no resources", "config: {resources: []}\n", "resources"},
		{"a metrics address without port", "config: {resources: [{version: v1, resource: pods}], metrics: {address: localhost}}\n", "address"},
		{"a secret mount without path", "secretMounts: [{secretName: x}]\n", "mountPath"},
		{"a state path off the state volume", "config: {resources: [{version: v1, resource: pods}], state: {path: /tmp/state.db}}\n", "path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(tt.values), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := helm(t, "lint", "--strict", chartDir, "-f", f)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("helm lint = %v; want a failure naming %q", err, tt.want)
			}
		})
	}
	// helm lint does not stop at a template's fail; helm template does.
	for _, exposed := range []string{"LoadBalancer", "NodePort"} {
		t.Run("a "+exposed+" Service without authentication", func(t *testing.T) {
			_, err := helm(t, "template", "dw", chartDir, "--set", "service.type="+exposed, "--set", "config.api.auth.mode=none")
			if err == nil || !strings.Contains(err.Error(), "without authentication") {
				t.Errorf("helm template = %v; want a refusal", err)
			}
		})
	}
	t.Run("cert-manager without an issuer", func(t *testing.T) {
		_, err := helm(t, "template", "dw", chartDir, "--set", "apiTLS.certManager.enabled=true")
		if err == nil || !strings.Contains(err.Error(), "apiTLS.certManager.issuerRef.name is required") {
			t.Errorf("helm template = %v; want the issuer message", err)
		}
	})
	t.Run("two replicas without leader election", func(t *testing.T) {
		_, err := helm(t, "template", "dw", chartDir, "--set", "replicaCount=2", "--set", "config.leaderElection.enabled=false")
		if err == nil || !strings.Contains(err.Error(), "replicaCount above 1 needs config.leaderElection.enabled") {
			t.Errorf("helm template = %v; want the leader election message", err)
		}
	})
	t.Run("a Lease in another namespace", func(t *testing.T) {
		_, err := helm(t, "template", "dw", chartDir, "--set", "config.leaderElection.namespace=elsewhere")
		if err == nil || !strings.Contains(err.Error(), "config.leaderElection.namespace must be the release's namespace") {
			t.Errorf("helm template = %v; want the namespace message", err)
		}
	})
	t.Run("a whole group without a group", func(t *testing.T) {
		_, err := helm(t, "template", "dw", chartDir, "--set", "config.resources[0].version=v1", "--set", "config.resources[0].resource=*")
		if err == nil || !strings.Contains(err.Error(), `config.resources[0]: resource "*" watches a whole API group and needs group`) {
			t.Errorf("helm template = %v; want the whole group message", err)
		}
	})
	t.Run("a resource named by kind only", func(t *testing.T) {
		_, err := helm(t, "template", "dw", chartDir, "--set", "config.resources[0].version=v1", "--set", "config.resources[0].kind=Pod", "--skip-schema-validation")
		if err == nil || !strings.Contains(err.Error(), "config.resources[0]: the chart derives RBAC from `resource`") {
			t.Errorf("helm template = %v; want the RBAC message", err)
		}
	})
}

// serviceMonitorCRD stands in for the Prometheus Operator's CRD, so its object can be checked.
const serviceMonitorCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"servicemonitors.monitoring.coreos.com"},
 "spec":{"group":"monitoring.coreos.com","scope":"Namespaced",
  "names":{"kind":"ServiceMonitor","plural":"servicemonitors","singular":"servicemonitor","listKind":"ServiceMonitorList"},
  "versions":[{"name":"v1","served":true,"storage":true,
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

// prometheusRuleCRD stands in for the Prometheus Operator's PrometheusRule CRD, likewise.
const prometheusRuleCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"prometheusrules.monitoring.coreos.com"},
 "spec":{"group":"monitoring.coreos.com","scope":"Namespaced",
  "names":{"kind":"PrometheusRule","plural":"prometheusrules","singular":"prometheusrule","listKind":"PrometheusRuleList"},
  "versions":[{"name":"v1","served":true,"storage":true,
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

// certificateCRD stands in for cert-manager's Certificate CRD, likewise.
const certificateCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"certificates.cert-manager.io"},
 "spec":{"group":"cert-manager.io","scope":"Namespaced",
  "names":{"kind":"Certificate","plural":"certificates","singular":"certificate","listKind":"CertificateList"},
  "versions":[{"name":"v1","served":true,"storage":true,
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

func TestEveryCIRenderingIsAcceptedByTheAPIServer(t *testing.T) {
	for _, ns := range []string{"dynwatch-dry-run", "team-a", "team-b", "monitoring"} {
		namespace(t, ns)
	}
	crd := filepath.Join(t.TempDir(), "crd.json")
	if err := os.WriteFile(crd, []byte(serviceMonitorCRD+"\n"+prometheusRuleCRD+"\n"+certificateCRD), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Kubectl(t.Context(), "apply", "--server-side", "-f", crd); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		_, err := cluster.Kubectl(t.Context(), "get", "servicemonitors,prometheusrules,certificates", "-A")
		return err
	})
	for _, f := range ciValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			manifests := filepath.Join(t.TempDir(), "manifests.yaml")
			if err := os.WriteFile(manifests, []byte(render(t, "dynwatch-dry-run", "-f", f)), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := cluster.Kubectl(t.Context(), "apply", "--server-side", "--dry-run=server", "-f", manifests)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// renderedConfig returns the config.yaml of the rendering's ConfigMap.
func renderedConfig(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	for _, o := range objs {
		if data, ok, _ := unstructured.NestedString(o.Object, "data", "config.yaml"); o.GetKind() == "ConfigMap" && ok {
			return data
		}
	}
	t.Fatal("the rendering has no ConfigMap")
	return ""
}

func TestRenderedConfigLoadsWithDynwatchsLoader(t *testing.T) {
	for _, args := range [][]string{nil, {"-f", filepath.Join(chartDir, "ci", "namespaced-values.yaml")}, {"-f", filepath.Join(chartDir, "ci", "full-values.yaml")}} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		rendered := renderedConfig(t, objects(t, render(t, "dw", args...)))
		if !strings.Contains(rendered, "path: /var/lib/dynwatch/state.db") {
			t.Errorf("values %v: the state store is not on the state volume:\n%s", args, rendered)
		}
		if err := os.WriteFile(path, []byte(rendered), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := config.Load(path); err != nil {
			t.Errorf("values %v: %v", args, err)
		}
	}
}

func TestRenderedRBACIsEnoughAndNoMore(t *testing.T) {
	release, watched, other := "dynwatch-lp", "lp-watched", "lp-other"
	for _, ns := range []string{release, watched, other} {
		namespace(t, ns)
	}
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON([]byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"gadgets.lp.example.com"},
 "spec":{"group":"lp.example.com","scope":"Namespaced","names":{"kind":"Gadget","plural":"gadgets","singular":"gadget","listKind":"GadgetList"},
  "versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`)); err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer receiver.Close()
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(fmt.Sprintf(`
config:
  resources:
    - {version: v1, resource: configmaps, namespaces: [%s]}
    - {group: lp.example.com, version: v1, resource: gadgets}
  webhooks:
    - {name: receiver, url: %s}
`, watched, receiver.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, release, "-f", values))
	kinds := applyRBAC(t, objs)
	if kinds["Role"] != 2 || kinds["RoleBinding"] != 2 || kinds["ClusterRole"] != 1 || kinds["ClusterRoleBinding"] != 2 || kinds["ServiceAccount"] != 1 {
		t.Fatalf("rendered RBAC objects %v; want a Role and binding for %s and for leader election, a ClusterRole and binding for gadgets, and the auth-delegator binding", kinds, watched)
	}

	// Something to checkpoint.
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().ConfigMaps(watched).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// dynwatch, as the ServiceAccount, with the rendered config: it must become ready.
	sa := "system:serviceaccount:" + release + ":dw-dynwatch"
	kubeconfig, err := cluster.KubeconfigAs(sa, "system:serviceaccounts", "system:serviceaccounts:"+release, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	p, caFile := startRendered(t, objs, kubeconfig, sa)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	// It leads, holding the release's Lease, and writes checkpoints to the release's ConfigMap.
	testbed.Eventually(t, 30*time.Second, func() error {
		lease, err := cs.CoordinationV1().Leases(release).Get(ctx, "dw-dynwatch", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("lease dw-dynwatch has no holder")
		}
		cm, err := cs.CoreV1().ConfigMaps(release).Get(ctx, "dw-dynwatch-checkpoints", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["checkpoints.json"] == "" {
			return fmt.Errorf("no checkpoints written to dw-dynwatch-checkpoints")
		}
		return nil
	})
	// Its query API authenticates and authorizes callers through the cluster with only the
	// rendered permissions: a TokenReview and a SubjectAccessReview behind every answer.
	api, _, _ := p.WaitListening(ctx)
	for _, c := range []struct {
		user, token string
		want        int
	}{{"admin", cluster.Token("admin"), 200}, {"carol", cluster.Token("carol"), 403}, {"nobody", "", 401}} {
		client, err := rest.HTTPClientFor(&rest.Config{Host: api, BearerToken: c.token, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Get(api + "/api/v1/namespaces/" + watched + "/configmaps")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("listing configmaps through dynwatch as %s: %d, want %d", c.user, resp.StatusCode, c.want)
		}
	}

	// And no more than it needs.
	checkAccess(t, release, []access{
		{"list", "", "configmaps", watched, "", true},
		{"watch", "", "configmaps", watched, "", true},
		{"list", "lp.example.com", "gadgets", "", "", true},
		{"list", "", "configmaps", other, "", false},
		{"get", "", "namespaces", "", "kube-system", true},
		{"get", "", "namespaces", "", "default", false},
		{"list", "", "namespaces", "", "", false},
		{"get", "about.k8s.io", "clusterproperties", "", "cluster.clusterset.k8s.io", true},
		{"get", "about.k8s.io", "clusterproperties", "", "other", false},
		{"list", "", "configmaps", "", "", false},
		{"list", "", "secrets", "", "", false},
		{"list", "", "secrets", watched, "", false},
		{"get", "", "secrets", release, "", false},
		{"create", "", "configmaps", watched, "", false},
		{"delete", "lp.example.com", "gadgets", watched, "", false},
		{"list", "apiextensions.k8s.io", "customresourcedefinitions", "", "", false},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", "gadgets.lp.example.com", true},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", "other.lp.example.com", false},
		{"list", "", "events", other, "", true}, // gadgets are watched in every namespace: describe lists their events
		{"watch", "", "events", other, "", false},
		{"get", "", "events", other, "", false},
		{"create", "authentication.k8s.io", "tokenreviews", "", "", true},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", "", true},
		{"get", "", "configmaps", "kube-system", "", false},
		{"create", "authentication.k8s.io", "tokenrequests", "", "", false},
		{"impersonate", "", "users", "", "", false},
		{"update", "coordination.k8s.io", "leases", release, "dw-dynwatch", true},
		{"update", "coordination.k8s.io", "leases", release, "other", false},
		{"create", "coordination.k8s.io", "leases", release, "", false},
		{"update", "", "configmaps", release, "dw-dynwatch-checkpoints", true},
		{"update", "", "configmaps", release, "dw-dynwatch", false},
		{"delete", "", "configmaps", release, "dw-dynwatch-checkpoints", false},
	})
}

// applyRBAC applies the rendering's ServiceAccount, roles, bindings, Lease and checkpoint
// ConfigMap to the test bed, and counts them by kind.
func applyRBAC(t *testing.T, objs []*unstructured.Unstructured) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	var rbac []*unstructured.Unstructured
	for _, o := range objs {
		if slices.Contains([]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Lease"}, o.GetKind()) ||
			o.GetKind() == "ConfigMap" && o.GetName() == "dw-dynwatch-checkpoints" {
			kinds[o.GetKind()]++
			rbac = append(rbac, o)
		}
	}
	apply(t, rbac)
	return kinds
}

// apply applies objs server-side, as admin, and returns the file it applied.
func apply(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	var manifest bytes.Buffer
	for _, o := range objs {
		b, _ := o.MarshalJSON()
		manifest.Write(append(b, '\n'))
	}
	path := filepath.Join(t.TempDir(), "manifests.json")
	if err := os.WriteFile(path, manifest.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cluster.Kubectl(t.Context(), "apply", "--server-side", "-f", path); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return path
}

// access is one request the release's ServiceAccount may or may not make.
type access struct {
	verb, group, resource, namespace, name string
	allowed                                bool
}

// checkAccess asks the apiserver, with a SubjectAccessReview each, whether the ServiceAccount
// dw-dynwatch of the release's namespace may make each request.
func checkAccess(t *testing.T, release string, tests []access) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, tt := range tests {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + release + ":dw-dynwatch",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + release, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: tt.verb, Group: tt.group, Resource: tt.resource, Namespace: tt.namespace, Name: tt.name,
			},
		}}
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tt.allowed {
			t.Errorf("%s %s.%s %q in %q: allowed=%v, want %v", tt.verb, tt.resource, tt.group, tt.name, tt.namespace, got.Status.Allowed, tt.allowed)
		}
	}
}

func TestAWholeGroupIsGrantedWholeAndNothingBeside(t *testing.T) {
	release, watched, other := "dynwatch-wg", "wg-watched", "wg-other"
	for _, ns := range []string{release, watched, other} {
		namespace(t, ns)
	}
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(fmt.Sprintf(`
config:
  resources:
    - {group: wg.example.com, version: "*", resource: "*", excludeResources: [secretwidgets], namespaces: [%s]}
`, watched)), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, release, "-f", values))
	if _, err := loadRendered(t, objs); err != nil {
		t.Fatalf("the rendered config does not load: %v", err)
	}
	if kinds := applyRBAC(t, objs); kinds["Role"] != 2 || kinds["ClusterRole"] != 1 {
		t.Fatalf("rendered RBAC objects %v; want a Role for %s and for leader election, and a ClusterRole for the CRDs", kinds, watched)
	}
	checkAccess(t, release, []access{
		{"list", "wg.example.com", "widgets", watched, "", true},
		{"watch", "wg.example.com", "gadgets", watched, "", true},
		{"get", "wg.example.com", "gadgets", watched, "g1", true},
		{"list", "wg.example.com", "secretwidgets", watched, "", true}, // RBAC cannot deny: documented
		{"list", "wg.example.com", "widgets", other, "", false},
		{"list", "wg.example.com", "widgets", "", "", false},
		{"delete", "wg.example.com", "widgets", watched, "w1", false},
		{"create", "wg.example.com", "widgets", watched, "", false},
		{"list", "other.example.com", "widgets", watched, "", false},
		{"list", "apps", "deployments", watched, "", false},
		{"list", "", "configmaps", watched, "", false},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.wg.example.com", true},
		{"list", "apiextensions.k8s.io", "customresourcedefinitions", "", "", false},
		{"list", "", "events", watched, "", true}, // kubectl describe
		{"list", "", "events", other, "", false},
	})
}

func TestTwoReplicasInAStatefulSetWithAVolumeEachAndOneAllowedDown(t *testing.T) {
	find := func(objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GetKind() == kind {
				return o
			}
		}
		t.Fatalf("no %s rendered", kind)
		return nil
	}
	stateVolume := func(sts *unstructured.Unstructured) map[string]any {
		volumes, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "volumes")
		for _, v := range volumes {
			if v := v.(map[string]any); v["name"] == "state" {
				return v
			}
		}
		return nil
	}
	objs := objects(t, render(t, "dw"))
	sts := find(objs, "StatefulSet")
	replicas, _, _ := unstructured.NestedFieldNoCopy(sts.Object, "spec", "replicas")
	if v := stateVolume(sts); fmt.Sprint(replicas) != "2" || v == nil || v["emptyDir"] == nil {
		t.Errorf("by default: %d replicas with state volume %v; want 2 with an emptyDir", replicas, v)
	}
	pdb := find(objs, "PodDisruptionBudget")
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v; want 1", v)
	}
	spread, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "topologySpreadConstraints")
	if len(spread) != 1 || spread[0].(map[string]any)["topologyKey"] != "kubernetes.io/hostname" || spread[0].(map[string]any)["labelSelector"] == nil {
		t.Errorf("topologySpreadConstraints = %v; want one across hostnames selecting the pods", spread)
	}
	lease := find(objs, "Lease")
	cfg, err := loadRendered(t, objs)
	if err != nil {
		t.Fatal(err)
	}
	if le := cfg.LeaderElection; !le.Enabled || le.Namespace != "dw" || le.LeaseName != lease.GetName() || le.CheckpointName != "dw-dynwatch-checkpoints" {
		t.Errorf("rendered leaderElection = %+v; want it on, with Lease %s and ConfigMap dw-dynwatch-checkpoints in dw", le, lease.GetName())
	}

	objs = objects(t, render(t, "dw", "-f", filepath.Join(chartDir, "ci", "persistence-values.yaml")))
	sts = find(objs, "StatefulSet")
	claims, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
	if len(claims) != 1 || claims[0].(map[string]any)["metadata"].(map[string]any)["name"] != "state" || stateVolume(sts) != nil {
		t.Errorf("with persistence: claim templates %v and state volume %v; want one claim template named state, and no pod volume", claims, stateVolume(sts))
	}
}

func TestTheDefaultRenderingIsSecure(t *testing.T) {
	objs := objects(t, render(t, "dw"))
	cfg, err := loadRendered(t, objs)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.API.Auth.Mode != config.AuthKubernetes || !cfg.API.TLS.Enabled || cfg.API.TLS.SelfSignedCAFile == "" ||
		!slices.Contains(cfg.API.TLS.SelfSignedHosts, "dw-dynwatch.dw.svc") {
		t.Errorf("default api settings %+v; want cluster auth and TLS for the Service's names", cfg.API)
	}
	var policy, delegator *unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "NetworkPolicy":
			policy = o
		case o.GetKind() == "ClusterRoleBinding" && strings.HasSuffix(o.GetName(), "-auth-delegator"):
			delegator = o
		}
	}
	if delegator == nil {
		t.Error("no system:auth-delegator binding")
	}
	if policy == nil {
		t.Fatal("no NetworkPolicy by default")
	}
	rules, _, _ := unstructured.NestedSlice(policy.Object, "spec", "ingress")
	if len(rules) != 2 {
		t.Fatalf("NetworkPolicy ingress %v; want one rule for api, one for metrics", rules)
	}
	metricsFrom, _, _ := unstructured.NestedSlice(rules[1].(map[string]any), "from")
	if len(metricsFrom) != 1 || !strings.Contains(fmt.Sprint(metricsFrom), "helm-test") {
		t.Errorf("metrics port open to %v by default; want only the chart's test pod", metricsFrom)
	}
	// With a Secret, the config points at its files and the pod mounts it.
	objs = objects(t, render(t, "dw", "--set", "apiTLS.secretName=dw-tls"))
	if rendered := renderedConfig(t, objs); !strings.Contains(rendered, "certFile: /etc/dynwatch/tls/tls.crt") || strings.Contains(rendered, "selfSigned") {
		t.Errorf("with apiTLS.secretName the config reads:\n%s", rendered)
	}
}

// loadRendered loads the rendering's config with dynwatch's loader, files not needing to exist.
func loadRendered(t *testing.T, objs []*unstructured.Unstructured) (*config.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(renderedConfig(t, objs)), 0o600); err != nil {
		t.Fatal(err)
	}
	return config.Load(path)
}

// startRendered runs dynwatch, built without the race detector, with the ConfigMap's config
// from the rendered objs and the given kubeconfig (the chart's ServiceAccount sa), on loopback
// ports and a state file of its own, and waits until it is ready; it stops when the test ends.
// It returns the process and the file of the CA its self-signed API certificate is signed by.
func startRendered(t *testing.T, objs []*unstructured.Unstructured, kubeconfig, sa string) (*runner.Process, string) {
	t.Helper()
	cfgPath, caFile := filepath.Join(t.TempDir(), "config.yaml"), filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(cfgPath, []byte(renderedConfig(t, objs)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := runner.Build(t.Context(), t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	p, err := runner.Start(runner.Options{Binary: bin, Config: cfgPath, Kubeconfig: kubeconfig,
		Env: []string{"DYNWATCH_API_ADDRESS=127.0.0.1:0", "DYNWATCH_METRICS_ADDRESS=127.0.0.1:0", "DYNWATCH_STATE_PATH=" + filepath.Join(t.TempDir(), "state.db"),
			"DYNWATCH_API_TLS_SELFSIGNEDCAFILE=" + caFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("dynwatch log:\n%s", p.Log())
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatalf("dynwatch as %s did not become ready: %v", sa, err)
	}
	return p, caFile
}

// TestTheHistoryReaderRoleGrantsTheRevisionsOfWhatKeepsHistoryAndNothingElse: with a history
// on configmaps and on a whole group, the chart's history-reader ClusterRole grants get on
// configmaps/revisions and on every revisions of the group, and nothing else; with no history
// it renders none.
func TestTheHistoryReaderRoleGrantsTheRevisionsOfWhatKeepsHistoryAndNothingElse(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
config:
  state: {path: /var/lib/dynwatch/state}
  resources:
    - {version: v1, resource: configmaps, history: {retain: 24h}}
    - {group: example.com, version: v1, resource: "*", history: {retain: 1h, maxBytes: 1073741824}}
    - {version: v1, resource: secrets}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	role := func(objs []*unstructured.Unstructured) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-history-reader") {
				return o
			}
		}
		return nil
	}
	r := role(objects(t, render(t, "hist", "-f", values)))
	if r == nil {
		t.Fatal("no history-reader ClusterRole rendered")
	}
	rules, _, _ := unstructured.NestedSlice(r.Object, "rules")
	got := fmt.Sprint(rules)
	want := "[map[apiGroups:[] resources:[configmaps/revisions] verbs:[get]] map[apiGroups:[example.com] resources:[*/revisions] verbs:[get]]]"
	if got != want {
		t.Fatalf("the history-reader grants %s; want %s", got, want)
	}
	if r := role(objects(t, render(t, "hist"))); r != nil {
		t.Fatalf("a history-reader ClusterRole rendered with no history: %v", r)
	}
}
