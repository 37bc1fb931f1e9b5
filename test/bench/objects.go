package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
)

// load creates o.objects objects of o.resource in the namespace, 16 at a time, and returns
// the size in bytes of the first as the apiserver serves it in JSON.
func load(ctx context.Context, cs kubernetes.Interface, o options) (int, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	resource, n := o.resource, o.objects
	create := applyConfigMap
	switch {
	case resource == "pods":
		create = applyPod
	case o.small:
		create = createSmallConfigMap
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := create(ctx, cs, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces", namespace, resource, objectName(resource, 0)).DoRaw(ctx)
	return len(b), err
}

// reader is the test bed's user every request to dynwatch's API, and every query timed
// against it at the apiserver, is made as: one whom RBAC lets read the namespace's objects and
// nothing else (grantReads), so that both servers authorize a caller as an install's would,
// not system:masters.
const reader = "bob"

// grantReads lets reader get, list and watch the resource in the namespace, with a Role and a
// RoleBinding, and waits until the apiserver's RBAC agrees: dynwatch caches the first decision
// it is given, a denial included.
func grantReads(ctx context.Context, cs kubernetes.Interface, resource string) error {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{resource}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := cs.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create role %s: %w", role.Name, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: reader}},
	}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create role binding %s: %w", binding.Name, err)
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: reader, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "list", Resource: resource},
	}}
	err := waitFor(ctx, 30*time.Second, func() bool {
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed
	})
	if err != nil {
		return fmt.Errorf("RBAC does not let %s list %s in %s: %w", reader, resource, namespace, err)
	}
	return nil
}

// objectName is the name of the resource's i-th object.
func objectName(resource string, i int) string {
	if resource == "pods" {
		return fmt.Sprintf("%s-%05d", replicaSet(i), i)
	}
	return fmt.Sprintf("cm-%05d", i)
}

// update makes the n-th update of the storm to the resource's object name, a merge patch of
// one annotation, and returns the object's new resourceVersion.
func update(ctx context.Context, cs kubernetes.Interface, resource, name string, n int) (string, error) {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"example.com/touched":"%d"}}}`, n)
	obj, err := cs.CoreV1().RESTClient().Patch(types.MergePatchType).Namespace(namespace).Resource(resource).Name(name).Body(patch).Do(ctx).Get()
	if err != nil {
		return "", err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", err
	}
	return m.GetResourceVersion(), nil
}

func randomHex(chars int) string {
	b := make([]byte, chars/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// applyConfigMap writes the i-th configmap, of about 4 KB: applied by two field managers
// with server-side apply, carrying kubectl's last-applied annotation, labelled from small sets
// (app.kubernetes.io/name, which the chart's indexer reads, as app).
func applyConfigMap(ctx context.Context, cs kubernetes.Interface, i int) error {
	name := objectName("configmaps", i)
	data := map[string]string{"config.json": randomHex(1100), "settings.ini": randomHex(400)}
	lastApplied, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": namespace}, "data": data})
	deployer := corev1apply.ConfigMap(name, namespace).
		WithLabels(map[string]string{"app": app(i), "app.kubernetes.io/name": app(i), "tier": tier(i)}).
		WithAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(lastApplied), "example.com/team": team(i)}).
		WithData(data)
	operator := corev1apply.ConfigMap(name, namespace).WithData(map[string]string{"operator-note": randomHex(200)})
	for _, a := range []struct {
		manager string
		cfg     *corev1apply.ConfigMapApplyConfiguration
	}{{"deployer", deployer}, {"operator", operator}} {
		if _, err := cs.CoreV1().ConfigMaps(namespace).Apply(ctx, a.cfg, metav1.ApplyOptions{FieldManager: a.manager}); err != nil {
			return err
		}
	}
	return nil
}

// createSmallConfigMap creates the i-th configmap of about 1 KB, as one client creates it
// (no server-side apply, no last-applied annotation): labelled and annotated as applyConfigMap's,
// so the same indexers and queries apply.
func createSmallConfigMap(ctx context.Context, cs kubernetes.Interface, i int) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: objectName("configmaps", i), Namespace: namespace,
			Labels:      map[string]string{"app": app(i), "app.kubernetes.io/name": app(i), "tier": tier(i)},
			Annotations: map[string]string{"example.com/team": team(i)},
		},
		Data: map[string]string{"config.json": randomHex(500)},
	}
	_, err := cs.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{FieldManager: "deployer"})
	return err
}

func app(i int) string  { return fmt.Sprintf("app-%02d", i%20) }
func tier(i int) string { return []string{"web", "db", "cache", "batch"}[i%4] }
func team(i int) string { return fmt.Sprintf("team-%d", i%5) }

// replicaSet is the name of the i-th pod's ReplicaSet: its app and its pod-template-hash.
func replicaSet(i int) string { return app(i) + "-" + templateHash(i) }

func templateHash(i int) string { return fmt.Sprintf("%x", 0x5d8f7c9b0+i%20) }

// pod is what the pod templates are filled with.
type pod struct {
	Name, Namespace, App, Tier, Team, ReplicaSet, Hash string
	Suffix, Node, HostIP, PodIP                        string
	Sidecar                                            bool
	Started, Ready                                     string // RFC 3339
	Digests                                            []string
}

// podSpec is the pod as the ReplicaSet controller creates it from a Deployment's template.
// The test bed runs no ServiceAccount admission, so the token volume is written here.
var podSpec = template.Must(template.New("spec").Parse(`apiVersion: v1
kind: Pod
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
  generateName: {{.ReplicaSet}}-
  labels:
    app: {{.App}}
    app.kubernetes.io/name: {{.App}}
    app.kubernetes.io/part-of: shop
    tier: {{.Tier}}
    pod-template-hash: {{.Hash}}
  annotations:
    example.com/team: {{.Team}}
    kubectl.kubernetes.io/restartedAt: "{{.Started}}"
  ownerReferences:
    - apiVersion: apps/v1
      kind: ReplicaSet
      name: {{.ReplicaSet}}
      uid: 6c1f0b9e-2d4a-4c8b-9e7f-000{{.Hash}}
      controller: true
      blockOwnerDeletion: true
spec:
  nodeName: {{.Node}}
  serviceAccountName: {{.App}}
  securityContext: {runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: app
      image: registry.local/shop/{{.App}}:1.14.2
      args: [--config=/etc/{{.App}}/config.yaml, --listen=:8080]
      ports:
        - {name: http, containerPort: 8080, protocol: TCP}
        - {name: metrics, containerPort: 9090, protocol: TCP}
      env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        - {name: GOMEMLIMIT, valueFrom: {resourceFieldRef: {resource: limits.memory}}}
        - {name: LOG_LEVEL, value: info}
        - {name: DATABASE_URL, value: "postgres://{{.App}}-db.{{.Namespace}}.svc:5432/{{.App}}"}
      resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 256Mi}}
      livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10, failureThreshold: 3}
      readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 5}
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      volumeMounts:
        - {name: config, mountPath: /etc/{{.App}}, readOnly: true}
        - {name: tmp, mountPath: /tmp}
        - {name: kube-api-access-{{.Suffix}}, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- if .Sidecar}}
    - name: log-shipper
      image: registry.local/platform/log-shipper:2.3.0
      args: [--input=/tmp/logs, --output=stdout]
      env:
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
      resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      volumeMounts:
        - {name: tmp, mountPath: /tmp, readOnly: true}
        - {name: kube-api-access-{{.Suffix}}, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end}}
  volumes:
    - name: config
      configMap: {name: {{.App}}-config}
    - name: tmp
      emptyDir: {}
    - name: kube-api-access-{{.Suffix}}
      projected:
        defaultMode: 420
        sources:
          - serviceAccountToken: {expirationSeconds: 3607, path: token}
          - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
          - downwardAPI: {items: [{path: namespace, fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}}]}
  tolerations:
    - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 300}
    - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 300}
`))

// podAnnotations are a second field manager's: a service mesh's injector marking the pod.
var podAnnotations = template.Must(template.New("annotations").Parse(`apiVersion: v1
kind: Pod
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
  labels:
    mesh.example.com/revision: 1-24
  annotations:
    mesh.example.com/status: '{"proxy":"disabled","reason":"no sidecar requested","checked":"{{.Started}}"}'
    prometheus.io/scrape: "true"
    prometheus.io/port: "9090"
`))

// podStatus is the status the kubelet reports for the pod once it runs.
var podStatus = template.Must(template.New("status").Parse(`apiVersion: v1
kind: Pod
metadata:
  name: {{.Name}}
  namespace: {{.Namespace}}
status:
  phase: Running
  conditions:
    - {type: PodReadyToStartContainers, status: "True", lastTransitionTime: "{{.Started}}"}
    - {type: Initialized, status: "True", lastTransitionTime: "{{.Started}}"}
    - {type: Ready, status: "True", lastTransitionTime: "{{.Ready}}"}
    - {type: ContainersReady, status: "True", lastTransitionTime: "{{.Ready}}"}
    - {type: PodScheduled, status: "True", lastTransitionTime: "{{.Started}}"}
  hostIP: {{.HostIP}}
  hostIPs: [{ip: {{.HostIP}}}]
  podIP: {{.PodIP}}
  podIPs: [{ip: {{.PodIP}}}]
  startTime: "{{.Started}}"
  containerStatuses:
    - name: app
      state: {running: {startedAt: "{{.Started}}"}}
      ready: true
      started: true
      restartCount: 0
      image: registry.local/shop/{{.App}}:1.14.2
      imageID: registry.local/shop/{{.App}}@sha256:{{index .Digests 0}}
      containerID: containerd://{{index .Digests 1}}
      resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 256Mi}}
      volumeMounts:
        - {name: config, mountPath: /etc/{{.App}}, readOnly: true, recursiveReadOnly: Disabled}
        - {name: tmp, mountPath: /tmp}
        - {name: kube-api-access-{{.Suffix}}, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true, recursiveReadOnly: Disabled}
{{- if .Sidecar}}
    - name: log-shipper
      state: {running: {startedAt: "{{.Started}}"}}
      ready: true
      started: true
      restartCount: 0
      image: registry.local/platform/log-shipper:2.3.0
      imageID: registry.local/platform/log-shipper@sha256:{{index .Digests 2}}
      containerID: containerd://{{index .Digests 3}}
      resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
      volumeMounts:
        - {name: tmp, mountPath: /tmp, readOnly: true, recursiveReadOnly: Disabled}
        - {name: kube-api-access-{{.Suffix}}, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true, recursiveReadOnly: Disabled}
{{- end}}
`))

// applyPod writes the i-th pod as a Deployment's ReplicaSet creates it and a running node
// reports it: its spec by the controller manager and an annotating second manager, both with
// server-side apply, then its status by the kubelet through the status subresource. The
// test bed runs no scheduler or kubelet, which would otherwise leave it bare and Pending.
func applyPod(ctx context.Context, cs kubernetes.Interface, i int) error {
	started := time.Now().Add(-time.Hour).UTC()
	p := pod{
		Name: objectName("pods", i), Namespace: namespace, App: app(i), Tier: tier(i), Team: team(i), ReplicaSet: replicaSet(i), Hash: templateHash(i),
		Suffix: randomHex(6)[:5], Node: fmt.Sprintf("node-%02d", i%50), HostIP: fmt.Sprintf("10.0.0.%d", 10+i%50), PodIP: fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&255, i&255),
		Sidecar: i%2 == 0, Started: started.Format(time.RFC3339), Ready: started.Add(8 * time.Second).Format(time.RFC3339),
		Digests: []string{randomHex(64), randomHex(64), randomHex(64), randomHex(64)}, // image, container, and the sidecar's
	}
	for _, a := range []struct {
		manager, subresource string
		body                 *template.Template
	}{{"kube-controller-manager", "", podSpec}, {"mesh-injector", "", podAnnotations}, {"kubelet", "status", podStatus}} {
		var body bytes.Buffer
		if err := a.body.Execute(&body, p); err != nil {
			return err
		}
		req := cs.CoreV1().RESTClient().Patch(types.ApplyPatchType).Namespace(namespace).Resource("pods").Name(p.Name).
			Param("fieldManager", a.manager).Param("force", "true").Body(body.Bytes())
		if a.subresource != "" {
			req = req.SubResource(a.subresource)
		}
		if err := req.Do(ctx).Error(); err != nil {
			return fmt.Errorf("apply pod %s as %s: %w", p.Name, a.manager, err)
		}
	}
	return nil
}
