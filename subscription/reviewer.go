package subscription

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/dynwatch/dynwatch/config"
)

// reviewTimeout bounds one SubjectAccessReview.
const reviewTimeout = 10 * time.Second

// Reviewer decides what the subjects of subscriptions may watch, by SubjectAccessReview, and
// keeps each decision for as long as it is used, asking it again every period.
type Reviewer struct {
	log     *slog.Logger
	client  authorizationclient.SubjectAccessReviewInterface
	every   time.Duration
	now     func() time.Time
	reviews *prometheus.CounterVec
	flight  singleflight.Group

	mu      sync.Mutex
	entries map[decisionKey]*decision
}

// decisionKey names a decision: the subject (its JSON), the verb, the resource, the namespace
// ("": cluster-wide) and the object's name ("": any). The version is left out: RBAC grants a
// resource in every version.
type decisionKey struct {
	subject   string
	verb      string
	resource  schema.GroupResource
	namespace string
	name      string
}

type decision struct {
	subject       *config.Subject
	allowed       bool
	checked, used time.Time
}

// NewReviewer builds a Reviewer asking client, every period; its metric is registered on reg.
func NewReviewer(log *slog.Logger, reg prometheus.Registerer, client authorizationclient.SubjectAccessReviewInterface, every time.Duration) (*Reviewer, error) {
	r := &Reviewer{log: log, client: client, every: every, now: time.Now, entries: map[decisionKey]*decision{},
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_subscription_access_reviews_total",
			Help: "SubjectAccessReviews asked for subscriptions' subjects, by result: allowed, denied or error.",
		}, []string{"result"})}
	for _, res := range []string{"allowed", "denied", "error"} {
		r.reviews.WithLabelValues(res)
	}
	if err := reg.Register(r.reviews); err != nil {
		return nil, err
	}
	return r, nil
}

// Allowed implements delivery.Access: whether subject may watch gvr's objects in namespace,
// cluster-wide or in that namespace.
func (r *Reviewer) Allowed(subject *config.Subject, gvr schema.GroupVersionResource, namespace string) (bool, error) {
	key := decisionKey{subject: subjectKey(subject), verb: "watch", resource: gvr.GroupResource()}
	if namespace != "" {
		if ok, err := r.decide(subject, key); err == nil && ok {
			return true, nil
		}
	}
	key.namespace = namespace
	return r.decide(subject, key)
}

// MayGet reports whether subject may get the object name of resource in namespace.
func (r *Reviewer) MayGet(subject *config.Subject, resource schema.GroupResource, namespace, name string) (bool, error) {
	return r.decide(subject, decisionKey{subject: subjectKey(subject), verb: "get", resource: resource, namespace: namespace, name: name})
}

// decide answers key from the cache while it is fresh (asked within two periods: the refresh
// asks it again after one), else asks.
func (r *Reviewer) decide(subject *config.Subject, key decisionKey) (bool, error) {
	now := r.now()
	r.mu.Lock()
	if d := r.entries[key]; d != nil && now.Sub(d.checked) < 2*r.every {
		d.used = now
		allowed := d.allowed
		r.mu.Unlock()
		return allowed, nil
	}
	r.mu.Unlock()
	v, err, _ := r.flight.Do(fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s", key.subject, key.verb, key.resource, key.namespace, key.name), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
		defer cancel()
		return r.review(ctx, subject, key)
	})
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// review asks the apiserver and records the answer.
func (r *Reviewer) review(ctx context.Context, subject *config.Subject, key decisionKey) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range subject.Extra {
		extra[k] = v
	}
	sar, err := r.client.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: subject.Username, UID: subject.UID, Groups: subject.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: key.verb, Group: key.resource.Group, Resource: key.resource.Resource, Namespace: key.namespace, Name: key.name},
	}}, metav1.CreateOptions{})
	if err != nil {
		r.reviews.WithLabelValues("error").Inc()
		return false, fmt.Errorf("SubjectAccessReview for %s: %w", subject.Username, err)
	}
	allowed := sar.Status.Allowed && !sar.Status.Denied
	if allowed {
		r.reviews.WithLabelValues("allowed").Inc()
	} else {
		r.reviews.WithLabelValues("denied").Inc()
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.entries[key]
	if d == nil {
		d = &decision{subject: subject, used: now}
		r.entries[key] = d
	}
	d.allowed, d.checked = allowed, now
	return allowed, nil
}

// Run asks every decision in use again once it is a period old, and forgets those unused for
// three periods, until ctx ends. The reviews client's rate limit spaces the reviews.
func (r *Reviewer) Run(ctx context.Context) error {
	tick := time.NewTicker(max(r.every/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for key, subject := range r.due() {
			rctx, cancel := context.WithTimeout(ctx, reviewTimeout)
			if _, err := r.review(rctx, subject, key); err != nil && ctx.Err() == nil {
				r.log.Warn("could not review a subscription's access again; its last decision stands for one more period", "user", subject.Username,
					"verb", key.verb, "resource", key.resource.String(), "namespace", key.namespace, "name", key.name, "err", err)
			}
			cancel()
		}
	}
}

// due are the decisions a period old or more, still in use; it forgets those that are not.
func (r *Reviewer) due() map[decisionKey]*config.Subject {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[decisionKey]*config.Subject{}
	for key, d := range r.entries {
		switch {
		case now.Sub(d.used) > 3*r.every:
			delete(r.entries, key)
		case now.Sub(d.checked) >= r.every:
			out[key] = d.subject
		}
	}
	return out
}

// subjectKey is subject as a map key: its JSON (maps in key order).
func subjectKey(s *config.Subject) string {
	b, _ := json.Marshal(s)
	return string(b)
}
