package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/dynwatch/dynwatch/test/testbed"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// apiFixture is one dynwatch serving the query API over configmaps and pods of the test bed,
// with the secure defaults: TLS with a generated CA, callers authenticated and authorized
// by the cluster. Its clients use the test bed's admin token.
type apiFixture struct {
	dynwatchAPI
	ns         string
	cs         *kubernetes.Clientset
	kubeconfig string       // kubectl against dynwatch, as admin
	client     *http.Client // trusts dynwatch's CA, sends the admin token
	metrics    string       // the metrics server's URL
}

func startAPI(t *testing.T) apiFixture {
	t.Helper()
	ns := namespace(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, cluster.Kubeconfig, `
api: {address: "127.0.0.1:0", maxPageSize: 50, tls: {selfSignedCAFile: `+caFile+`}}`+`
resources:
  - version: v1
    resource: configmaps
    indexers:
      - {name: byApp, type: label, key: app}
  - version: v1
    resource: pods
    indexers:
      - {name: byNode, type: jsonPath, path: "{.spec.nodeName}"}
metrics: {address: "127.0.0.1:0"}
`)
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, metrics, _ := p.WaitListening(t.Context())
	d := dynwatchAPI{url: url, caFile: caFile}
	f := apiFixture{dynwatchAPI: d, ns: ns, cs: kubernetes.NewForConfigOrDie(cluster.Config), metrics: metrics,
		kubeconfig: d.kubeconfig(t, cluster.Config.BearerToken), client: d.client(t, cluster.Config.BearerToken)}
	for i, app := range []string{"web", "web", "db", "cache"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", app, i), Labels: map[string]string{"app": app}}, Data: map[string]string{"i": fmt.Sprint(i)}}
		if _, err := f.cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, node := range []string{"n1", "n2", "n1"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i)}, Spec: corev1.PodSpec{
			NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "nginx:1.27"}},
		}}
		if _, err := f.cs.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// kubectl runs the test bed's kubectl with a kubeconfig for dynwatch, or ("") as admin
// against the real apiserver.
func kubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	if kubeconfig == "" {
		kubeconfig = cluster.Kubeconfig
	}
	base := []string{"--kubeconfig", kubeconfig, "--cache-dir", t.TempDir()}
	out, err := testbed.Kubectl(t.Context(), cluster.Binaries.Kubectl, append(base, args...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return string(out)
}

// namesOf returns the first two columns (or the first, without -A) of kubectl's table output,
// sorted, without the header: NAMESPACE and NAME.
func namesOf(out string, columns int) []string {
	var rows []string
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < columns {
			continue
		}
		rows = append(rows, strings.Join(f[:columns], "/"))
	}
	slices.Sort(rows)
	return rows
}

func TestKubectlGetsWhatTheAPIServerGets(t *testing.T) {
	f := startAPI(t)
	tests := []struct {
		name    string
		args    []string
		columns int
	}{
		{"all configmaps", []string{"get", "cm", "-A"}, 2},
		{"configmaps by label in a namespace", []string{"get", "cm", "-n", f.ns, "-l", "app=web"}, 1},
		{"configmaps by a set-based label selector", []string{"get", "cm", "-n", f.ns, "-l", "app in (db,cache)"}, 1},
		{"pods by node", []string{"get", "pods", "-A", "--field-selector", "spec.nodeName=n1"}, 2},
		{"pods not on a node", []string{"get", "pods", "-n", f.ns, "--field-selector", "spec.nodeName!=n1"}, 1},
		{"names only", []string{"get", "cm", "-n", f.ns, "-o", "name"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := namesOf(kubectl(t, "", tt.args...), tt.columns)
			if tt.args[len(tt.args)-1] == "name" {
				want = strings.Fields(kubectl(t, "", tt.args...))
			}
			if len(want) == 0 {
				t.Fatal("the apiserver returned nothing: the fixture is wrong")
			}
			testbed.Eventually(t, 10*time.Second, func() error {
				out := kubectl(t, f.kubeconfig, tt.args...)
				got := namesOf(out, tt.columns)
				if tt.args[len(tt.args)-1] == "name" {
					got = strings.Fields(out)
				}
				if !slices.Equal(got, want) {
					return fmt.Errorf("kubectl %s against dynwatch:\n%v\nagainst the apiserver:\n%v", strings.Join(tt.args, " "), got, want)
				}
				return nil
			})
		})
	}
	t.Run("one configmap as YAML", func(t *testing.T) {
		var fromAPI, fromDynwatch map[string]any
		if err := yaml.Unmarshal([]byte(kubectl(t, "", "get", "cm", "web-0", "-n", f.ns, "-o", "yaml")), &fromAPI); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(kubectl(t, f.kubeconfig, "get", "cm", "web-0", "-n", f.ns, "-o", "yaml")), &fromDynwatch); err != nil {
			t.Fatal(err)
		}
		for _, path := range [][]string{{"apiVersion"}, {"kind"}, {"data"}, {"metadata", "name"}, {"metadata", "namespace"}, {"metadata", "uid"}, {"metadata", "resourceVersion"}, {"metadata", "labels"}} {
			a, _, _ := unstructured.NestedFieldNoCopy(fromAPI, path...)
			d, _, _ := unstructured.NestedFieldNoCopy(fromDynwatch, path...)
			if fmt.Sprint(a) != fmt.Sprint(d) {
				t.Errorf("%s: apiserver %v, dynwatch %v", strings.Join(path, "."), a, d)
			}
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(fromDynwatch, "metadata", "managedFields"); found {
			t.Errorf("dynwatch served managedFields: it should serve the transformed object")
		}
	})
	t.Run("watch sees a later change", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cmd := exec.CommandContext(ctx, cluster.Binaries.Kubectl, "--kubeconfig", f.kubeconfig, "--cache-dir", t.TempDir(),
			"get", "cm", "-n", f.ns, "-w")
		var out testbed.LockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		testbed.Eventually(t, 10*time.Second, func() error {
			if !strings.Contains(out.String(), "web-0") {
				return fmt.Errorf("kubectl get -w printed %q, want the existing configmaps first", out.String())
			}
			return nil
		})
		if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-arrival"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 10*time.Second, func() error {
			if !strings.Contains(out.String(), "late-arrival") {
				return fmt.Errorf("kubectl get -w printed %q, want late-arrival", out.String())
			}
			return nil
		})
	})
}

func TestClientGoReadsFromDynwatch(t *testing.T) {
	t.Parallel()
	f := startAPI(t)
	dyn := dynamic.NewForConfigOrDie(f.restConfig(cluster.Config.BearerToken))
	configMaps := dyn.Resource(cmGVR).Namespace(f.ns)

	t.Run("list in pages", func(t *testing.T) {
		var names []string
		opts := metav1.ListOptions{Limit: 3}
		pages := 0
		testbed.Eventually(t, 10*time.Second, func() error {
			names, pages, opts.Continue = nil, 0, ""
			for {
				list, err := configMaps.List(t.Context(), opts)
				if err != nil {
					return err
				}
				pages++
				for _, item := range list.Items {
					names = append(names, item.GetName())
				}
				if list.GetContinue() == "" {
					break
				}
				if rem := list.GetRemainingItemCount(); rem == nil || *rem <= 0 {
					return fmt.Errorf("a page with a continue token has remainingItemCount %v", rem)
				}
				opts.Continue = list.GetContinue()
			}
			if len(names) != 4 {
				return fmt.Errorf("listed %v", names)
			}
			return nil
		})
		if want := []string{"cache-3", "db-2", "web-0", "web-1"}; !slices.Equal(names, want) || pages != 2 {
			t.Fatalf("paged list = %v in %d pages, want %v in 2", names, pages, want)
		}
	})
	t.Run("get", func(t *testing.T) {
		obj, err := configMaps.Get(t.Context(), "db-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if obj.GetKind() != "ConfigMap" || obj.GetAPIVersion() != "v1" || obj.GetLabels()["app"] != "db" {
			t.Fatalf("got %s %s labels %v", obj.GetAPIVersion(), obj.GetKind(), obj.GetLabels())
		}
	})
	t.Run("watch from a list's resourceVersion", func(t *testing.T) {
		list, err := configMaps.List(t.Context(), metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		w, err := configMaps.Watch(t.Context(), metav1.ListOptions{LabelSelector: "app=web", ResourceVersion: list.GetResourceVersion()})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(t.Context(), "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Labels["app"] = "retired" // leaves the selector: a DELETED for this watch
		if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-w.ResultChan():
			obj, _ := ev.Object.(*unstructured.Unstructured)
			if ev.Type != watch.Deleted || obj == nil || obj.GetName() != "web-0" {
				t.Fatalf("watch event %s %v, want DELETED web-0 (it left the selector)", ev.Type, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event within 10s")
		}
	})
	t.Run("an informer syncs and follows", func(t *testing.T) {
		factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, f.ns, nil)
		informer := factory.ForResource(cmGVR).Informer()
		ctx, cancel := context.WithCancel(t.Context())
		defer func() { cancel(); factory.Shutdown() }()
		factory.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			t.Fatal("informer did not sync against dynwatch")
		}
		if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "seen-by-informer"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 10*time.Second, func() error {
			if _, ok, _ := informer.GetStore().GetByKey(f.ns + "/seen-by-informer"); !ok {
				return fmt.Errorf("the informer's store lacks seen-by-informer; it holds %v", informer.GetStore().ListKeys())
			}
			return nil
		})
	})
}

func TestBadRequestsGetKubernetesStatuses(t *testing.T) {
	t.Parallel()
	f := startAPI(t)
	cms := "/api/v1/namespaces/" + f.ns + "/configmaps"
	tests := []struct {
		name, method, path string
		code               int
		reason             metav1.StatusReason
		mention            string
	}{
		{"an unknown resource", "GET", "/api/v1/widgets", 404, metav1.StatusReasonNotFound, ""},
		{"an unknown group", "GET", "/apis/nowhere.example.com/v1/things", 404, metav1.StatusReasonNotFound, ""},
		{"a missing object", "GET", cms + "/missing", 404, metav1.StatusReasonNotFound, "missing"},
		{"a namespaced object without namespace", "GET", "/api/v1/configmaps/web-0", 404, metav1.StatusReasonNotFound, ""},
		{"a bad label selector", "GET", cms + "?labelSelector=app+in+(web", 400, metav1.StatusReasonBadRequest, "labelSelector"},
		{"a bad field selector", "GET", cms + "?fieldSelector=spec.nodeName", 400, metav1.StatusReasonBadRequest, "fieldSelector"},
		{"a field the apiserver does not select on", "GET", cms + "?fieldSelector=data.key%3Dx", 400, metav1.StatusReasonBadRequest, "field label not supported: data.key"},
		{"a pod field the apiserver does not select on", "GET", "/api/v1/pods?fieldSelector=spec.hostname%3Dx", 400, metav1.StatusReasonBadRequest, "field label not supported: spec.hostname"},
		{"a watch with a field the apiserver does not select on", "GET", cms + "?watch=true&fieldSelector=data.key%3Dx", 400, metav1.StatusReasonBadRequest, "field label not supported"},
		{"a negative limit", "GET", cms + "?limit=-1", 400, metav1.StatusReasonBadRequest, "limit"},
		{"a limit that is no number", "GET", cms + "?limit=ten", 400, metav1.StatusReasonBadRequest, "limit"},
		{"a bad continue token", "GET", cms + "?limit=1&continue=garbage", 400, metav1.StatusReasonBadRequest, "continue"},
		{"an unknown index", "GET", cms + "?index=byColour&value=red", 400, metav1.StatusReasonBadRequest, "index"},
		{"an index without value", "GET", cms + "?index=byApp", 400, metav1.StatusReasonBadRequest, "index"},
		{"a resourceVersion that is no number", "GET", cms + "?watch=true&resourceVersion=abc", 400, metav1.StatusReasonBadRequest, "resourceVersion"},
		{"a create", "POST", cms, 405, metav1.StatusReasonMethodNotAllowed, ""},
		{"an update", "PUT", cms + "/web-0", 405, metav1.StatusReasonMethodNotAllowed, ""},
		{"a patch", "PATCH", cms + "/web-0", 405, metav1.StatusReasonMethodNotAllowed, ""},
		{"a delete", "DELETE", cms + "/web-0", 405, metav1.StatusReasonMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, f.url+tt.path, strings.NewReader("{}"))
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st metav1.Status
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatalf("body is not a Status: %v", err)
			}
			if resp.StatusCode != tt.code || st.Code != int32(tt.code) || st.Reason != tt.reason || st.Kind != "Status" {
				t.Errorf("%s %s = %d %s/%s (%q), want %d %s", tt.method, tt.path, resp.StatusCode, st.Kind, st.Reason, st.Message, tt.code, tt.reason)
			}
			if !strings.Contains(st.Message, tt.mention) {
				t.Errorf("message %q does not name %q", st.Message, tt.mention)
			}
		})
	}
	t.Run("refusals are counted under the route asked for", func(t *testing.T) {
		_, body, err := get(t.Context(), f.metrics+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for _, series := range []string{`dynwatch_api_requests_total{code="400",route="list"} 9`, `dynwatch_api_requests_total{code="400",route="watch"} 2`,
			`dynwatch_api_requests_total{code="404",route="get"} 2`, `dynwatch_api_requests_total{code="405",route="write"} 4`} {
			if !strings.Contains(body, series+"\n") {
				t.Errorf("/metrics lacks %s", series)
			}
		}
		if strings.Contains(body, `route="other"`) && strings.Contains(body, `dynwatch_api_requests_total{code="400",route="other"}`) {
			t.Errorf("400s are counted under route other")
		}
	})
}

func TestIndexesServeSelectorsAndExplicitQueries(t *testing.T) {
	t.Parallel()
	f := startAPI(t)
	tests := []struct {
		name, query, lookup string
		want                []string
	}{
		{"a label equality uses the label indexer", "labelSelector=app%3Dweb", "index/byApp", []string{"web-0", "web-1"}},
		{"a label set uses the label indexer", "labelSelector=app+in+(db,cache)", "index/byApp", []string{"cache-3", "db-2"}},
		{"a label inequality scans the namespace in key order", "labelSelector=app!%3Dweb", "scan", []string{"cache-3", "db-2"}},
		{"an explicit index query", "index=byApp&value=db", "index/byApp", []string{"db-2"}},
		{"an explicit index query with a selector", "index=byApp&value=web&fieldSelector=metadata.name%3Dweb-1", "index/byApp", []string{"web-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testbed.Eventually(t, 10*time.Second, func() error {
				return checkList(t, f.client, f.url+"/api/v1/namespaces/"+f.ns+"/configmaps?"+tt.query, tt.lookup, tt.want)
			})
		})
	}
	t.Run("a field equality uses the jsonPath indexer", func(t *testing.T) {
		testbed.Eventually(t, 10*time.Second, func() error {
			return checkList(t, f.client, f.url+"/api/v1/pods?fieldSelector=spec.nodeName%3Dn1,metadata.namespace%3D"+f.ns, "index/byNode", []string{"pod-0", "pod-2"})
		})
	})
	t.Run("no namespace and no usable index scans", func(t *testing.T) {
		testbed.Eventually(t, 10*time.Second, func() error {
			return checkList(t, f.client, f.url+"/api/v1/pods?fieldSelector=spec.nodeName!%3Dn1,metadata.namespace%3D"+f.ns, "scan", []string{"pod-1"})
		})
	})
}

func checkList(t *testing.T, client *http.Client, url, lookup string, want []string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var list unstructured.UnstructuredList
	var raw bytes.Buffer
	if _, err := raw.ReadFrom(resp.Body); err != nil {
		return err
	}
	if err := list.UnmarshalJSON(raw.Bytes()); err != nil {
		return fmt.Errorf("%s: %w: %s", url, err, raw.String())
	}
	var got []string
	for _, item := range list.Items {
		got = append(got, item.GetName())
	}
	if !slices.Equal(got, want) || resp.Header.Get("X-Dynwatch-Lookup") != lookup {
		return fmt.Errorf("%s: %v via %s, want %v via %s", url, got, resp.Header.Get("X-Dynwatch-Lookup"), want, lookup)
	}
	return nil
}
