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
	corev1 "k8s.io/api/core/v1"
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

// TestTheHistoryAnswersPastListsAndOldWatchesAsTheApiserverDoes: 50 configmaps, each changed 20
// times by two field managers in turn, then half deleted, with history kept and api.watchHistory
// at 50 events. A paged list with resourceVersionMatch=Exact at a resourceVersion from the
// middle of the run answers, page by page, the items the apiserver answers for the same
// request, at the same resourceVersions; a watch from the first write's resourceVersion, more
// than 10 times api.watchHistory events back, gets every later change in order, as written;
// every object's revisions list all its versions, each naming the manager that wrote it, and
// the patch between its first and last version turns the one into the other.
func TestTheHistoryAnswersPastListsAndOldWatchesAsTheApiserverDoes(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s], history: {retain: 1h}}]
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 50}
metrics: {address: "127.0.0.1:0"}`, ns, filepath.Join(t.TempDir(), "state")))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, _, _ := p.WaitListening(t.Context())
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	cms := cs.CoreV1().ConfigMaps(ns)
	type write struct{ typ, name, rv string }
	var writes []write
	const objects, rounds = 50, 20
	for i := range objects {
		cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("h-%02d", i)}, Data: map[string]string{"round": "0"}},
			metav1.CreateOptions{FieldManager: "churn-a"})
		if err != nil {
			t.Fatal(err)
		}
		writes = append(writes, write{"ADDED", cm.Name, cm.ResourceVersion})
	}
	var middle string
	for round := 1; round <= rounds; round++ {
		manager := []string{"churn-a", "churn-b"}[round%2]
		for i := range objects {
			cm, err := cms.Get(t.Context(), fmt.Sprintf("h-%02d", i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cm.Data = map[string]string{"round": fmt.Sprint(round), manager: "yes"}
			if cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{FieldManager: manager}); err != nil {
				t.Fatal(err)
			}
			writes = append(writes, write{"MODIFIED", cm.Name, cm.ResourceVersion})
		}
		if round == rounds/2 {
			middle = writes[len(writes)-1].rv
		}
	}
	for i := 0; i < objects; i += 2 {
		name := fmt.Sprintf("h-%02d", i)
		if err := cms.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	apiserver, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	page := func(client *http.Client, base, query string) (items []string, next string, code int) {
		t.Helper()
		resp, err := client.Get(base + "/api/v1/namespaces/" + ns + "/configmaps?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Metadata metav1.ListMeta `json:"metadata"`
			Items    []metav1.PartialObjectMetadata
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		for _, it := range body.Items {
			items = append(items, it.Name+"@"+it.ResourceVersion)
		}
		return items, body.Metadata.Continue, resp.StatusCode
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if items, _, _ := page(http.DefaultClient, api, ""); len(items) != objects/2 {
			return fmt.Errorf("dynwatch lists %d configmaps; want %d", len(items), objects/2)
		}
		return nil
	})

	paged := func(client *http.Client, base string) []string {
		var all []string
		query := "resourceVersionMatch=Exact&limit=7&resourceVersion=" + middle
		for {
			items, next, code := page(client, base, query)
			if code != http.StatusOK {
				t.Fatalf("a page of the list at %s: %d", middle, code)
			}
			all = append(all, items...)
			if next == "" {
				return all
			}
			query = "limit=7&continue=" + next
		}
	}
	want, got := paged(apiserver, cluster.Config.Host), paged(http.DefaultClient, api)
	if len(want) != objects || !reflect.DeepEqual(got, want) {
		t.Fatalf("the paged list at %s:\ndynwatch      %v\nthe apiserver %v", middle, got, want)
	}

	// A watch from the first write: every change after it, in order.
	resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=60&resourceVersion=" + writes[0].rv)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for i := 0; i < objects; i += 2 {
		writes = append(writes, write{"DELETED", fmt.Sprintf("h-%02d", i), ""})
	}
	dec := json.NewDecoder(resp.Body)
	for i, w := range writes[1:] {
		var ev struct {
			Type   string
			Object struct {
				metav1.PartialObjectMetadata
				Message string `json:"message"`
			}
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event %d of %d from %s: %v", i, len(writes)-1, writes[0].rv, err)
		}
		if ev.Type != w.typ || ev.Object.Name != w.name || w.rv != "" && ev.Object.ResourceVersion != w.rv {
			t.Fatalf("event %d from %s: %s %s@%s %s; want %s %s@%s", i, writes[0].rv, ev.Type, ev.Object.Name, ev.Object.ResourceVersion, ev.Object.Message, w.typ, w.name, w.rv)
		}
	}

	// Every object's revisions.
	for i := range objects {
		name := fmt.Sprintf("h-%02d", i)
		resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps/" + name + "/revisions")
		if err != nil {
			t.Fatal(err)
		}
		var revs revisionList
		err = json.NewDecoder(resp.Body).Decode(&revs)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		versions := rounds + 1 + 1 - i%2 // the deleted ones have their delete too
		if len(revs.Items) != versions {
			t.Fatalf("%s has %d revisions; want %d", name, len(revs.Items), versions)
		}
		for j, it := range revs.Items[1-i%2:] {
			round := rounds - j
			if manager := []string{"churn-a", "churn-b"}[round%2]; len(it.Managers) != 1 || it.Managers[0].Manager != manager {
				t.Fatalf("%s's revision of round %d names %+v; want %s", name, round, it.Managers, manager)
			}
		}
		firstV, lastV := revs.Items[len(revs.Items)-1], revs.Items[1-i%2]
		resp, err = http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps/" + name + "/revisions?from=" + firstV.ResourceVersion + "&to=" + lastV.ResourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		patch, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		decoded, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatalf("%s's patch %s: %v", name, patch, err)
		}
		patched, err := decoded.Apply(firstV.Object)
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		_ = json.Unmarshal(patched, &a)
		_ = json.Unmarshal(lastV.Object, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s's first revision patched is %s; want %s", name, patched, lastV.Object)
		}
	}
}

// TestTheHistoryOutlivesARestartAndHoldsEveryVersionMadeWhileDown: a configmap changed twice,
// dynwatch stopped, the configmap changed twice more and another deleted, dynwatch started again
// on the same state: the revisions list every version, those made while it was down included
// (its watch resumes from the state store), and a list at a resourceVersion from before the
// stop is still answered as the apiserver answers it.
func TestTheHistoryOutlivesARestartAndHoldsEveryVersionMadeWhileDown(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	configPath := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, configPath, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s], history: {retain: 1h}}]
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}`, ns, filepath.Join(t.TempDir(), "state")))
	p := startProcess(t, configPath)
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	var rvs []string
	change := func(name, value string) {
		t.Helper()
		cm, err := cms.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			if cm, err = cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": value}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			cm.Data = map[string]string{"v": value}
			if cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if name == "kept" {
			rvs = append(rvs, cm.ResourceVersion)
		}
	}
	change("kept", "1")
	change("gone", "1")
	change("kept", "2")
	before := rvs[len(rvs)-1]
	revisions := func(api string) []string {
		resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps/kept/revisions")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list revisionList
		_ = json.NewDecoder(resp.Body).Decode(&list)
		var got []string
		for _, it := range list.Items {
			got = append([]string{it.ResourceVersion}, got...)
		}
		return got
	}
	api, _, _ := p.WaitListening(t.Context())
	testbed.Eventually(t, 30*time.Second, func() error {
		if got := revisions(api); !reflect.DeepEqual(got, rvs) {
			return fmt.Errorf("revisions %v; want %v", got, rvs)
		}
		return nil
	})
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	change("kept", "3")
	change("kept", "4")
	if err := cms.Delete(t.Context(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	p = startProcess(t, configPath)
	api, _, _ = p.WaitListening(t.Context())
	testbed.Eventually(t, 30*time.Second, func() error {
		if got := revisions(api); !reflect.DeepEqual(got, rvs) {
			return fmt.Errorf("revisions %v; want every version, those made while dynwatch was down too: %v", got, rvs)
		}
		return nil
	})
	names := func(client *http.Client, base string) []string {
		resp, err := client.Get(base + "/api/v1/namespaces/" + ns + "/configmaps?resourceVersionMatch=Exact&resourceVersion=" + before)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Items []metav1.PartialObjectMetadata
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		var out []string
		for _, it := range body.Items {
			out = append(out, it.Name+"@"+it.ResourceVersion)
		}
		return out
	}
	apiserver, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(http.DefaultClient, api), names(apiserver, cluster.Config.Host); len(want) != 2 || !reflect.DeepEqual(got, want) {
		t.Fatalf("the list at %s, from before the restart: dynwatch %v, the apiserver %v", before, got, want)
	}
}
