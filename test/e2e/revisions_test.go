package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// revisionList is the body of a revisions subresource.
type revisionList struct {
	Kind  string `json:"kind"`
	Items []struct {
		ResourceVersion string          `json:"resourceVersion"`
		Type            string          `json:"type"`
		Managers        fieldManagers   `json:"managers"`
		Object          json.RawMessage `json:"object"`
	} `json:"items"`
}

// TestAnObjectsRevisionsAndTheDeletedObjectsAreServedUnderTheCallersRBAC: a configmap applied
// by tool-a, patched by tool-b and labelled by kubectl, and another created and deleted, with
// history kept: the object's revisions subresource lists its three versions newest first, each
// at the apiserver's resourceVersion and naming the manager that made it; the JSON Patch
// between the first and the last turns the one into the other; a list with deleted=true has the
// deleted one and not the other. A caller with get on configmaps but not configmaps/revisions
// gets 403, as a caller with neither gets 403 on the deleted list; a resource without history
// answers 404 naming the setting.
func TestAnObjectsRevisionsAndTheDeletedObjectsAreServedUnderTheCallersRBAC(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s], history: {retain: 1h}}
  - {version: v1, resource: serviceaccounts, namespaces: [%s]}
state: {path: %s}
api:
  address: "127.0.0.1:0"
  tls: {selfSignedCAFile: %s}
  auth: {clientCAFile: %s}
metrics: {address: "127.0.0.1:0"}
`, ns, ns, filepath.Join(t.TempDir(), "state"), caFile, cluster.ClientCAFile()))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	reader, auditor := "reader-"+ns, "auditor-"+ns
	for user, resources := range map[string][]string{reader: {"configmaps", "serviceaccounts"}, auditor: {"configmaps", "configmaps/revisions", "serviceaccounts", "serviceaccounts/revisions"}} {
		if _, err := cs.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: resources, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	as := func(user string) *http.Client {
		certFile, keyFile, err := cluster.ClientCert(user)
		if err != nil {
			t.Fatal(err)
		}
		c, err := rest.HTTPClientFor(caller{certFile: certFile, keyFile: keyFile}.config(url, caFile, nil))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	get := func(c *http.Client, path string) (int, []byte) {
		t.Helper()
		resp, err := c.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}

	manifest := filepath.Join(t.TempDir(), "cm.yaml")
	writeFile(t, manifest, fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: tracked, namespace: %s}\ndata: {k: v}\n", ns))
	kubectl(t, "", "apply", "--server-side", "--field-manager=tool-a", "-f", manifest)
	kubectl(t, "", "patch", "configmap", "tracked", "-n", ns, "--field-manager=tool-b", "--type=merge", "-p", `{"data":{"l":"w"}}`)
	kubectl(t, "", "label", "configmap", "tracked", "-n", ns, "tier=gold")
	kubectl(t, "", "create", "configmap", "gone", "-n", ns)
	kubectl(t, "", "delete", "configmap", "gone", "-n", ns)
	current, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "tracked", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	auditing := as(auditor)
	revisions := "/api/v1/namespaces/" + ns + "/configmaps/tracked/revisions"
	var list revisionList
	testbed.Eventually(t, 30*time.Second, func() error {
		code, body := get(auditing, revisions)
		if code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		list = revisionList{}
		if err := json.Unmarshal(body, &list); err != nil {
			return err
		}
		if len(list.Items) < 3 || list.Items[0].ResourceVersion != current.ResourceVersion {
			return fmt.Errorf("%d revisions, the newest at %v; want 3, the newest at %s", len(list.Items), list.Items, current.ResourceVersion)
		}
		return nil
	})
	want := []struct{ typ, manager string }{{"MODIFIED", "kubectl-label"}, {"MODIFIED", "tool-b"}, {"ADDED", "tool-a"}}
	if list.Kind != "RevisionList" || len(list.Items) != len(want) {
		t.Fatalf("a %s of %d revisions; want a RevisionList of %d", list.Kind, len(list.Items), len(want))
	}
	for i, w := range want {
		it := list.Items[i]
		if it.Type != w.typ || len(it.Managers) != 1 || it.Managers[0].Manager != w.manager {
			t.Errorf("revision %d: %s by %+v; want %s by %s", i, it.Type, it.Managers, w.typ, w.manager)
		}
		var meta struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(it.Object, &meta); err != nil || meta.Metadata.ResourceVersion != it.ResourceVersion {
			t.Errorf("revision %d at %s holds an object at %q (%v)", i, it.ResourceVersion, meta.Metadata.ResourceVersion, err)
		}
	}
	first, last := list.Items[2], list.Items[0]
	code, patch := get(auditing, revisions+"?from="+first.ResourceVersion+"&to="+last.ResourceVersion)
	if code != http.StatusOK {
		t.Fatalf("the patch between the first and the last revision: %d %s", code, patch)
	}
	p6902, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("the patch %s: %v", patch, err)
	}
	patched, err := p6902.Apply(first.Object)
	if err != nil {
		t.Fatalf("applying %s to the first revision: %v", patch, err)
	}
	var got, wantObj any
	_ = json.Unmarshal(patched, &got)
	_ = json.Unmarshal(last.Object, &wantObj)
	if !reflect.DeepEqual(got, wantObj) {
		t.Fatalf("the first revision patched is\n%s\nwant the last\n%s", patched, last.Object)
	}

	deleted := "/api/v1/namespaces/" + ns + "/configmaps?deleted=true"
	testbed.Eventually(t, 30*time.Second, func() error {
		code, body := get(auditing, deleted)
		if code != http.StatusOK || !strings.Contains(string(body), `"name":"gone"`) || strings.Contains(string(body), `"name":"tracked"`) {
			return fmt.Errorf("the deleted configmaps: %d %s; want gone and not tracked", code, body)
		}
		return nil
	})

	reading := as(reader)
	if code, body := get(reading, "/api/v1/namespaces/"+ns+"/configmaps/tracked"); code != http.StatusOK {
		t.Fatalf("a get as %s: %d %s", reader, code, body)
	}
	if code, body := get(reading, revisions); code != http.StatusForbidden || !strings.Contains(string(body), "configmaps/revisions") {
		t.Fatalf("revisions as %s, who may get configmaps but not configmaps/revisions: %d %s; want 403", reader, code, body)
	}
	if code, body := get(as("nobody-"+ns), deleted); code != http.StatusForbidden {
		t.Fatalf("the deleted configmaps as a caller with no rights: %d %s; want 403", code, body)
	}
	if code, body := get(auditing, "/api/v1/namespaces/"+ns+"/serviceaccounts/default/revisions"); code != http.StatusNotFound || !strings.Contains(string(body), "history.retain") {
		t.Fatalf("revisions of a resource without history: %d %s; want 404 naming history.retain", code, body)
	}
}
