package subscription

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestANamespacesLimiterIsSharedByItsSubscriptionsAndForgottenWithTheLast: the sinks of one
// namespace's subscriptions share one limiter, kept from one sync to the next; once the
// namespace has no subscription left, its limiter is forgotten (namespaces come and go).
func TestANamespacesLimiterIsSharedByItsSubscriptionsAndForgottenWithTheLast(t *testing.T) {
	r, _ := startReviewing(t, "limited-carol", time.Hour)
	cfg := loadConfig(t)
	c := NewController(Options{Reviewer: r, Config: func() *config.Config { return cfg }})
	sub := func(ns, name string) *unstructured.Unstructured {
		u := subscriptionOf(map[string]any{"url": "https://receiver.invalid/", "resources": []any{"configmaps"}, "subject": map[string]any{"username": "limited-carol"}})
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	limiters := func(sinks []config.SinkConfig) map[string]*rate.Limiter {
		out := map[string]*rate.Limiter{}
		for _, s := range sinks {
			out[s.Shared().Name] = s.Shared().Limiter
		}
		return out
	}
	first, _, _ := c.sinks([]*unstructured.Unstructured{sub("granted", "a"), sub("granted", "b"), sub("other", "c")}, nil)
	l := limiters(first)
	if l["subscription.granted.a"] == nil || l["subscription.granted.a"] != l["subscription.granted.b"] || l["subscription.granted.a"] == l["subscription.other.c"] {
		t.Fatalf("the limiters are %v: want one for granted's two subscriptions, another for other's", l)
	}
	second, _, _ := c.sinks([]*unstructured.Unstructured{sub("granted", "a")}, nil)
	if got := limiters(second)["subscription.granted.a"]; got != l["subscription.granted.a"] {
		t.Error("granted's limiter was made anew at the next sync: its subscriptions' rate would start over")
	}
	if _, kept := c.limiters["other"]; kept || len(c.limiters) != 1 {
		t.Errorf("after other's last subscription went, the controller keeps the limiters of %v; want granted's only", slices.Collect(maps.Keys(c.limiters)))
	}
}

// TestASlowResolverHoldsUpTheSyncForOneTimeoutInAll: 20 subscriptions of 16 NATS servers each,
// every name's lookup hanging until it is given up. The sync resolves them all within one
// resolveTimeout, not one per name (320 of them, 640 s one after the other): a tenant's many
// names cannot stall every subscription's status (the names not resolved in time count as not
// refused: the dial's check is what refuses). A name that resolves to a refused address makes
// its subscription EgressRefused, naming the server.
func TestASlowResolverHoldsUpTheSyncForOneTimeoutInAll(t *testing.T) {
	r, _ := startReviewing(t, "resolved-dave", time.Hour)
	cfg := loadConfig(t)
	cfg.Subscriptions.Quota.PerNamespace = 20
	c := NewController(Options{Reviewer: r, Config: func() *config.Config { return cfg }})
	c.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "metadata.refused" {
			return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	var items []*unstructured.Unstructured
	for i := range 20 {
		var servers []any
		for j := range 16 {
			servers = append(servers, fmt.Sprintf("nats://n%d.s%d.invalid:4222", j, i))
		}
		if i == 0 {
			servers[3] = "nats://metadata.refused:4222"
		}
		u := subscriptionOf(map[string]any{"jetstream": map[string]any{"servers": servers}, "resources": []any{"configmaps"}, "subject": map[string]any{"username": "resolved-dave"}})
		u.SetNamespace("granted")
		u.SetName(fmt.Sprintf("s%d", i))
		items = append(items, u)
	}
	start := time.Now()
	_, states, _ := c.sinks(items, nil)
	if took := time.Since(start); took > 20*resolveTimeout {
		t.Errorf("the sync took %s with a resolver that hangs: more than one resolveTimeout (%s) for all the names", took, resolveTimeout)
	}
	for i, st := range states {
		want := metav1.ConditionTrue
		if i == 0 {
			want = metav1.ConditionFalse
		}
		if st.ready.Status != want {
			t.Errorf("subscription s%d is Ready=%s (%s: %s), want %s", i, st.ready.Status, st.ready.Reason, st.ready.Message, want)
		}
	}
	if msg := states[0].ready.Message; !strings.Contains(msg, "spec.jetstream.servers[3]: metadata.refused resolves to an address a subscription may not reach") {
		t.Errorf("the EgressRefused message does not name the server: %s", msg)
	}
}

// TestASubscriptionNamingManyNamespacesCostsABoundedNumberOfReviews: a subscription naming 256
// namespaces is authorized by the first authorizedChecks of them at a sync, one review each,
// not 256: it cannot spend the reviews every subscription shares. Its condition says so.
func TestASubscriptionNamingManyNamespacesCostsABoundedNumberOfReviews(t *testing.T) {
	r, reviews := startReviewing(t, "many-erin", time.Hour)
	cfg := loadConfig(t)
	c := NewController(Options{Reviewer: r, Config: func() *config.Config { return cfg }})
	namespaces := []any{"granted"}
	for i := range 255 {
		namespaces = append(namespaces, fmt.Sprintf("ns-%d", i))
	}
	u := subscriptionOf(map[string]any{"url": "https://receiver.invalid/", "resources": []any{"configmaps"}, "namespaces": namespaces, "subject": map[string]any{"username": "many-erin"}})
	u.SetNamespace("granted")
	asked := func() float64 {
		return testutil.ToFloat64(reviews.WithLabelValues("allowed")) + testutil.ToFloat64(reviews.WithLabelValues("denied"))
	}
	before := asked()
	_, states, _ := c.sinks([]*unstructured.Unstructured{u}, nil)
	// The cluster-wide decision, then each namespace's.
	if got := asked() - before; got > authorizedChecks+1 {
		t.Errorf("authorizing a subscription naming 256 namespaces asked %v reviews, want at most %d", got, authorizedChecks+1)
	}
	if msg := states[0].authorized.Message; !strings.Contains(msg, "the first 16 of its 256 resources and namespaces") {
		t.Errorf("the Authorized condition does not say which were checked: %s", msg)
	}
}

// TestAnAPIServerThatDoesNotAnswerLeavesTheSubscriptionsSinksAsTheyWere: with both admission
// policies bound, a subscription that signs with its namespace's Secret is applied. While the
// apiserver does not answer (a client to a loopback port nothing listens on: the connection is
// refused, as while an apiserver restarts), first whether the policies are bound, then the
// Secret, is not known, and the subscription's sink is served as it was: delivery keeps it and
// its outbox, rather than removing it and dead-lettering what it holds.
func TestAnAPIServerThatDoesNotAnswerLeavesTheSubscriptionsSinksAsTheyWere(t *testing.T) {
	const user = "limited-carol"
	r, cluster := startReviewingOn(t, user, time.Hour)
	cfg := loadConfig(t)
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, b := range []struct {
		gvr  schema.GroupVersionResource
		kind string
		spec map[string]any
	}{
		{mutatingBindings, "MutatingAdmissionPolicyBinding", map[string]any{"policyName": PolicyName}},
		{validatingBindings, "ValidatingAdmissionPolicyBinding", map[string]any{"policyName": PolicyName, "validationActions": []any{"Deny"}}},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": b.kind, "metadata": map[string]any{"name": PolicyName}, "spec": b.spec}}
		if _, err := dyn.Resource(b.gvr).Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mayReadSecrets(t, cs, "team-a", user)
	key := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a key of thirty-two bytes, say..."))
	if _, err := cs.CoreV1().Secrets("team-a").Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dynwatch-signing"}, Data: map[string][]byte{"v1": []byte(key)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secretFrom := func(cs kubernetes.Interface) func(context.Context, string, string) (map[string][]byte, error) {
		return func(ctx context.Context, namespace, name string) (map[string][]byte, error) {
			s, err := cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return s.Data, nil
		}
	}
	var applied [][]string
	c := NewController(Options{Logger: slog.New(slog.DiscardHandler), Client: dyn, Reviewer: r, Config: func() *config.Config { return cfg },
		Writes: func() bool { return false }, Secret: secretFrom(cs),
		Apply: func(sinks []config.SinkConfig) error {
			var names []string
			for _, s := range sinks {
				names = append(names, s.Shared().Name)
			}
			applied = append(applied, names)
			return nil
		}})
	sub := subscriptionOf(map[string]any{"url": "https://receiver.invalid/", "resources": []any{"configmaps"}, "subject": map[string]any{"username": user},
		"signing": map[string]any{"secretName": "dynwatch-signing", "keys": []any{"v1"}}})
	sub.SetUID("a-uid")
	items := []*unstructured.Unstructured{sub}
	// RBAC's cache catches up with the Secret's grant within a moment.
	testbed.Eventually(t, 30*time.Second, func() error {
		applied = nil
		c.sync(t.Context(), items)
		if len(applied) != 1 || len(applied[0]) != 1 {
			return fmt.Errorf("with the policies bound and the Secret readable, the sync applied %v; want the subscription's sink", applied)
		}
		return nil
	})
	served := applied[0]

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := &rest.Config{Host: "http://" + l.Addr().String()}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	c.o.Client = dynamic.NewForConfigOrDie(refused)
	c.sync(t.Context(), items)
	if len(applied) != 1 {
		t.Fatalf("with the apiserver not answering whether the policies are bound, the sync applied %v: the subscription's sink %v was removed, and what its outbox held dead-lettered", applied[1], served)
	}

	c.o.Client, c.o.Secret = dyn, secretFrom(kubernetes.NewForConfigOrDie(refused))
	c.sync(t.Context(), items)
	if len(applied) != 2 || !slices.Equal(applied[1], served) {
		t.Fatalf("with the apiserver not answering for the Secret, the syncs applied %v; want %v again: the sink served as it was", applied, served)
	}

	c.o.Secret = secretFrom(cs)
	c.sync(t.Context(), items)
	if len(applied) != 3 || !slices.Equal(applied[2], served) {
		t.Errorf("with the apiserver answering again, the syncs applied %v; want %v again", applied, served)
	}
}

// mayReadSecrets lets user get the Secrets of namespace, which it creates.
func mayReadSecrets(t *testing.T, cs kubernetes.Interface, namespace, user string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: namespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}
	if _, err := cs.RbacV1().Roles(namespace).Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
