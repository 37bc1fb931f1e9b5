package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

var subscriptionsGVR = schema.GroupVersionResource{Group: "events.dynwatch.io", Version: "v1alpha1", Resource: "subscriptions"}

// installedSubscriptions installs the chart's Subscription CRD and admission policies into the
// shared test bed, once, and waits until the mutating policy records a writer's subject.
var installedSubscriptions sync.Once

func installSubscriptions(t *testing.T) {
	t.Helper()
	installedSubscriptions.Do(func() {
		for _, f := range []string{"crd.yaml", "admission.yaml"} {
			if out, err := cluster.Kubectl(t.Context(), "apply", "-f", "../../charts/dynwatch/files/subscriptions/"+f); err != nil {
				t.Fatalf("kubectl apply %s: %v\n%s", f, err, out)
			}
		}
	})
	ns := namespace(t)
	admin := dynamic.NewForConfigOrDie(cluster.Config)
	probe := newSubscription("probe", "http://127.0.0.1:9/", nil)
	probe.Object["spec"].(map[string]any)["subject"] = map[string]any{"username": "nobody"}
	testbed.Eventually(t, 60*time.Second, func() error {
		created, err := admin.Resource(subscriptionsGVR).Namespace(ns).Create(t.Context(), probe, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_ = admin.Resource(subscriptionsGVR).Namespace(ns).Delete(t.Context(), "probe", metav1.DeleteOptions{})
		if got, _, _ := unstructured.NestedString(created.Object, "spec", "subject", "username"); got != "admin" {
			return fmt.Errorf("the probe's subject is %q, want admin: the mutating policy is not in effect yet", got)
		}
		return nil
	})
}

// newSubscription is a Subscription of configmaps to url, from namespaces (nil: all).
func newSubscription(name, url string, namespaces []string) *unstructured.Unstructured {
	spec := map[string]any{"url": url, "resources": []any{"configmaps"}}
	if namespaces != nil {
		var ns []any
		for _, n := range namespaces {
			ns = append(ns, n)
		}
		spec["namespaces"] = ns
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "events.dynwatch.io/v1alpha1", "kind": "Subscription",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// grantSubscriptions lets user write Subscriptions in ns.
func grantSubscriptions(t *testing.T, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	if _, err := cs.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "subscriptions"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"events.dynwatch.io"}, Resources: []string{"subscriptions"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "subscriptions-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "subscriptions"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCondition waits until the subscription ns/name has condition typ with status (and, if
// set, reason), and returns its message.
func waitCondition(t *testing.T, ns, name, typ, status, reason string) string {
	t.Helper()
	admin := dynamic.NewForConfigOrDie(cluster.Config)
	var message string
	testbed.Eventually(t, 60*time.Second, func() error {
		u, err := admin.Resource(subscriptionsGVR).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			c := c.(map[string]any)
			if c["type"] == typ {
				if c["status"] != status || (reason != "" && c["reason"] != reason) {
					return fmt.Errorf("subscription %s/%s: %s is %v (%v: %v), want %s %s", ns, name, typ, c["status"], c["reason"], c["message"], status, reason)
				}
				message, _ = c["message"].(string)
				return nil
			}
		}
		return fmt.Errorf("subscription %s/%s has no %s condition yet: %v", ns, name, typ, conds)
	})
	return message
}

// namespacesOf are the namespace/name of the objects rc received, sorted (a sink's workers
// keep each object's order, not the order between objects).
func namespacesOf(rc *receiver) []string {
	var out []string
	for _, r := range rc.got() {
		md, _ := r.payload.Object["metadata"].(map[string]any)
		ns, _ := md["namespace"].(string)
		out = append(out, ns+"/"+r.name())
	}
	slices.Sort(out)
	return out
}

// waitReceived waits until rc has received the configmap ns/name.
func waitReceived(t *testing.T, rc *receiver, ns, name string) {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() error {
		if got := namespacesOf(rc); !slices.Contains(got, ns+"/"+name) {
			return fmt.Errorf("received %v, not yet %s/%s", got, ns, name)
		}
		return nil
	})
}

// TestEachTeamsSubscriptionReceivesOnlyWhatItsWriterMayWatch: alice may watch configmaps in a,
// bob in b; each subscribes to configmaps of every namespace, alice naming bob as her
// subscription's subject. Admission records alice instead; each receives its own namespace's
// changes and nothing of c, where neither may watch. A subscription naming b for alice is not
// Authorized and receives nothing. Once alice's RoleBinding is deleted, her subscription turns
// Authorized=False within the review period and receives nothing more. A subscription naming a
// resource dynwatch does not watch, with a filter that does not compile, is not Accepted, its
// condition naming both fields.
func TestEachTeamsSubscriptionReceivesOnlyWhatItsWriterMayWatch(t *testing.T) {
	t.Parallel()
	installSubscriptions(t)
	a, b, c := namespace(t), namespace(t), namespace(t)
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	for ns, user := range map[string]string{a: "alice", b: "bob"} {
		grantConfigMapReads(t, admin, ns, user)
		grantSubscriptions(t, admin, ns, user)
	}
	rcA, rcB, rcOther := newReceiver(t, nil, false), newReceiver(t, nil, false), newReceiver(t, nil, false)
	startWithWebhooks(t, "resources: [{version: v1, resource: configmaps}]\nsubscriptions: {enabled: true, reviewEvery: 2s}\n")

	as := func(user string) dynamic.NamespaceableResourceInterface {
		return dynamic.NewForConfigOrDie(caller{token: cluster.Token(user)}.config(cluster.URL(), "", cluster.Config.CAData)).Resource(subscriptionsGVR)
	}
	spoof := newSubscription("team", rcA.URL, nil)
	spoof.Object["spec"].(map[string]any)["subject"] = map[string]any{"username": "bob", "groups": []any{"system:masters"}}
	created, err := as("alice").Namespace(a).Create(t.Context(), spoof, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subject, _, _ := unstructured.NestedMap(created.Object, "spec", "subject")
	if groups, _ := subject["groups"].([]any); subject["username"] != "alice" || subject["uid"] != "alice" || slices.Contains(groups, any("system:masters")) {
		t.Fatalf("alice's subscription naming bob (system:masters) as its subject was stored with subject %v; want alice's own", subject)
	}
	if _, err := as("bob").Namespace(b).Create(t.Context(), newSubscription("team", rcB.URL, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := as("alice").Namespace(a).Create(t.Context(), newSubscription("other", rcOther.URL, []string{b}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := newSubscription("bad", rcOther.URL, nil)
	bad.Object["spec"].(map[string]any)["resources"] = []any{"secrets"}
	bad.Object["spec"].(map[string]any)["filter"] = "object.("
	if _, err := as("alice").Namespace(a).Create(t.Context(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := waitCondition(t, a, "bad", "Accepted", "False", "Invalid")
	for _, field := range []string{"spec.resources[0]", "spec.filter"} {
		if !strings.Contains(msg, field) {
			t.Errorf("the Accepted=False message of a subscription naming an unwatched resource and a filter that does not compile does not name %s: %s", field, msg)
		}
	}
	waitCondition(t, a, "team", "Ready", "True", "Delivering")
	waitCondition(t, b, "team", "Ready", "True", "Delivering")
	if msg := waitCondition(t, a, "other", "Authorized", "False", "Forbidden"); msg == "" {
		t.Error("the Authorized=False condition has no message")
	}
	waitCondition(t, a, "other", "Ready", "False", "NotAuthorized")

	// One watch carries every namespace's configmaps, and the journal records them in its
	// order: once a marker made after the others arrives, every earlier event was decided.
	create := func(ns, name string) {
		t.Helper()
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{c, b, a} {
		create(ns, "x")
	}
	create(a, "marker")
	create(b, "marker")
	waitReceived(t, rcA, a, "marker")
	waitReceived(t, rcB, b, "marker")
	if got, want := namespacesOf(rcA), []string{a + "/marker", a + "/x"}; !slices.Equal(got, want) {
		t.Errorf("alice's subscription received %v, want %v", got, want)
	}
	if got, want := namespacesOf(rcB), []string{b + "/marker", b + "/x"}; !slices.Equal(got, want) {
		t.Errorf("bob's subscription received %v, want %v", got, want)
	}

	if err := admin.RbacV1().RoleBindings(a).Delete(t.Context(), "dynwatch", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	waitCondition(t, a, "team", "Authorized", "False", "Forbidden")
	t.Logf("alice's subscription was Authorized=False %s after her RoleBinding was deleted (reviewEvery 2s)", time.Since(revoked).Round(100*time.Millisecond))
	create(a, "after")
	create(b, "after")
	waitReceived(t, rcB, b, "after")
	if got, want := namespacesOf(rcA), []string{a + "/marker", a + "/x"}; !slices.Equal(got, want) {
		t.Errorf("after alice's grant was revoked her subscription received %v, want nothing more than %v", got, want)
	}
	if got := rcOther.got(); len(got) != 0 {
		t.Errorf("the subscription naming a namespace alice may not watch received %d events: %v", len(got), namespacesOf(rcOther))
	}
}
