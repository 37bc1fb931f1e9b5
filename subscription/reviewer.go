package subscription

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
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
	asking  map[decisionKey]bool // the decisions queued by prefetch or being asked
	wanted  []wanted             // the queue
	wake    chan struct{}        // a decision was queued
	// failLog lets through at most a line a second of the reviews that failed.
	failLog rate.Sometimes
}

// decisionKey names a decision: the subject (its JSON), the verb, the resource, the namespace
// ("": cluster-wide) and the object's name ("": any). The version is left out: RBAC grants a
// resource in every version.
type decisionKey struct {
	subject   unique.Handle[string]
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
	r := &Reviewer{log: log, client: client, every: every, now: time.Now, entries: map[decisionKey]*decision{}, asking: map[decisionKey]bool{}, wake: make(chan struct{}, 1), failLog: rate.Sometimes{Interval: time.Second},
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
// cluster-wide or in that namespace. It asks the apiserver what it does not know.
func (r *Reviewer) Allowed(subject *config.Subject, gvr schema.GroupVersionResource, namespace string) (bool, error) {
	key := decisionKey{subject: subject.Key(), verb: "watch", resource: gvr.GroupResource()}
	if namespace != "" {
		if ok, err := r.decide(subject, key); err == nil && ok {
			return true, nil
		}
	}
	key.namespace = namespace
	return r.decide(subject, key)
}

// Known implements delivery.Access: what Allowed would answer, if its decisions are known and
// fresh. When they are not, it starts asking for them (once at a time for each) and returns
// known false at once: the journal's filter workers, which every sink's events pass through,
// never wait on a review.
func (r *Reviewer) Known(subject *config.Subject, gvr schema.GroupVersionResource, namespace string) (allowed, known bool) {
	key := decisionKey{subject: subject.Key(), verb: "watch", resource: gvr.GroupResource()}
	clusterAllowed, clusterKnown := r.lookup(key)
	if clusterKnown && (clusterAllowed || namespace == "") {
		return clusterAllowed, true
	}
	if namespace != "" {
		key.namespace = namespace
		nsAllowed, nsKnown := r.lookup(key)
		if nsKnown && (nsAllowed || clusterKnown) {
			return nsAllowed, true
		}
	}
	r.prefetch(subject, gvr, key)
	return false, false
}

// lookup is key's decision, if it is fresh.
func (r *Reviewer) lookup(key decisionKey) (allowed, fresh bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.entries[key]; d != nil && now.Sub(d.checked) < 2*r.every {
		d.used = now
		return d.allowed, true
	}
	return false, false
}

// prefetch queues what Allowed needs to decide whether subject may watch gvr's objects in
// key's namespace, unless it is queued already; Run asks the queue's decisions one at a time.
func (r *Reviewer) prefetch(subject *config.Subject, gvr schema.GroupVersionResource, key decisionKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asking[key] {
		return
	}
	r.asking[key] = true
	r.wanted = append(r.wanted, wanted{key: key, subject: subject, gvr: gvr})
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// wanted is a decision Known was asked for and did not know.
type wanted struct {
	key     decisionKey
	subject *config.Subject
	gvr     schema.GroupVersionResource
}

// fetch asks the decisions prefetch queued, in order, one at a time, until ctx ends: one
// asker at a time never waits on the reviews client's rate limit past its deadline, as
// hundreds at once would.
func (r *Reviewer) fetch(ctx context.Context) {
	for {
		r.mu.Lock()
		var next *wanted
		if len(r.wanted) > 0 {
			next = &r.wanted[0]
			r.wanted = r.wanted[1:]
		}
		r.mu.Unlock()
		if next == nil {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			}
			continue
		}
		if _, err := r.Allowed(next.subject, next.gvr, next.key.namespace); err != nil && ctx.Err() == nil {
			r.failLog.Do(func() {
				r.log.Warn("could not review a subscription's access; its sink asks again before it sends", "user", next.subject.Username,
					"resource", next.key.resource.String(), "namespace", next.key.namespace, "err", err)
			})
		}
		r.mu.Lock()
		delete(r.asking, next.key)
		r.mu.Unlock()
	}
}

// MayGet reports whether subject may get the object name of resource in namespace.
func (r *Reviewer) MayGet(subject *config.Subject, resource schema.GroupResource, namespace, name string) (bool, error) {
	return r.decide(subject, decisionKey{subject: subject.Key(), verb: "get", resource: resource, namespace: namespace, name: name})
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
	v, err, _ := r.flight.Do(fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s", key.subject.Value(), key.verb, key.resource, key.namespace, key.name), func() (any, error) {
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

// Run asks the decisions Known did not know, one at a time as they come, and every decision
// in use again once it is a period old, and forgets those unused for three periods, until ctx
// ends. The decisions due are asked oldest first, one at a time, spaced evenly: 1.25 times as
// many a period as there are decisions, so that the decisions made at once (a new
// subscription's, a namespace's first events) are asked again spread over the period that
// follows instead of at once. The reviews client's rate limit bounds the rest.
func (r *Reviewer) Run(ctx context.Context) error {
	var fetching sync.WaitGroup
	defer fetching.Wait()
	fetching.Go(func() { r.fetch(ctx) })
	tick := time.NewTicker(max(r.every/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due, spacing := r.due()
		for i, d := range due {
			if i > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(spacing):
				}
			}
			rctx, cancel := context.WithTimeout(ctx, reviewTimeout)
			if _, err := r.review(rctx, d.subject, d.key); err != nil && ctx.Err() == nil {
				r.failLog.Do(func() {
					r.log.Warn("could not review a subscription's access again; its last decision stands for one more period", "user", d.subject.Username,
						"verb", d.key.verb, "resource", d.key.resource.String(), "namespace", d.key.namespace, "name", d.key.name, "err", err)
				})
			}
			cancel()
		}
	}
}

// dueDecision is a decision to ask again.
type dueDecision struct {
	key     decisionKey
	subject *config.Subject
	checked time.Time
}

// due are the decisions a period old or more, still in use, oldest first, and the spacing of
// their reviews; it forgets those unused for three periods.
func (r *Reviewer) due() ([]dueDecision, time.Duration) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []dueDecision
	for key, d := range r.entries {
		switch {
		case now.Sub(d.used) > 3*r.every:
			delete(r.entries, key)
		case now.Sub(d.checked) >= r.every:
			out = append(out, dueDecision{key: key, subject: d.subject, checked: d.checked})
		}
	}
	slices.SortFunc(out, func(a, b dueDecision) int { return a.checked.Compare(b.checked) })
	return out, time.Duration(float64(r.every) / (1.25 * float64(max(1, len(r.entries)))))
}
