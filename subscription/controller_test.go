package subscription

import (
	"maps"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"
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
