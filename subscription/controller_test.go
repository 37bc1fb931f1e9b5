package subscription

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/config"
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
	first, _ := c.sinks([]*unstructured.Unstructured{sub("granted", "a"), sub("granted", "b"), sub("other", "c")}, nil)
	l := limiters(first)
	if l["subscription.granted.a"] == nil || l["subscription.granted.a"] != l["subscription.granted.b"] || l["subscription.granted.a"] == l["subscription.other.c"] {
		t.Fatalf("the limiters are %v: want one for granted's two subscriptions, another for other's", l)
	}
	second, _ := c.sinks([]*unstructured.Unstructured{sub("granted", "a")}, nil)
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
	_, states := c.sinks(items, nil)
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
	_, states := c.sinks([]*unstructured.Unstructured{u}, nil)
	// The cluster-wide decision, then each namespace's.
	if got := asked() - before; got > authorizedChecks+1 {
		t.Errorf("authorizing a subscription naming 256 namespaces asked %v reviews, want at most %d", got, authorizedChecks+1)
	}
	if msg := states[0].authorized.Message; !strings.Contains(msg, "the first 16 of its 256 resources and namespaces") {
		t.Errorf("the Authorized condition does not say which were checked: %s", msg)
	}
}
