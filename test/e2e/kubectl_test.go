package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// gizmoCRD is a custom resource with printer columns (one only for -o wide), a selectable
// field and categories of its own and "all".
const gizmoCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gizmos.parity.example.com}
spec:
  group: parity.example.com
  names: {plural: gizmos, singular: gizmo, kind: Gizmo, shortNames: [gz], categories: [all, parity]}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      selectableFields: [{jsonPath: .spec.color}]
      additionalPrinterColumns:
        - {name: Color, type: string, jsonPath: .spec.color, description: "The gizmo's colour."}
        - {name: Size, type: integer, jsonPath: .spec.size}
        - {name: Ready, type: boolean, jsonPath: .status.ready, priority: 1}
        - {name: Parts, type: string, jsonPath: ".spec.parts[*].name", priority: 1}
        - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          description: A gizmo, for comparing kubectl against dynwatch and the apiserver.
          properties:
            spec:
              type: object
              description: What the gizmo should be.
              properties:
                color: {type: string, description: The colour.}
                size: {type: integer, description: "How big, in units."}
                parts: {type: array, items: {type: object, properties: {name: {type: string}}}}
            status: {type: object, properties: {ready: {type: boolean}}}
`

var gizmoGVR = schema.GroupVersionResource{Group: "parity.example.com", Version: "v1", Resource: "gizmos"}

// installGizmoCRD installs gizmoCRD in the test bed, once for every parity fixture: a CRD is
// cluster-wide, and fixtures that start at once must not race to create it.
var installGizmoCRD = sync.OnceValue(func() error {
	path := filepath.Join(cluster.Dir, "gizmo-crd.yaml")
	if err := os.WriteFile(path, []byte(gizmoCRD), 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cache := "--cache-dir=" + filepath.Join(cluster.Dir, "kubectl-cache")
	if out, err := cluster.Kubectl(ctx, cache, "apply", "-f", path); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	if out, err := cluster.Kubectl(ctx, cache, "wait", "--for=condition=Established", "crd/gizmos.parity.example.com", "--timeout=30s"); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
})

// parityFixture is one dynwatch, with the secure defaults, watching every kind whose kubectl
// output the tests compare, events included, over objects made to exercise each column.
type parityFixture struct {
	dynwatchAPI
	ns         string
	nodes      []string
	kubeconfig string // kubectl against dynwatch, as admin
	// The crashing pod's last restart, and when the events were last seen: ages count from
	// them, and tick on while a test runs.
	restarted, eventsSeen time.Time
}

func startParity(t *testing.T) parityFixture {
	t.Helper()
	if err := installGizmoCRD(); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t)
	f := parityFixture{ns: ns, nodes: []string{ns + "-cp", ns + "-worker"}}
	f.restarted, f.eventsSeen = makeParityObjects(t, ns, f.nodes)

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, cluster.Kubeconfig, `
api: {address: "127.0.0.1:0", tls: {selfSignedCAFile: `+caFile+`}}
metrics: {address: "127.0.0.1:0"}
resources:
  - {version: v1, resource: configmaps}
  - {version: v1, resource: secrets}
  - {version: v1, resource: namespaces}
  - {version: v1, resource: pods}
  - {version: v1, resource: services}
  - {version: v1, resource: nodes}
  - {version: v1, resource: events}
  - {group: apps, version: v1, resource: deployments}
  - {group: apps, version: v1, resource: replicasets}
  - {group: parity.example.com, version: v1, resource: gizmos}
`)
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	f.dynwatchAPI = dynwatchAPI{url: url, caFile: caFile}
	f.kubeconfig = f.dynwatchAPI.kubeconfig(t, cluster.Config.BearerToken)
	return f
}

// makeParityObjects creates, in ns, objects whose statuses reach the interesting branches of
// each kind's columns (pods crashing, initialising, completed; services of every type; nodes
// ready and not), and events about some of them. It returns when the crashing pod last
// restarted (90 minutes ago) and when the events were last seen (five minutes ago, or a second
// more).
func makeParityObjects(t *testing.T, ns string, nodes []string) (restarted, eventsSeen time.Time) {
	t.Helper()
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Labels: map[string]string{"tier": "web"}},
		Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"c": {3}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"user": "u", "password": "p"}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "empty"}, Type: "example.com/empty"}, metav1.CreateOptions{}))

	past := metav1.NewTime(time.Now().Add(-90 * time.Minute).Truncate(time.Second))
	container := corev1.Container{Name: "app", Image: "nginx:1.27"}
	pods := []struct {
		name   string
		spec   corev1.PodSpec
		status corev1.PodStatus
	}{
		{"running", corev1.PodSpec{NodeName: nodes[0], Containers: []corev1.Container{container}, ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/ready"}}},
			corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}},
				Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: "example.com/ready", Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: past}}}}}},
		{"crashing", corev1.PodSpec{NodeName: nodes[1], Containers: []corev1.Container{container, {Name: "side", Image: "busybox"}}},
			corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.6"}}, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "app", RestartCount: 4, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: past}}},
				{Name: "side", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}},
		{"initialising", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}, {Name: "sidecar", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}, Containers: []corev1.Container{container}},
			corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "init", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}},
				{Name: "sidecar", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}}},
		{"completed", corev1.PodSpec{Containers: []corev1.Container{container}},
			corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "app", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}}}},
		{"pending", corev1.PodSpec{Containers: []corev1.Container{container}}, corev1.PodStatus{}},
	}
	for _, p := range pods {
		pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name}, Spec: p.spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.status.Phase != "" {
			pod.Status = p.status
			must(cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
		}
	}

	port := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	for _, svc := range []corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: port, ExternalIPs: []string{"192.0.2.10"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": "db"}, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nodeport"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "balanced"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unbalanced"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "external"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"}},
	} {
		created, err := cs.CoreV1().Services(ns).Create(ctx, &svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.Name == "balanced" {
			created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}, {Hostname: "lb.example.com"}}
			must(cs.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}))
		}
	}

	labels := map[string]string{"app": "web"}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{container, {Name: "log", Image: "fluent-bit:3"}}}}
	d, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Status = appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 2, ReadyReplicas: 1, AvailableReplicas: 1, ObservedGeneration: d.Generation}
	must(cs.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{}))
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}
	rs, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f", Labels: labels, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}}}}, Template: template}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs.Status = appsv1.ReplicaSetStatus{Replicas: 2, ReadyReplicas: 1}
	must(cs.AppsV1().ReplicaSets(ns).UpdateStatus(ctx, rs, metav1.UpdateOptions{}))

	for i, name := range nodes {
		labels := map[string]string{"kubernetes.io/hostname": name}
		if i == 0 {
			labels["node-role.kubernetes.io/control-plane"] = ""
		}
		node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Unschedulable: i == 1}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		ready := corev1.ConditionTrue
		if i == 1 {
			ready = corev1.ConditionFalse
		}
		node.Status = corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletReady", LastHeartbeatTime: past, LastTransitionTime: past}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.31.0.%d", i+10)}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", OSImage: "Debian GNU/Linux 12", KernelVersion: "6.1.0", Architecture: "amd64",
				ContainerRuntimeVersion: "containerd://2.1.0", OperatingSystem: "linux"},
		}
		must(cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}))
	}

	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventsSeen = makeEvent(t, ns, "settings.1", corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "settings", UID: cm.UID, APIVersion: "v1"}, "Reloaded", "settings reloaded by the app")
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "running", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	makeEvent(t, ns, "running.1", corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "running", UID: pod.UID, APIVersion: "v1", FieldPath: "spec.containers{app}"}, "Pulled", "Container image already present")
	makeObject(t, gizmoGVR, ns, map[string]any{"apiVersion": "parity.example.com/v1", "kind": "Gizmo", "metadata": map[string]any{"name": "sprocket"},
		"spec": map[string]any{"color": "red", "size": int64(3), "parts": []any{map[string]any{"name": "cog"}, map[string]any{"name": "axle"}}}})
	makeObject(t, gizmoGVR, ns, map[string]any{"apiVersion": "parity.example.com/v1", "kind": "Gizmo", "metadata": map[string]any{"name": "widget"},
		"spec": map[string]any{"color": "blue"}})
	return past.Time, eventsSeen
}

// makeEvent records a core v1 event about ref, seen twice, the last time five minutes ago,
// and returns that time as stored (in whole seconds).
func makeEvent(t *testing.T, ns, name string, ref corev1.ObjectReference, reason, message string) time.Time {
	t.Helper()
	first := metav1.NewTime(time.Now().Add(-2 * time.Hour))
	last := metav1.NewTime(time.Now().Add(-5 * time.Minute).Truncate(time.Second))
	if _, err := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().Events(ns).Create(t.Context(), &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: name}, InvolvedObject: ref, Reason: reason, Message: message, Type: corev1.EventTypeNormal,
		Count: 2, FirstTimestamp: first, LastTimestamp: last, Source: corev1.EventSource{Component: "parity-test", Host: "node-a"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return last.Time
}

func makeObject(t *testing.T, gvr schema.GroupVersionResource, ns string, obj map[string]any) {
	t.Helper()
	if _, err := dynamic.NewForConfigOrDie(cluster.Config).Resource(gvr).Namespace(ns).Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// runKubectl runs kubectl with kubeconfig ("" for the apiserver as admin) and returns what
// it printed, standard output then standard error, and whether it failed.
func runKubectl(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	if kubeconfig == "" {
		kubeconfig = cluster.Kubeconfig
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), cluster.Binaries.Kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", t.TempDir()}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String() + stderr.String(), err
}

// sameAsAPIServer waits until kubectl prints the same against dynwatch (kubeconfig) as
// against the apiserver (apiserverKubeconfig, "" for admin), the AGE cells given a second
// to agree; it returns that output. The two run at once, so that they print ages at nearly
// the same moment. It waits up to 30 s: after a change of the caller's rights, dynwatch's
// cached decision lasts api.auth's cache TTLs (10 s by default), and each kubectl run on a
// loaded machine takes seconds (15 s once ran out with the decision just renewed).
func sameAsAPIServer(t *testing.T, kubeconfig, apiserverKubeconfig string, args ...string) string {
	t.Helper()
	var want string
	testbed.Eventually(t, 30*time.Second, func() error {
		var (
			got        string
			werr, gerr error
			wg         sync.WaitGroup
		)
		wg.Go(func() { want, werr = runKubectl(t, apiserverKubeconfig, args...) })
		wg.Go(func() { got, gerr = runKubectl(t, kubeconfig, args...) })
		wg.Wait()
		if got != want || (werr == nil) != (gerr == nil) {
			return fmt.Errorf("kubectl %s\nagainst the apiserver (err %v):\n%s\nagainst dynwatch (err %v):\n%s", strings.Join(args, " "), werr, want, gerr, got) //nolint:errorlint // reports two errors, either may be nil
		}
		return nil
	})
	t.Logf("kubectl %s: the same against both:\n%s", strings.Join(args, " "), want)
	return want
}

// age is a cell that shows how long ago since was, in kubectl's words, through format.
type age struct {
	format string
	since  time.Time
}

// cells are the texts a server may print for a when it prints at some moment between from and
// to: an age ticks on while a test runs, and each server prints it at its own now.
func (a age) cells(from, to time.Time) []string {
	var cells []string
	for at := from.Add(-time.Second); !at.After(to.Add(time.Second)); at = at.Add(time.Second) {
		if cell := fmt.Sprintf(a.format, duration.HumanDuration(at.Sub(a.since))); !slices.Contains(cells, cell) {
			cells = append(cells, cell)
		}
	}
	return cells
}

func TestKubectlTablesMatchTheAPIServer(t *testing.T) {
	t.Parallel()
	f := startParity(t)
	// Ages the apiserver's output must show too, whichever moment it printed them at.
	ages := map[string]age{
		"pods":         {"4 (%s ago)", f.restarted},
		"events, wide": {"\n%s ", f.eventsSeen}, // a row starts with LAST SEEN
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string // cells the apiserver's output must contain, so the comparison compares something
	}{
		{"configmaps", []string{"get", "configmaps", "settings"}, []string{"DATA", "3"}},
		{"secrets", []string{"get", "secrets", "creds", "empty"}, []string{"TYPE", "Opaque", "2", "example.com/empty", "0"}},
		{"namespaces", []string{"get", "namespace", f.ns}, []string{"STATUS", "Active"}},
		{"pods", []string{"get", "pods"}, []string{"RESTARTS", "1/1", "CrashLoopBackOff", "Init:ImagePullBackOff", "0/2", "Completed", "Pending"}},
		{"pods, wide", []string{"get", "pods", "-o", "wide"}, []string{"NOMINATED NODE", "READINESS GATES", "10.0.0.5", f.nodes[0], "1/1"}},
		{"services", []string{"get", "services"}, []string{"CLUSTER-IP", "None", "192.0.2.10", "198.51.100.7,lb.example.com", "db.example.com", "<pending>", "80:3"}},
		{"services, wide", []string{"get", "services", "-o", "wide"}, []string{"SELECTOR", "app=web"}},
		{"deployments, wide", []string{"get", "deployments", "-o", "wide"}, []string{"UP-TO-DATE", "1/3", "app,log", "nginx:1.27,fluent-bit:3", "app=web"}},
		{"replicasets, wide", []string{"get", "replicasets", "-o", "wide"}, []string{"DESIRED", "app in (web)"}},
		{"nodes, wide", []string{"get", "nodes", f.nodes[0], f.nodes[1], "-o", "wide"}, []string{"ROLES", "control-plane", "NotReady,SchedulingDisabled", "172.31.0.10", "6.1.0 (amd64)", "containerd://2.1.0"}},
		{"events, wide", []string{"get", "events", "-o", "wide"}, []string{"LAST SEEN", "configmap/settings", "spec.containers{app}", "parity-test, node-a", "2"}},
		{"a CRD's printer columns", []string{"get", "gizmos"}, []string{"COLOR", "SIZE", "red", "3"}},
		{"a CRD's printer columns, wide", []string{"get", "gizmos", "-o", "wide"}, []string{"PARTS", "cog"}},
		{"one object", []string{"get", "pod", "crashing"}, []string{"1/2", "CrashLoopBackOff"}},
		{"no headers, with labels", []string{"get", "configmaps", "--no-headers", "--show-labels", "-l", "tier=web"}, []string{"tier=web"}},
		{"get all", []string{"get", "all"}, []string{"pod/running", "service/plain", "deployment.apps/web", "replicaset.apps/web-5d8f", "gizmo.parity.example.com/sprocket"}},
		{"a CRD's category", []string{"get", "parity"}, []string{"COLOR", "widget"}},
		{"a field selector the CRD declares", []string{"get", "gizmos", "--field-selector", "spec.color=blue"}, []string{"widget"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			from := time.Now()
			out := sameAsAPIServer(t, f.kubeconfig, "", append(tt.args, "-n", f.ns)...)
			to := time.Now()
			for _, cell := range tt.want {
				if !strings.Contains(out, cell) {
					t.Errorf("the apiserver's output lacks %q: the fixture is wrong\n%s", cell, out)
				}
			}
			if a, ok := ages[tt.name]; ok {
				if cells := a.cells(from, to); !slices.ContainsFunc(cells, func(cell string) bool { return strings.Contains(out, cell) }) {
					t.Errorf("the apiserver's output has none of %q: the fixture is wrong\n%s", cells, out)
				}
			}
		})
	}
}

func TestKubectlDescribeAndExplainMatchTheAPIServer(t *testing.T) {
	t.Parallel()
	f := startParity(t)
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"a configmap with its events from the cache", []string{"describe", "configmap", "settings", "-n", f.ns}, []string{"Data", "Reloaded", "settings reloaded by the app"}},
		{"a pod with its events", []string{"describe", "pod", "running", "-n", f.ns}, []string{"Containers:", "Pulled", "Container image already present"}},
		{"a deployment and its replica sets", []string{"describe", "deployment", "web", "-n", f.ns}, []string{"3 desired", "web-5d8f"}},
		{"a custom resource", []string{"describe", "gizmo", "sprocket", "-n", f.ns}, []string{"Color:", "red", "Events:"}},
		{"a field list (OpenAPI v3)", []string{"explain", "configmap"}, []string{"binaryData", "immutable"}},
		{"a nested field, recursively", []string{"explain", "deployment.spec.strategy", "--recursive"}, []string{"rollingUpdate", "maxSurge"}},
		{"a custom resource's schema", []string{"explain", "gizmos.spec"}, []string{"How big, in units.", "parts"}},
		{"OpenAPI v2", []string{"explain", "pods.spec.nodeName", "--output=plaintext-openapiv2"}, []string{"NodeName"}},
		{"a custom resource in OpenAPI v2", []string{"explain", "gizmo", "--output=plaintext-openapiv2"}, []string{"A gizmo, for comparing"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := sameAsAPIServer(t, f.kubeconfig, "", tt.args...)
			for _, s := range tt.want {
				if !strings.Contains(out, s) {
					t.Errorf("the apiserver's output lacks %q: the fixture is wrong\n%s", s, out)
				}
			}
		})
	}
	t.Run("explain does not describe a resource dynwatch does not serve", func(t *testing.T) {
		out, err := runKubectl(t, f.kubeconfig, "explain", "leases")
		if err == nil || !strings.Contains(out, `doesn't have a resource type "leases"`) {
			t.Fatalf("kubectl explain leases against dynwatch: err %v\n%s", err, out)
		}
	})
	t.Run("the OpenAPI documents hold only what is served", func(t *testing.T) {
		client := f.client(t, cluster.Config.BearerToken)
		var v2 struct {
			Paths       map[string]map[string]any `json:"paths"`
			Definitions map[string]any            `json:"definitions"`
		}
		getJSON(t, client, f.url+"/openapi/v2", &v2)
		for path, ops := range v2.Paths {
			if strings.Contains(path, "/leases") || strings.Contains(path, "/watch/") || strings.HasSuffix(path, "/status") {
				t.Errorf("/openapi/v2 documents %s, which dynwatch does not serve", path)
			}
			for op := range ops {
				if op != "get" && op != "parameters" {
					t.Errorf("/openapi/v2 documents %s %s; dynwatch only reads", op, path)
				}
			}
		}
		if _, ok := v2.Definitions["io.k8s.api.coordination.v1.Lease"]; ok {
			t.Error("/openapi/v2 defines Lease, which no served resource reaches")
		}
		if _, ok := v2.Paths["/api/v1/namespaces/{namespace}/configmaps/{name}"]; !ok {
			t.Errorf("/openapi/v2 lacks configmaps' path; it has %d paths", len(v2.Paths))
		}
		var v3 struct {
			Paths map[string]map[string]string `json:"paths"`
		}
		getJSON(t, client, f.url+"/openapi/v3", &v3)
		if _, ok := v3.Paths["apis/coordination.k8s.io/v1"]; ok || v3.Paths["api/v1"] == nil || v3.Paths["apis/parity.example.com/v1"] == nil {
			t.Errorf("/openapi/v3 lists %v; want the served group versions only", v3.Paths)
		}
	})
}

// TestDescribeReadsUnwatchedEventsWithTheCallersRights: events that dynwatch does not watch
// come from the apiserver, for a caller the cluster lets list them, as from the apiserver.
func TestDescribeReadsUnwatchedEventsWithTheCallersRights(t *testing.T) {
	t.Parallel()
	f := startAPI(t) // configmaps and pods; no events
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(t.Context(), "web-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	makeEvent(t, f.ns, "web-0.1", corev1.ObjectReference{Kind: "ConfigMap", Namespace: f.ns, Name: "web-0", UID: cm.UID, APIVersion: "v1"}, "Rotated", "keys rotated")

	t.Run("as admin", func(t *testing.T) {
		out := sameAsAPIServer(t, f.kubeconfig, "", "describe", "configmap", "web-0", "-n", f.ns)
		if !strings.Contains(out, "keys rotated") {
			t.Fatalf("describe shows no event:\n%s", out)
		}
	})
	t.Run("as a user who may read configmaps, then events too", func(t *testing.T) {
		user := "dave"
		grantConfigMapReads(t, nil, f.ns, user)
		apiserver := withToken(t, cluster.Kubeconfig, cluster.Token(user))
		dynwatch := withToken(t, f.kubeconfig, cluster.Token(user))
		out := sameAsAPIServer(t, dynwatch, apiserver, "describe", "configmap", "web-0", "-n", f.ns)
		if !strings.Contains(out, `cannot list resource "events"`) {
			t.Fatalf("describe without the right to list events printed:\n%s", out)
		}
		if _, err := f.cs.RbacV1().Roles(f.ns).Update(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "dynwatch"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		}}, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		out = sameAsAPIServer(t, dynwatch, apiserver, "describe", "configmap", "web-0", "-n", f.ns)
		if !strings.Contains(out, "keys rotated") {
			t.Fatalf("describe with the right to list events shows none:\n%s", out)
		}
	})
}

// TestAWatchFromAnExpiredResourceVersionEndsAsTheAPIServersDoes: 200 and one ERROR event
// carrying a 410 Expired Status, on the wire and through client-go.
func TestAWatchFromAnExpiredResourceVersionEndsAsTheAPIServersDoes(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{NoWatchCache: true})
	cs := kubernetes.NewForConfigOrDie(c.Config)
	ns := "expiry"
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(`
api: {address: "127.0.0.1:0", watchHistory: 5, tls: {selfSignedCAFile: `+caFile+`}}
metrics: {address: "127.0.0.1:0"}
resources: [{version: v1, resource: configmaps, namespaces: [`+ns+`]}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startReady(t, runner.Options{Config: cfg, Kubeconfig: c.Kubeconfig})
	url, _, _ := p.WaitListening(t.Context())
	d := dynwatchAPI{url: url, caFile: caFile}

	cm, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "churn"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expired := cm.ResourceVersion
	for i := range 10 { // more changes than dynwatch's history of 5 holds
		cm.Data = map[string]string{"i": fmt.Sprint(i)}
		if cm, err = cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CompactEtcd(t.Context()); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		got, err := dynamic.NewForConfigOrDie(d.restConfig(c.Config.BearerToken)).Resource(cmGVR).Namespace(ns).Get(t.Context(), "churn", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.GetResourceVersion() != cm.ResourceVersion {
			return fmt.Errorf("dynwatch has not seen the last change yet")
		}
		return nil
	})

	servers := map[string]*rest.Config{"apiserver": c.Config, "dynwatch": d.restConfig(c.Config.BearerToken)}
	for name, config := range servers {
		t.Run(name+" on the wire", func(t *testing.T) {
			client, err := rest.HTTPClientFor(config)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Get(config.Host + "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=5&resourceVersion=" + expired)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var ev struct {
				Type   string        `json:"type"`
				Object metav1.Status `json:"object"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil {
				t.Fatalf("%s: %s, and no event: %v", name, resp.Status, err)
			}
			if resp.StatusCode != http.StatusOK || ev.Type != "ERROR" || ev.Object.Code != http.StatusGone || ev.Object.Reason != metav1.StatusReasonExpired {
				t.Fatalf("%s answered %s, then %s %d %s %q; want 200, then ERROR 410 Expired", name, resp.Status, ev.Type, ev.Object.Code, ev.Object.Reason, ev.Object.Message)
			}
		})
		t.Run(name+" through client-go", func(t *testing.T) {
			cms := dynamic.NewForConfigOrDie(config).Resource(cmGVR).Namespace(ns)
			w, err := cms.Watch(t.Context(), metav1.ListOptions{ResourceVersion: expired})
			if err != nil {
				t.Fatalf("%s: the watch failed to start (%v); the apiserver's starts and ends with an ERROR event", name, err)
			}
			defer w.Stop()
			firstIsExpired(t, name, w)
		})
		t.Run(name+" through an informer", func(t *testing.T) {
			cms := dynamic.NewForConfigOrDie(config).Resource(cmGVR).Namespace(ns)
			lw := &expiringListWatch{}
			lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				list, err := cms.List(ctx, o)
				if err == nil && lw.lists.Add(1) == 1 {
					list.SetResourceVersion(expired) // the informer's first watch starts there
				}
				return list, err
			}
			lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return cms.Watch(ctx, o) }
			informer := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go informer.RunWithContext(ctx)
			testbed.Eventually(t, 15*time.Second, func() error {
				if n := lw.lists.Load(); n < 2 {
					return fmt.Errorf("%s: the informer listed %d times; after its watch expired it must list again", name, n)
				}
				return nil
			})
			late := "after-" + name
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: late}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testbed.Eventually(t, 15*time.Second, func() error {
				if _, ok, _ := informer.GetStore().GetByKey(ns + "/" + late); !ok {
					return fmt.Errorf("%s: the informer, relisted, has not seen %s", name, late)
				}
				return nil
			})
		})
		t.Run(name+" through a retrying watcher", func(t *testing.T) {
			cms := dynamic.NewForConfigOrDie(config).Resource(cmGVR).Namespace(ns)
			rw, err := watchtools.NewRetryWatcherWithContext(t.Context(), expired, &cache.ListWatch{
				WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return cms.Watch(ctx, o) },
			})
			if err != nil {
				t.Fatal(err)
			}
			defer rw.Stop()
			firstIsExpired(t, name, rw)
		})
	}
}

// TestDescribeShowsTheObjectWhenEventsCannotBeRead: with api.events none, or when the
// apiserver refuses dynwatch the events, describe still prints the object, with no events.
func TestDescribeShowsTheObjectWhenEventsCannotBeRead(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "quiet"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	makeEvent(t, ns, "quiet.1", corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "quiet", UID: cm.UID, APIVersion: "v1"}, "Touched", "someone touched it")
	// The user may read configmaps in ns and its cluster's id, and nothing else: as dynwatch's
	// identity, it cannot list events.
	user := "describer-" + ns
	grantConfigMapReads(t, nil, ns, user)
	grantClusterID(t, user)
	restricted, err := cluster.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, kubeconfig, events, warning string
	}{
		{"api.events none", cluster.Kubeconfig, "none", ""},
		{"the apiserver refuses dynwatch", restricted, "apiserver", "events could not be read from the apiserver"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			caFile := filepath.Join(t.TempDir(), "ca.crt")
			p := start(t, tt.kubeconfig, `
api: {address: "127.0.0.1:0", events: `+tt.events+`, auth: {mode: none}, tls: {selfSignedCAFile: `+caFile+`}}
metrics: {address: "127.0.0.1:0"}
resources: [{version: v1, resource: configmaps, namespaces: [`+ns+`]}]
`)
			if err := p.WaitReady(t.Context()); err != nil {
				t.Fatal(err)
			}
			url, _, _ := p.WaitListening(t.Context())
			out, err := runKubectl(t, dynwatchAPI{url: url, caFile: caFile}.kubeconfig(t, "unchecked"), "describe", "configmap", "quiet", "-n", ns)
			if err != nil || !strings.Contains(out, "Name:         quiet") || !strings.Contains(out, "Events:  <none>") || strings.Contains(out, "someone touched it") {
				t.Fatalf("describe (err %v) printed:\n%s\nwant the object, and no events", err, out)
			}
			if !strings.Contains(out, tt.warning) {
				t.Fatalf("describe printed no warning %q:\n%s", tt.warning, out)
			}
		})
	}
}

// firstIsExpired fails unless w's first event, within 15 s, is an ERROR with 410 Expired.
func firstIsExpired(t *testing.T, server string, w watch.Interface) {
	t.Helper()
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) {
			t.Fatalf("%s: first event %s %v; want ERROR with 410 Expired", server, ev.Type, ev.Object)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no event in 15s", server)
	}
}

// expiringListWatch is a list and watch (not a watch-list) whose list function the test sets,
// and which counts its lists.
type expiringListWatch struct {
	cache.ListWatch
	lists atomic.Int32
}

// IsWatchListSemanticsUnSupported makes the reflector list, then watch from the list's
// resourceVersion, rather than stream its initial list.
func (*expiringListWatch) IsWatchListSemanticsUnSupported() bool { return true }
