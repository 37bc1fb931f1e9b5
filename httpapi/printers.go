package httpapi

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dynwatch/dynwatch/object"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metatable "k8s.io/apimachinery/pkg/api/meta/table"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// printer is how one kind is shown as a Table: its columns, and a row's cells and
// conditions. Cells hold every column, priority > 0 ones (kubectl's -o wide) included, as the
// apiserver's server-side printing does.
type printer struct {
	columns []metav1.TableColumnDefinition
	row     func(obj *unstructured.Unstructured) ([]any, []metav1.TableRowCondition)
}

var (
	objectMetaDoc = metav1.ObjectMeta{}.SwaggerDoc()
	nameColumn    = metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: objectMetaDoc["name"]}
	ageColumn     = metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: objectMetaDoc["creationTimestamp"]}
	// The pod template's containers, shown with -o wide for workloads.
	containersColumn = col("Containers", "string", 1, "Names of each container in the template.")
	imagesColumn     = col("Images", "string", 1, "Images referenced by each container in the template.")
	defaultPrinter   = printer{
		columns: []metav1.TableColumnDefinition{nameColumn, ageColumn},
		row: func(obj *unstructured.Unstructured) ([]any, []metav1.TableRowCondition) {
			return []any{obj.GetName(), age(obj.GetCreationTimestamp())}, nil
		},
	}
)

// builtinPrinters show the built-in kinds with the columns kube-apiserver v1.36 shows them
// with (pkg/printers/internalversion), computed from the same fields.
var builtinPrinters = map[schema.GroupKind]printer{
	{Kind: "ConfigMap"}: typedPrinter(func(cm *corev1.ConfigMap) []any {
		return []any{cm.Name, int64(len(cm.Data) + len(cm.BinaryData)), age(cm.CreationTimestamp)}
	}, nameColumn, col("Data", "string", 0, corev1.ConfigMap{}.SwaggerDoc()["data"]), ageColumn),

	{Kind: "Secret"}: typedPrinter(func(s *corev1.Secret) []any {
		return []any{s.Name, string(s.Type), int64(len(s.Data)), age(s.CreationTimestamp)}
	}, nameColumn, col("Type", "string", 0, corev1.Secret{}.SwaggerDoc()["type"]), col("Data", "string", 0, corev1.Secret{}.SwaggerDoc()["data"]), ageColumn),

	{Kind: "Namespace"}: typedPrinter(func(ns *corev1.Namespace) []any {
		return []any{ns.Name, string(ns.Status.Phase), age(ns.CreationTimestamp)}
	}, nameColumn, col("Status", "string", 0, "The status of the namespace"), ageColumn),

	{Kind: "Pod"}: {
		columns: []metav1.TableColumnDefinition{nameColumn,
			col("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
			col("Status", "string", 0, "The aggregate status of the containers in this pod."),
			col("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
			ageColumn,
			col("IP", "string", 1, corev1.PodStatus{}.SwaggerDoc()["podIP"]),
			col("Node", "string", 1, corev1.PodSpec{}.SwaggerDoc()["nodeName"]),
			col("Nominated Node", "string", 1, corev1.PodStatus{}.SwaggerDoc()["nominatedNodeName"]),
			col("Readiness Gates", "string", 1, corev1.PodSpec{}.SwaggerDoc()["readinessGates"]),
		},
		row: typedRow(podRow),
	},

	{Kind: "Service"}: typedPrinter(serviceRow, nameColumn,
		col("Type", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["type"]),
		col("Cluster-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["clusterIP"]),
		col("External-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["externalIPs"]),
		col("Port(s)", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["ports"]),
		ageColumn,
		col("Selector", "string", 1, corev1.ServiceSpec{}.SwaggerDoc()["selector"])),

	{Group: "apps", Kind: "Deployment"}: typedPrinter(func(d *appsv1.Deployment) []any {
		names, images := containerCells(d.Spec.Template.Spec.Containers)
		selector := "<invalid>"
		if s, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err == nil {
			selector = s.String()
		}
		return []any{d.Name, fmt.Sprintf("%d/%d", d.Status.ReadyReplicas, replicas(d.Spec.Replicas)), int64(d.Status.UpdatedReplicas),
			int64(d.Status.AvailableReplicas), age(d.CreationTimestamp), names, images, selector}
	}, nameColumn,
		col("Ready", "string", 0, "Number of the pod with ready state"),
		col("Up-to-date", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["updatedReplicas"]),
		col("Available", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["availableReplicas"]),
		ageColumn, containersColumn, imagesColumn,
		col("Selector", "string", 1, appsv1.DeploymentSpec{}.SwaggerDoc()["selector"])),

	{Group: "apps", Kind: "ReplicaSet"}: typedPrinter(func(rs *appsv1.ReplicaSet) []any {
		names, images := containerCells(rs.Spec.Template.Spec.Containers)
		return []any{rs.Name, int64(replicas(rs.Spec.Replicas)), int64(rs.Status.Replicas), int64(rs.Status.ReadyReplicas),
			age(rs.CreationTimestamp), names, images, metav1.FormatLabelSelector(rs.Spec.Selector)}
	}, nameColumn,
		col("Desired", "integer", 0, appsv1.ReplicaSetSpec{}.SwaggerDoc()["replicas"]),
		col("Current", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["replicas"]),
		col("Ready", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["readyReplicas"]),
		ageColumn, containersColumn, imagesColumn,
		col("Selector", "string", 1, appsv1.ReplicaSetSpec{}.SwaggerDoc()["selector"])),

	{Kind: "Node"}: typedPrinter(nodeRow, nameColumn,
		col("Status", "string", 0, "The status of the node"),
		col("Roles", "string", 0, "The roles of the node"),
		ageColumn,
		col("Version", "string", 0, corev1.NodeSystemInfo{}.SwaggerDoc()["kubeletVersion"]),
		col("Internal-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
		col("External-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
		col("OS-Image", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["osImage"]),
		col("Kernel-Version", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["kernelVersion"]),
		col("Container-Runtime", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["containerRuntimeVersion"])),

	{Kind: "Event"}: typedPrinter(eventRow,
		col("Last Seen", "string", 0, corev1.Event{}.SwaggerDoc()["lastTimestamp"]),
		col("Type", "string", 0, corev1.Event{}.SwaggerDoc()["type"]),
		col("Reason", "string", 0, corev1.Event{}.SwaggerDoc()["reason"]),
		col("Object", "string", 0, corev1.Event{}.SwaggerDoc()["involvedObject"]),
		col("Subobject", "string", 1, corev1.ObjectReference{}.SwaggerDoc()["fieldPath"]),
		col("Source", "string", 1, corev1.Event{}.SwaggerDoc()["source"]),
		col("Message", "string", 0, corev1.Event{}.SwaggerDoc()["message"]),
		col("First Seen", "string", 1, corev1.Event{}.SwaggerDoc()["firstTimestamp"]),
		col("Count", "string", 1, corev1.Event{}.SwaggerDoc()["count"]),
		metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: objectMetaDoc["name"]}),
}

func col(name, typ string, priority int32, description string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: typ, Priority: priority, Description: description}
}

// typedPrinter is a printer whose cells are computed from the typed object.
func typedPrinter[T any](cells func(*T) []any, columns ...metav1.TableColumnDefinition) printer {
	return printer{columns: columns, row: typedRow(func(obj *T) ([]any, []metav1.TableRowCondition) { return cells(obj), nil })}
}

// typedRow converts the decoded object to T for row. An object that does not convert (its
// kind's schema changed under it) shows its name and <invalid> cells.
func typedRow[T any](row func(*T) ([]any, []metav1.TableRowCondition)) func(*unstructured.Unstructured) ([]any, []metav1.TableRowCondition) {
	return func(u *unstructured.Unstructured) ([]any, []metav1.TableRowCondition) {
		var obj T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &obj); err != nil {
			return []any{u.GetName(), "<invalid>"}, nil
		}
		return row(&obj)
	}
}

// cells returns obj's row cells, padded or cut to the printer's columns. The columns need the
// object as a value: it is decoded for its row.
func (p printer) cells(obj *object.Object) ([]any, []metav1.TableRowCondition) {
	var cells []any
	var conditions []metav1.TableRowCondition
	if u, err := obj.Decode(); err != nil {
		cells = []any{obj.GetName(), "<invalid>"}
	} else {
		cells, conditions = p.row(u)
	}
	for len(cells) < len(p.columns) {
		cells = append(cells, nil)
	}
	return cells[:len(p.columns)], conditions
}

func age(t metav1.Time) string { return metatable.ConvertToHumanReadableDateType(t) }

func replicas(n *int32) int32 {
	if n == nil {
		return 1 // the API's default
	}
	return *n
}

func containerCells(containers []corev1.Container) (names, images string) {
	n := make([]string, len(containers))
	i := make([]string, len(containers))
	for k, c := range containers {
		n[k], i[k] = c.Name, c.Image
	}
	return strings.Join(n, ","), strings.Join(i, ",")
}

var (
	podSucceeded = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(corev1.PodSucceeded), Message: "The pod has completed successfully."}}
	podFailed    = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(corev1.PodFailed), Message: "The pod failed."}}
)

// podRow computes READY, STATUS and RESTARTS by kubectl's rules: init containers first,
// then the containers from last to first; sidecars (restartable init containers) count
// among the containers.
func podRow(pod *corev1.Pod) ([]any, []metav1.TableRowCondition) {
	st := podStatus{total: len(pod.Spec.Containers), reason: podReason(pod)}
	sidecar := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecar[c.Name] = true
			st.total++
		}
	}
	if !st.initContainers(pod, sidecar) || podCondition(pod, corev1.PodInitialized) {
		st.containers(pod)
	}
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	switch {
	case pod.DeletionTimestamp != nil && pod.Status.Reason == "NodeLost":
		st.reason = "Unknown"
	case pod.DeletionTimestamp != nil && !terminal:
		st.reason = "Terminating"
	}
	restartCell := strconv.Itoa(st.restarts)
	if st.restarts != 0 && !st.lastRestart.IsZero() {
		restartCell = fmt.Sprintf("%d (%s ago)", st.restarts, age(st.lastRestart))
	}
	ip := "<none>"
	if len(pod.Status.PodIPs) > 0 && pod.Status.PodIPs[0].IP != "" {
		ip = pod.Status.PodIPs[0].IP
	}
	var conditions []metav1.TableRowCondition
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		conditions = podSucceeded
	case corev1.PodFailed:
		conditions = podFailed
	}
	return []any{pod.Name, fmt.Sprintf("%d/%d", st.ready, st.total), st.reason, restartCell, age(pod.CreationTimestamp),
		ip, orNone(pod.Spec.NodeName), orNone(pod.Status.NominatedNodeName), readinessGates(pod)}, conditions
}

// podReason is a pod's STATUS before its containers are looked at: its phase, its reason, or
// SchedulingGated.
func podReason(pod *corev1.Pod) string {
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
			reason = corev1.PodReasonSchedulingGated
		}
	}
	return reason
}

// podStatus is what a pod's row reads from its containers' statuses.
type podStatus struct {
	reason                          string
	ready, total                    int
	restarts, sidecarRestarts       int
	lastRestart, lastSidecarRestart metav1.Time
}

// later moves last to s's last termination, if that came after it.
func later(last *metav1.Time, s corev1.ContainerStatus) {
	if t := s.LastTerminationState.Terminated; t != nil && last.Before(&t.FinishedAt) {
		*last = t.FinishedAt
	}
}

// terminated is the reason a container that terminated gives, after prefix.
func terminated(prefix string, t *corev1.ContainerStateTerminated) string {
	switch {
	case t.Reason != "":
		return prefix + t.Reason
	case t.Signal != 0:
		return fmt.Sprintf("%sSignal:%d", prefix, t.Signal)
	default:
		return fmt.Sprintf("%sExitCode:%d", prefix, t.ExitCode)
	}
}

// initContainers reads the init containers' statuses, and reports whether the pod is still
// initializing: an init container neither done nor a started sidecar.
func (st *podStatus) initContainers(pod *corev1.Pod, sidecar map[string]bool) bool {
	for i, s := range pod.Status.InitContainerStatuses {
		st.restarts += int(s.RestartCount)
		later(&st.lastRestart, s)
		if sidecar[s.Name] {
			st.sidecarRestarts += int(s.RestartCount)
			later(&st.lastSidecarRestart, s)
		}
		switch t, w := s.State.Terminated, s.State.Waiting; {
		case t != nil && t.ExitCode == 0:
			continue
		case sidecar[s.Name] && s.Started != nil && *s.Started:
			if s.Ready {
				st.ready++
			}
			continue
		case t != nil:
			st.reason = terminated("Init:", t)
		case w != nil && w.Reason != "" && w.Reason != "PodInitializing":
			st.reason = "Init:" + w.Reason
		default:
			st.reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		return true
	}
	return false
}

// containers reads the containers' statuses, from last to first; their restarts replace the
// init containers' but the sidecars'.
func (st *podStatus) containers(pod *corev1.Pod) {
	st.restarts, st.lastRestart = st.sidecarRestarts, st.lastSidecarRestart
	running, errorReason := false, ""
	for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
		s := pod.Status.ContainerStatuses[i]
		st.restarts += int(s.RestartCount)
		later(&st.lastRestart, s)
		switch t, w := s.State.Terminated, s.State.Waiting; {
		case w != nil && w.Reason != "":
			st.reason = w.Reason
		case t != nil:
			st.reason = terminated("", t)
			if t.ExitCode != 0 {
				errorReason = st.reason
			}
		case s.Ready && s.State.Running != nil:
			running = true
			st.ready++
		}
	}
	if st.reason == "Completed" {
		switch {
		case running && podCondition(pod, corev1.PodReady):
			st.reason = "Running"
		case errorReason != "":
			st.reason = errorReason
		case running:
			st.reason = "NotReady"
		}
	}
}

// readinessGates is the READINESS GATES column: met/all, or <none>.
func readinessGates(pod *corev1.Pod) string {
	if len(pod.Spec.ReadinessGates) == 0 {
		return "<none>"
	}
	met := 0
	for _, g := range pod.Spec.ReadinessGates {
		if podCondition(pod, g.ConditionType) {
			met++
		}
	}
	return fmt.Sprintf("%d/%d", met, len(pod.Spec.ReadinessGates))
}

// podCondition reports whether the pod's first condition of type t is True.
func podCondition(pod *corev1.Pod, t corev1.PodConditionType) bool {
	i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == t })
	return i >= 0 && pod.Status.Conditions[i].Status == corev1.ConditionTrue
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func serviceRow(svc *corev1.Service) []any {
	clusterIP := "<none>"
	if len(svc.Spec.ClusterIPs) > 0 {
		clusterIP = svc.Spec.ClusterIPs[0]
	}
	ports := make([]string, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		ports[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if p.NodePort > 0 {
			ports[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
		}
	}
	return []any{svc.Name, string(svc.Spec.Type), clusterIP, externalIP(svc), orNone(strings.Join(ports, ",")),
		age(svc.CreationTimestamp), labels.FormatLabels(svc.Spec.Selector)}
}

// externalIP is the External-IP cell as the apiserver computes it for wide output (load
// balancer addresses unabridged).
func externalIP(svc *corev1.Service) string {
	switch svc.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort:
		return orNone(strings.Join(svc.Spec.ExternalIPs, ","))
	case corev1.ServiceTypeLoadBalancer:
		var lb []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			switch {
			case in.IP != "":
				lb = append(lb, in.IP)
			case in.Hostname != "":
				lb = append(lb, in.Hostname)
			}
		}
		slices.Sort(lb)
		lb = slices.Compact(lb)
		if all := append(lb, svc.Spec.ExternalIPs...); len(all) > 0 {
			return strings.Join(all, ",")
		}
		return "<pending>"
	case corev1.ServiceTypeExternalName:
		return svc.Spec.ExternalName
	}
	return "<unknown>"
}

func nodeRow(node *corev1.Node) []any {
	var status []string
	if i := slices.IndexFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }); i >= 0 {
		if node.Status.Conditions[i].Status == corev1.ConditionTrue {
			status = append(status, string(corev1.NodeReady))
		} else {
			status = append(status, "Not"+string(corev1.NodeReady))
		}
	} else {
		status = append(status, "Unknown")
	}
	if node.Spec.Unschedulable {
		status = append(status, "SchedulingDisabled")
	}
	var roles []string
	for k, v := range node.Labels {
		if role, ok := strings.CutPrefix(k, "node-role.kubernetes.io/"); ok && role != "" {
			roles = append(roles, role)
		} else if k == "kubernetes.io/role" && v != "" {
			roles = append(roles, v)
		}
	}
	slices.Sort(roles)
	info := node.Status.NodeInfo
	kernel := unknown(info.KernelVersion)
	if info.Architecture != "" {
		kernel += " (" + info.Architecture + ")"
	}
	address := func(t corev1.NodeAddressType) string {
		i := slices.IndexFunc(node.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Type == t })
		if i < 0 {
			return "<none>"
		}
		return node.Status.Addresses[i].Address
	}
	return []any{node.Name, strings.Join(status, ","), orNone(strings.Join(slices.Compact(roles), ",")), age(node.CreationTimestamp),
		info.KubeletVersion, address(corev1.NodeInternalIP), address(corev1.NodeExternalIP), unknown(info.OSImage), kernel,
		unknown(info.ContainerRuntimeVersion)}
}

func unknown(s string) string {
	if s == "" {
		return "<unknown>"
	}
	return s
}

func eventRow(e *corev1.Event) []any {
	first := age(e.FirstTimestamp)
	if e.FirstTimestamp.IsZero() {
		first = microAge(e.EventTime)
	}
	last := age(e.LastTimestamp)
	if e.LastTimestamp.IsZero() {
		last = first
	}
	count := e.Count
	if e.Series != nil {
		last, count = microAge(e.Series.LastObservedTime), e.Series.Count
	} else if count == 0 {
		count = 1 // a singleton event of the events.k8s.io API
	}
	target := strings.ToLower(e.InvolvedObject.Kind)
	if e.InvolvedObject.Name != "" {
		target += "/" + e.InvolvedObject.Name
	}
	source := cmp.Or(e.Source.Component, e.ReportingController)
	if host := cmp.Or(e.Source.Host, e.ReportingInstance); host != "" {
		source += ", " + host
	}
	return []any{last, e.Type, e.Reason, target, e.InvolvedObject.FieldPath, source, strings.TrimSpace(e.Message), first, int64(count), e.Name}
}

func microAge(t metav1.MicroTime) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return age(metav1.NewTime(t.Time))
}
