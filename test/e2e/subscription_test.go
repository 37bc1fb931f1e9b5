package e2e

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/twmb/franz-go/pkg/kfake"

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

// subscriptionsAs is the Subscriptions of ns as user, impersonated by the test bed's admin: a
// user of the test's own, whom no other test grants anything (the test bed's bob, say, reads
// configmaps cluster-wide while the security tests run).
func subscriptionsAs(t *testing.T, user, ns string) dynamic.ResourceInterface {
	t.Helper()
	c := rest.CopyConfig(cluster.Config)
	c.Impersonate = rest.ImpersonationConfig{UserName: user}
	return dynamic.NewForConfigOrDie(c).Resource(subscriptionsGVR).Namespace(ns)
}

// team installs the subscriptions, makes a namespace and a user of the test's own who may read
// its configmaps and write its Subscriptions, and returns them with an admin client.
func team(t *testing.T) (ns, user string, admin kubernetes.Interface) {
	t.Helper()
	installSubscriptions(t)
	ns = namespace(t)
	user = "carol-" + ns
	admin = kubernetes.NewForConfigOrDie(cluster.Config)
	grantConfigMapReads(t, admin, ns, user)
	grantSubscriptions(t, admin, ns, user)
	return ns, user, admin
}

// startServing starts dynwatch watching configmaps and serving the Subscriptions of ns, which
// may reach allow (a CIDR) and are configured with extra (more subscriptions settings, as
// ", key: value"), and returns its metrics URL.
func startServing(t *testing.T, ns, allow, extra string) string {
	t.Helper()
	_, metrics := startWithWebhooks(t, "resources: [{version: v1, resource: configmaps}]\nsubscriptions: {enabled: true, namespaces: ["+ns+"], reviewEvery: 2s, egress: {allow: ["+allow+"]}"+extra+"}\n")
	return metrics
}

// grantSubscriptions lets user write Subscriptions in ns.
func grantSubscriptions(t *testing.T, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	grantRole(t, cs, ns, "subscriptions", "subscriptions-"+user, user,
		rbacv1.PolicyRule{APIGroups: []string{"events.dynwatch.io"}, Resources: []string{"subscriptions"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}})
}

// waitCondition waits until the subscription ns/name has condition typ with status (and, if
// set, reason), and returns its message.
func waitCondition(t *testing.T, ns, name, typ, status, reason string) string {
	t.Helper()
	return waitConditionIn(t, cluster.Config, ns, name, typ, status, reason)
}

// waitConditionIn is waitCondition in the cluster c configures.
func waitConditionIn(t *testing.T, c *rest.Config, ns, name, typ, status, reason string) string {
	t.Helper()
	admin := dynamic.NewForConfigOrDie(c)
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

// keysOf are the keys (namespace/name, the CloudEvents subject) of the objects rc received,
// sorted (a sink's workers keep each object's order, not the order between objects).
func keysOf(rc *receiver) []string {
	var out []string
	for _, r := range rc.got() {
		out = append(out, r.subject)
	}
	slices.Sort(out)
	return out
}

// waitReceived waits until rc has received the configmap ns/name.
func waitReceived(t *testing.T, rc *receiver, ns, name string) {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() error {
		if got := keysOf(rc); !slices.Contains(got, ns+"/"+name) {
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
	alice, bob := "alice-"+a, "bob-"+b
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	for ns, user := range map[string]string{a: alice, b: bob} {
		grantConfigMapReads(t, admin, ns, user)
		grantSubscriptions(t, admin, ns, user)
	}
	rcA, rcB, rcOther := newReceiver(t, nil, false), newReceiver(t, nil, false), newReceiver(t, nil, false)
	startWithWebhooks(t, "resources: [{version: v1, resource: configmaps}]\nsubscriptions: {enabled: true, namespaces: ["+a+", "+b+", "+c+"], reviewEvery: 2s, egress: {allow: [127.0.0.1/32]}}\n")

	spoof := newSubscription("team", rcA.URL, nil)
	spoof.Object["spec"].(map[string]any)["subject"] = map[string]any{"username": bob, "groups": []any{"system:masters"}}
	created, err := subscriptionsAs(t, alice, a).Create(t.Context(), spoof, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subject, _, _ := unstructured.NestedMap(created.Object, "spec", "subject")
	if groups, _ := subject["groups"].([]any); subject["username"] != alice || slices.Contains(groups, any("system:masters")) {
		t.Fatalf("alice's subscription naming bob (system:masters) as its subject was stored with subject %v; want alice's own", subject)
	}
	if _, err := subscriptionsAs(t, bob, b).Create(t.Context(), newSubscription("team", rcB.URL, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := subscriptionsAs(t, alice, a).Create(t.Context(), newSubscription("other", rcOther.URL, []string{b}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := newSubscription("bad", rcOther.URL, nil)
	bad.Object["spec"].(map[string]any)["resources"] = []any{"secrets"}
	bad.Object["spec"].(map[string]any)["filter"] = "object.("
	if _, err := subscriptionsAs(t, alice, a).Create(t.Context(), bad, metav1.CreateOptions{}); err != nil {
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
	if got, want := keysOf(rcA), []string{a + "/marker", a + "/x"}; !slices.Equal(got, want) {
		t.Errorf("alice's subscription received %v, want %v", got, want)
	}
	if got, want := keysOf(rcB), []string{b + "/marker", b + "/x"}; !slices.Equal(got, want) {
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
	if got, want := keysOf(rcA), []string{a + "/marker", a + "/x"}; !slices.Equal(got, want) {
		t.Errorf("after alice's grant was revoked her subscription received %v, want nothing more than %v", got, want)
	}
	if got := rcOther.got(); len(got) != 0 {
		t.Errorf("the subscription naming a namespace alice may not watch received %d events: %v", len(got), keysOf(rcOther))
	}
}

// newReceiverOn is a receiver listening on host (a loopback address).
func newReceiverOn(t *testing.T, host string) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{perID: map[string]int{}}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.Listener.Close()
	rc.Listener = ln
	rc.Start()
	t.Cleanup(rc.Close)
	return rc
}

// TestASubscriptionToAnAddressOutsideTheAllowListReachesNothing: with only 127.0.0.2 allowed,
// a subscription to the literal 127.0.0.1 is not Accepted (naming spec.url), and one to
// localhost, which resolves to 127.0.0.1 (and ::1), is not Ready: its events are refused at the
// dial, each dead-lettered as rejected, and the receiver behind both gets nothing, while a
// subscription to 127.0.0.2 receives every event.
func TestASubscriptionToAnAddressOutsideTheAllowListReachesNothing(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	allowed, forbidden := newReceiverOn(t, "127.0.0.2"), newReceiver(t, nil, false)
	_, port, _ := net.SplitHostPort(forbidden.Listener.Addr().String())
	metrics := startServing(t, ns, "127.0.0.2/32", "")
	subs := subscriptionsAs(t, carol, ns)
	for name, url := range map[string]string{"allowed": allowed.URL, "literal": "http://127.0.0.1:" + port + "/", "byname": "http://localhost:" + port + "/"} {
		if _, err := subs.Create(t.Context(), newSubscription(name, url, []string{ns}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, ns, "allowed", "Ready", "True", "Delivering")
	if msg := waitCondition(t, ns, "literal", "Accepted", "False", "Invalid"); !strings.Contains(msg, "spec.url") || !strings.Contains(msg, "127.0.0.1 is a loopback address") {
		t.Errorf("the Accepted=False message of a subscription to 127.0.0.1 does not name spec.url and why: %s", msg)
	}
	if msg := waitCondition(t, ns, "byname", "Ready", "False", "EgressRefused"); !strings.Contains(msg, "localhost") {
		t.Errorf("the Ready=False message of a subscription to localhost does not name it: %s", msg)
	}
	for _, name := range []string{"one", "two", "marker"} {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitReceived(t, allowed, ns, "marker")
	// Each of byname's three events is refused at the dial, a final answer: dead-lettered at once.
	testbed.Eventually(t, 60*time.Second, func() error {
		if n := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="rejected",sink="subscription.`+ns+`.byname"}`); n != 3 {
			return fmt.Errorf("the subscription to localhost has %v events dead-lettered as rejected, want 3", n)
		}
		return nil
	})
	if got := forbidden.got(); len(got) != 0 {
		t.Errorf("the receiver on 127.0.0.1, outside the allow-list, received %d requests", len(got))
	}
	if got, want := keysOf(allowed), []string{ns + "/marker", ns + "/one", ns + "/two"}; !slices.Equal(got, want) {
		t.Errorf("the subscription to 127.0.0.2 received %v, want %v", got, want)
	}
}

// TestASubscriptionWhoseReceiverAnswers410IsNotReadyAndReceivesNothingMoreUntilItsSpecChanges:
// a receiver that answers 410 Gone to its first request asks dynwatch to stop; the
// subscription turns Ready=False with reason Gone and is sent nothing more. Once its writer
// changes its spec (the receiver answering 200 again), it is Ready and delivers again.
func TestASubscriptionWhoseReceiverAnswers410IsNotReadyAndReceivesNothingMoreUntilItsSpecChanges(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	gone := newReceiverOn(t, "127.0.0.2")
	var back atomic.Bool
	gone.answer = func(int) int {
		if back.Load() {
			return http.StatusOK
		}
		return http.StatusGone
	}
	metrics := startServing(t, ns, "127.0.0.2/32", "")
	subs := subscriptionsAs(t, carol, ns)
	if _, err := subs.Create(t.Context(), newSubscription("gone", gone.URL, []string{ns}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "gone", "Ready", "True", "Delivering")
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "first"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if msg := waitCondition(t, ns, "gone", "Ready", "False", "Gone"); !strings.Contains(msg, "410") {
		t.Errorf("the Ready=False message does not name the 410: %s", msg)
	}
	for _, name := range []string{"second", "third"} {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Disabled, the sink dead-letters what it is handed, as gone, instead of sending it.
	testbed.Eventually(t, 60*time.Second, func() error {
		if n := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="gone",sink="subscription.`+ns+`.gone"}`); n != 3 {
			return fmt.Errorf("%v events dead-lettered as gone, want 3 (first, answered 410; second and third, not sent)", n)
		}
		return nil
	})
	if got := keysOf(gone); !slices.Equal(got, []string{ns + "/first"}) {
		t.Errorf("after answering 410 the receiver was sent %v, want only %s/first", got, ns)
	}

	back.Store(true)
	patch := []byte(`{"spec":{"eventTypes":["ADDED","MODIFIED","DELETED"]}}`)
	if _, err := subs.Patch(t.Context(), "gone", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "gone", "Ready", "True", "Delivering")
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fourth"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReceived(t, gone, ns, "fourth")
}

// TestANamespacesSubscriptionsAreBoundedByItsQuota: with subscriptions.quota.perNamespace 2,
// the third subscription of a namespace is refused (QuotaExceeded); with deliveriesPerSecond
// 2, the two accepted ones share two attempts a second: their 12 deliveries (6 configmaps
// each) take at least 5 s after the burst of 2. The bound is a lower one: a loaded machine
// only makes the span longer.
func TestANamespacesSubscriptionsAreBoundedByItsQuota(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	rc := newReceiverOn(t, "127.0.0.2")
	startServing(t, ns, "127.0.0.2/32", ", quota: {perNamespace: 2, deliveriesPerSecond: 2}")
	subs := subscriptionsAs(t, carol, ns)
	for _, name := range []string{"a1", "a2", "a3"} {
		if _, err := subs.Create(t.Context(), newSubscription(name, rc.URL, []string{ns}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, ns, "a1", "Ready", "True", "Delivering")
	waitCondition(t, ns, "a2", "Ready", "True", "Delivering")
	if msg := waitCondition(t, ns, "a3", "Accepted", "False", "QuotaExceeded"); !strings.Contains(msg, "perNamespace") {
		t.Errorf("the QuotaExceeded message does not name the setting: %s", msg)
	}
	for i := range 6 {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("cm-", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got := rc.waitFor(t, 12, 90*time.Second)
	if len(got) != 12 {
		t.Fatalf("the receiver got %d requests, want 12 (6 configmaps to each of 2 subscriptions): %v", len(got), keysOf(rc))
	}
	if span := got[11].at.Sub(got[0].at); span < 5*time.Second-500*time.Millisecond {
		t.Errorf("12 deliveries at 2 a second after a burst of 2 took %s, want at least 5s", span)
	}
}

// TestASubscriptionSignsWithTheKeysOfItsNamespacesSecretIfItsWriterMayReadIt: carol's
// subscription names the Secret dynwatch-signing of her namespace, which holds a Standard
// Webhooks secret and an Ed25519 key. She may read it: every request carries both signatures
// (v1 verified with the secret, v1a with the public key the status publishes). dave, who may
// not read it, is refused (Accepted=False naming spec.signing.secretName), as is a Secret of a
// name dynwatch does not read and a key that is not a signing key.
func TestASubscriptionSignsWithTheKeysOfItsNamespacesSecretIfItsWriterMayReadIt(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	dave := "dave-" + ns
	grantSubscriptions(t, admin, ns, dave)
	grantRole(t, admin, ns, "signing", "signing-carol", carol,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"dynwatch-signing"}, Verbs: []string{"get"}})
	secret, _ := signingSecret(t)
	keyPath := filepath.Join(t.TempDir(), "key.pem")
	writeSigningKey(t, keyPath)
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "dynwatch-signing"},
		Data:       map[string][]byte{"v1": []byte(secret), "v1a": keyPEM, "junk": []byte("not a key")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiverOn(t, "127.0.0.2")
	startServing(t, ns, "127.0.0.2/32", "")
	signed := func(name, secretName string, keys ...string) *unstructured.Unstructured {
		s := newSubscription(name, rc.URL, []string{ns})
		var ks []any
		for _, k := range keys {
			ks = append(ks, k)
		}
		s.Object["spec"].(map[string]any)["signing"] = map[string]any{"secretName": secretName, "keys": ks}
		return s
	}
	for user, sub := range map[string]*unstructured.Unstructured{
		carol: signed("signed", "dynwatch-signing", "v1", "v1a"),
		dave:  signed("borrowed", "dynwatch-signing", "v1"),
	} {
		if _, err := subscriptionsAs(t, user, ns).Create(t.Context(), sub, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, sub := range []*unstructured.Unstructured{signed("othername", "other-secret", "v1"), signed("junk", "dynwatch-signing", "junk")} {
		if _, err := subscriptionsAs(t, carol, ns).Create(t.Context(), sub, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{
		"borrowed":  dave + " may not get the Secret dynwatch-signing",
		"othername": "spec.signing.secretName: must be one of",
		"junk":      `spec.signing.keys[0]: key "junk" of Secret dynwatch-signing does not hold a Standard Webhooks secret`,
	} {
		if msg := waitCondition(t, ns, name, "Accepted", "False", "Invalid"); !strings.Contains(msg, want) {
			t.Errorf("subscription %s: Accepted=False says %q, want it to say %q", name, msg, want)
		}
	}
	waitCondition(t, ns, "signed", "Ready", "True", "Delivering")
	u, err := dynamic.NewForConfigOrDie(cluster.Config).Resource(subscriptionsGVR).Namespace(ns).Get(t.Context(), "signed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keys, _, _ := unstructured.NestedSlice(u.Object, "status", "signingKeys")
	if len(keys) != 1 {
		t.Fatalf("status.signingKeys is %v, want the one Ed25519 public key", keys)
	}
	pub, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(keys[0].(map[string]any)["publicKey"].(string), "whpk_"))
	if err != nil || len(pub) != ed25519.PublicKeySize {
		t.Fatalf("status.signingKeys[0].publicKey %v", keys[0])
	}
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "signed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := rc.waitFor(t, 1, 60*time.Second)
	verifier, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if err := verifier.Verify(r.body, r.header); err != nil {
			t.Errorf("a request does not verify with the Secret's v1 key: %v", err)
		}
		if !signedBy(r, ed25519.PublicKey(pub)) {
			t.Error("a request does not verify with the public key in the subscription's status")
		}
	}
}

// TestWithoutTheAdmissionPoliciesNoSubscriptionIsServed: in a cluster of its own, once the
// ValidatingAdmissionPolicyBinding that guards spec.subject is deleted, dynwatch serves no
// subscription (Accepted=False, NoAdmissionPolicy): a subject could be anyone's. A configured
// webhook, recorded in the same order, receives the change made after; the subscription not.
func TestWithoutTheAdmissionPoliciesNoSubscriptionIsServed(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{})
	for _, f := range []string{"crd.yaml", "admission.yaml"} {
		if out, err := c.Kubectl(t.Context(), "apply", "-f", "../../charts/dynwatch/files/subscriptions/"+f); err != nil {
			t.Fatalf("kubectl apply %s: %v\n%s", f, err, out)
		}
	}
	admin := kubernetes.NewForConfigOrDie(c.Config)
	ns := namespaceIn(t, c.Config)
	user := "erin-" + ns
	grantConfigMapReads(t, admin, ns, user)
	grantSubscriptions(t, admin, ns, user)
	sub, witness := newReceiverOn(t, "127.0.0.2"), newReceiverOn(t, "127.0.0.2")
	as := rest.CopyConfig(c.Config)
	as.Impersonate = rest.ImpersonationConfig{UserName: user}
	subs := dynamic.NewForConfigOrDie(as).Resource(subscriptionsGVR).Namespace(ns)
	testbed.Eventually(t, 60*time.Second, func() error {
		created, err := subs.Create(t.Context(), newSubscription("guarded", sub.URL, []string{ns}), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if got, _, _ := unstructured.NestedString(created.Object, "spec", "subject", "username"); got != user {
			_ = subs.Delete(t.Context(), "guarded", metav1.DeleteOptions{})
			return fmt.Errorf("stored with subject %q: the mutating policy is not in effect yet", got)
		}
		return nil
	})
	p := start(t, c.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps}]
webhooks: [{name: witness, url: %q, namespaces: [%s]}]
subscriptions: {enabled: true, namespaces: [%s], reviewEvery: 2s, egress: {allow: [127.0.0.2/32]}}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, witness.URL, ns, ns))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitConditionIn(t, c.Config, ns, "guarded", "Ready", "True", "Delivering")
	create := func(name string) {
		t.Helper()
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("before")
	waitReceived(t, sub, ns, "before")
	if out, err := c.Kubectl(t.Context(), "delete", "validatingadmissionpolicybinding", "subscriptions.events.dynwatch.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if msg := waitConditionIn(t, c.Config, ns, "guarded", "Accepted", "False", "NoAdmissionPolicy"); !strings.Contains(msg, "ValidatingAdmissionPolicyBinding") {
		t.Errorf("the NoAdmissionPolicy message does not name the binding: %s", msg)
	}
	create("after")
	waitReceived(t, witness, ns, "after")
	if got := keysOf(sub); !slices.Equal(got, []string{ns + "/before"}) {
		t.Errorf("with the validating policy unbound the subscription received %v, want only %s/before", got, ns)
	}
}

// TestASubscriptionsReviewHoldsUpNoOtherSinkAndOneThatFailsLosesNothing: the reviews client
// may ask once every 40 s, after the two reviews that authorize the subscription. A configmap
// made in a second namespace where the subscription's writer may watch reaches a configured
// webhook before dynwatch has asked whether the writer may watch there (the apiserver's audit
// log has no such review yet): its events never wait on a subscription's review. The
// subscription receives it too, once the review is made, though the first asks failed (their
// wait for the rate limit would have passed their deadline).
func TestASubscriptionsReviewHoldsUpNoOtherSinkAndOneThatFailsLosesNothing(t *testing.T) {
	t.Parallel()
	ns, user, admin := team(t)
	other := namespace(t)
	grantConfigMapReads(t, admin, other, user)
	sub, configured := newReceiver(t, nil, false), newReceiver(t, nil, false)
	// Its two namespaces only: the other tests' namespaces would each want a review too, and at
	// one every 40 s those would take the turns this test waits for.
	startWithWebhooks(t, "resources: [{version: v1, resource: configmaps, namespaces: ["+ns+", "+other+"]}]\nwebhooks: [{name: configured, url: "+configured.URL+"}]\n"+
		"subscriptions: {enabled: true, namespaces: ["+ns+"], egress: {allow: [127.0.0.1/32]}}\nclient: {rateLimits: {accessReviews: {qps: 0.025, burst: 2}}}\n")
	if _, err := subscriptionsAs(t, user, ns).Create(t.Context(), newSubscription("team", sub.URL, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "team", "Ready", "True", "Delivering")
	created := time.Now()
	if _, err := admin.CoreV1().ConfigMaps(other).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReceived(t, configured, other, "x")
	asked, err := auditedReviewsIn(cluster.AuditLog(), auditLogSize(t), user, other, "watch")
	if err != nil {
		t.Fatal(err)
	}
	var at time.Time
	for _, r := range configured.got() {
		if r.subject == other+"/x" {
			at = r.at
			break
		}
	}
	if len(asked) > 0 {
		t.Errorf("the configured webhook received %s/x %s after it was created, only after dynwatch had asked whether %s may watch there: its events waited on a subscription's review",
			other, at.Sub(created).Round(time.Millisecond), user)
	}
	t.Logf("the configured webhook received %s/x %s after it was created", other, at.Sub(created).Round(time.Millisecond))
	testbed.Eventually(t, 2*time.Minute, func() error {
		if got := keysOf(sub); !slices.Contains(got, other+"/x") {
			return fmt.Errorf("the subscription received %v, not yet %s/x", got, other)
		}
		return nil
	})
	if asked, err = auditedReviews(cluster.AuditLog(), user, other, "watch"); err != nil || len(asked) == 0 {
		t.Errorf("the subscription received %s/x, but the audit log has no review of whether %s may watch there (%v)", other, user, err)
	}
}

// TestASubscriptionsQueuedEventsSurviveAKillAndAreDeliveredAfterTheRestart: a subscription's
// receiver answers 503, so its five configmaps' events wait in the state store's outbox;
// dynwatch is killed (SIGKILL) and started again on the same store once the receiver answers
// 200, and every one of them is delivered: the subscription's sink is declared again before the
// outbox is read back, not taken for a removed sink.
func TestASubscriptionsQueuedEventsSurviveAKillAndAreDeliveredAfterTheRestart(t *testing.T) {
	t.Parallel()
	ns, user, admin := team(t)
	var open sync.Mutex
	accepting := false
	rc := newJudge(t, func(received, int, http.Header) int {
		open.Lock()
		defer open.Unlock()
		if accepting {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	yaml := "resources: [{version: v1, resource: configmaps}]\nsubscriptions: {enabled: true, namespaces: [" + ns + "], egress: {allow: [127.0.0.1/32]}}\n" +
		"state: {path: " + filepath.Join(dir, "state.db") + "}\napi: {address: \"127.0.0.1:0\", auth: {mode: none}, tls: {enabled: false}}\nmetrics: {address: \"127.0.0.1:0\"}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	first := startFile(t, cluster.Kubeconfig, path)
	if err := first.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := subscriptionsAs(t, user, ns).Create(t.Context(), newSubscription("team", rc.URL, []string{ns}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "team", "Ready", "True", "Delivering")
	var names, keys []string
	for i := range 5 {
		name := fmt.Sprintf("queued-%d", i)
		names, keys = append(names, name), append(keys, ns+"/"+name)
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Each was tried (and refused): it is in the outbox.
	for _, name := range names {
		waitReceived(t, rc, ns, name)
	}
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	open.Lock()
	accepting = true
	open.Unlock()
	second := startFile(t, cluster.Kubeconfig, path)
	if err := second.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 2*time.Minute, func() error {
		var delivered []string
		for _, r := range rc.got() {
			if r.code == http.StatusOK && !slices.Contains(delivered, r.subject) {
				delivered = append(delivered, r.subject)
			}
		}
		slices.Sort(delivered)
		if !slices.Equal(delivered, keys) {
			return fmt.Errorf("after the restart the subscription has been delivered %v, want %v", delivered, keys)
		}
		return nil
	})
}

// TestTeamsSubscribeAStreamAndATopicAndEachReceivesOnlyWhatItsWriterMayWatch: carol, who may
// watch configmaps in her namespace only, subscribes a JetStream stream and a Kafka topic to
// configmaps of every namespace (a sink of another kind, or of two kinds, is refused at
// admission). Each is Ready, with a Durable condition: its sink's check of its
// destination (on the test bed, Unknown: neither says whether it syncs each write); the stream's subjects and the topic's keys hold her namespace's configmaps, and
// nothing of another namespace's, whose configmap was made between them.
func TestTeamsSubscribeAStreamAndATopicAndEachReceivesOnlyWhatItsWriterMayWatch(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	other := namespace(t)
	nc := startNATS(t, 1)
	stream := createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "TEAM", Subjects: []string{"team.>"}})
	k := startKafka(t)
	k.createTopic(t, "team", 1, nil)
	startServing(t, ns, "127.0.0.1/32", "")
	subs := subscriptionsAs(t, carol, ns)
	js := newSubscription("stream", "", nil)
	spec := js.Object["spec"].(map[string]any)
	delete(spec, "url")
	spec["jetstream"] = map[string]any{"servers": []any{nc.URLs()[0]}, "subjectPrefix": "team", "stream": "TEAM"}
	topic := newSubscription("topic", "", nil)
	spec = topic.Object["spec"].(map[string]any)
	delete(spec, "url")
	brokers := []any{}
	for _, b := range k.brokers {
		brokers = append(brokers, b)
	}
	spec["kafka"] = map[string]any{"brokers": brokers, "topic": "team"}
	for _, s := range []*unstructured.Unstructured{js, topic} {
		if _, err := subs.Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A sink of a kind dynwatch does not have is refused at admission, as is one of two kinds.
	for name, sink := range map[string]map[string]any{
		"unknown": {"sqs": map[string]any{"queueUrl": "https://sqs.example/q"}},
		"both":    {"url": "http://127.0.0.1:9/", "kafka": map[string]any{"brokers": []any{"127.0.0.1:9"}, "topic": "t"}},
	} {
		s := newSubscription(name, "", nil)
		spec := s.Object["spec"].(map[string]any)
		delete(spec, "url")
		maps.Copy(spec, sink)
		if _, err := subs.Create(t.Context(), s, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "set exactly one of url (a webhook), jetstream and kafka") {
			t.Errorf("a subscription with a sink of kind %s was not refused naming the kinds: %v", name, err)
		}
	}
	if msg := waitCondition(t, ns, "stream", "Accepted", "True", "Valid"); !strings.Contains(msg, "JetStream") {
		t.Errorf("the stream's Accepted message does not say it is delivered as a JetStream sink: %s", msg)
	}
	waitCondition(t, ns, "stream", "Ready", "True", "Delivering")
	waitCondition(t, ns, "topic", "Ready", "True", "Delivering")
	// Each reports its destination's durability as its sink last checked it.
	admin2 := dynamic.NewForConfigOrDie(cluster.Config)
	for name, destination := range map[string]string{"stream": "stream TEAM", "topic": "topic team"} {
		testbed.Eventually(t, time.Minute, func() error {
			u, err := admin2.Resource(subscriptionsGVR).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if c := c.(map[string]any); c["type"] == "Durable" {
					if msg, _ := c["message"].(string); c["reason"] == "NotChecked" || !strings.Contains(msg, destination) {
						return fmt.Errorf("the %s subscription's Durable condition is %v (%v: %v), want its sink's check, naming %s", name, c["status"], c["reason"], c["message"], destination)
					}
					return nil
				}
			}
			return fmt.Errorf("the %s subscription has no Durable condition yet: %v", name, conds)
		})
	}
	for _, cm := range [][2]string{{ns, "first"}, {other, "elsewhere"}, {ns, "marker"}} {
		if _, err := admin.CoreV1().ConfigMaps(cm[0]).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm[1]}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// One watch carries both namespaces' configmaps, and each sink's events keep the
	// journal's order within an object only: wait for both of carol's, then look for the other.
	names := func(in []string) []string {
		var out []string
		for _, s := range in {
			for _, ns := range []string{ns, other} {
				for _, name := range []string{"first", "elsewhere", "marker"} {
					if strings.HasSuffix(s, ns+"."+name) || strings.HasSuffix(s, ns+"/"+name) {
						out = append(out, ns+"/"+name)
					}
				}
			}
		}
		slices.Sort(out)
		return out
	}
	want := []string{ns + "/first", ns + "/marker"}
	testbed.Eventually(t, time.Minute, func() error {
		var subjects []string
		for _, m := range readStream(t, stream) {
			subjects = append(subjects, m.subject)
		}
		if got := names(subjects); !slices.Equal(got, want) {
			return fmt.Errorf("the stream holds %v (subjects %v), want %v", got, subjects, want)
		}
		return nil
	})
	testbed.Eventually(t, time.Minute, func() error {
		var keys []string
		for _, r := range readRecords(t, k.brokers, "team") {
			keys = append(keys, r.key)
		}
		if got := names(keys); !slices.Equal(got, want) {
			return fmt.Errorf("the topic holds %v (keys %v), want %v", got, keys, want)
		}
		return nil
	})
}

// TestAStreamSubscriptionLogsInWithItsNamespacesSecret: a Kafka cluster that asks for
// SCRAM-SHA-256 takes carol's subscription's records, logged in with the user name and password
// of her namespace's Secret dynwatch-credentials, which she may read; a subscription whose
// Secret holds another password produces nothing, and one naming a key the Secret lacks is not
// Accepted, naming the field and the key.
func TestAStreamSubscriptionLogsInWithItsNamespacesSecret(t *testing.T) {
	t.Parallel()
	ns, carol, admin := team(t)
	grantRole(t, admin, ns, "credentials", "credentials-carol", carol,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"dynwatch-credentials", "wrong-credentials"}, Verbs: []string{"get"}})
	for name, password := range map[string]string{"dynwatch-credentials": "the-right-password", "wrong-credentials": "a-wrong-password"} {
		if _, err := admin.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Data:       map[string][]byte{"username": []byte("team"), "password": []byte(password)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	k, err := testbed.StartKafka(t.TempDir(), 1, []string{"team"}, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "team", "the-right-password"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	metrics := startServing(t, ns, "127.0.0.1/32", ", credentialSecretNames: [dynwatch-credentials, wrong-credentials]")
	topic := func(name, secretName, passwordKey string) *unstructured.Unstructured {
		s := newSubscription(name, "", []string{ns})
		spec := s.Object["spec"].(map[string]any)
		delete(spec, "url")
		spec["kafka"] = map[string]any{"brokers": []any{k.Brokers()[0]}, "topic": "team",
			"sasl": map[string]any{"mechanism": "SCRAM-SHA-256", "secretName": secretName, "passwordKey": passwordKey}}
		return s
	}
	for _, s := range []*unstructured.Unstructured{topic("right", "dynwatch-credentials", "password"), topic("wrong", "wrong-credentials", "password"), topic("nokey", "dynwatch-credentials", "pass")} {
		if _, err := subscriptionsAs(t, carol, ns).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if msg := waitCondition(t, ns, "nokey", "Accepted", "False", "Invalid"); !strings.Contains(msg, `spec.kafka.sasl.passwordKey: the Secret dynwatch-credentials has no key "pass"`) ||
		strings.Contains(msg, "the-right-password") {
		t.Errorf("the Accepted=False message of a subscription naming a key its Secret lacks: %s", msg)
	}
	waitCondition(t, ns, "right", "Ready", "True", "Delivering")
	waitCondition(t, ns, "wrong", "Ready", "True", "Delivering")
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "first"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	delivered := func(sink string) float64 {
		return metricValue(t, metrics, `dynwatch_webhook_deliveries_total{result="delivered",sink="subscription.`+ns+`.`+sink+`"}`)
	}
	testbed.Eventually(t, time.Minute, func() error {
		if n := delivered("right"); n != 1 {
			return fmt.Errorf("the subscription logged in with the right password has delivered %v events, want 1", n)
		}
		return nil
	})
	testbed.Eventually(t, time.Minute, func() error {
		if n := metricValue(t, metrics, `dynwatch_webhook_attempts_total{sink="subscription.`+ns+`.wrong"}`); n == 0 {
			return fmt.Errorf("the subscription with the wrong password has made no attempt yet")
		}
		return nil
	})
	if n := delivered("wrong"); n != 0 {
		t.Errorf("the subscription logged in with a wrong password delivered %v events, want none", n)
	}
}
