package subscription

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	kdynamicinformer "k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/webhook"
)

// Options are a Controller's dependencies.
type Options struct {
	Logger *slog.Logger
	// Client reads Subscriptions and writes their status.
	Client dynamic.Interface
	// Reviewer decides what each subscription's subject may watch.
	Reviewer *Reviewer
	// Config is the running configuration: its resources bound what a subscription may name.
	Config func() *config.Config
	// Apply hands over the subscriptions' sinks, the whole set each time.
	Apply func([]config.SinkConfig) error
	// Writes reports whether this replica writes statuses (the leader's, with leader
	// election); nil: always.
	Writes func() bool
	// Every is how often every subscription's status is checked again.
	Every time.Duration
	// Sinks reports the sinks' state in delivery (a sink disabled by 410 Gone); nil: none.
	Sinks func() []delivery.SinkStatus
	// Secret reads a Secret's data with dynwatch's own identity (only once the subject was
	// found to may read it too).
	Secret func(ctx context.Context, namespace, name string) (map[string][]byte, error)
}

// Controller turns Subscriptions into sinks and keeps their status.
type Controller struct {
	o     Options
	poked chan struct{}

	// lookup resolves a host name: the default resolver's.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by namespace, shared by its subscriptions' sinks

	// built is the sink each subscription, by uid, was last turned into (see sinks): served as
	// it was while the apiserver cannot answer what a new one needs.
	built map[types.UID]config.SinkConfig
}

// NewController builds a Controller; nothing runs until Run.
func NewController(o Options) *Controller {
	if o.Writes == nil {
		o.Writes = func() bool { return true }
	}
	return &Controller{o: o, poked: make(chan struct{}, 1), limiters: map[string]*rate.Limiter{},
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}}
}

// Initial lists the Subscriptions and returns their sinks, for delivery to start with: a
// subscription's outbox kept from before a restart is then delivered, not taken for a removed
// sink's. It fails, naming the CRD, while the resource is not served, and while the apiserver
// cannot answer whether the admission policies are bound or what a subscription's sink needs.
func (c *Controller) Initial(ctx context.Context) ([]config.SinkConfig, error) {
	list, err := c.o.Client.Resource(GVR).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("subscriptions.enabled is set, but the apiserver does not serve %s: install its CRD (the chart's subscriptions.enabled)", GVR.GroupResource())
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", GVR.GroupResource(), err)
	}
	var items []*unstructured.Unstructured
	for i := range list.Items {
		if c.serves(&list.Items[i]) {
			items = append(items, &list.Items[i])
		}
	}
	unguarded := c.unguarded(ctx)
	if errors.As(unguarded, new(unknown)) {
		// Started without its subscriptions' sinks, delivery would dead-letter what their
		// outboxes kept from before as removed sinks'.
		return nil, unguarded
	}
	if unguarded != nil {
		c.o.Logger.Error("no subscription is served", "err", unguarded)
	}
	sinks, _, unverified := c.sinks(items, unguarded)
	if len(unverified) > 0 {
		return nil, errors.Join(unverified...)
	}
	return sinks, nil
}

// Run watches Subscriptions until ctx ends: at each change, and every Every, it hands their
// sinks to Apply and writes each one's status.
func (c *Controller) Run(ctx context.Context) error {
	factory := kdynamicinformer.NewDynamicSharedInformerFactory(c.o.Client, 0)
	inf := factory.ForResource(GVR).Informer()
	if err := inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return err
	}
	poke := func(any) {
		select {
		case c.poked <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	tick := time.NewTicker(c.o.Every)
	defer tick.Stop()
	for {
		var items []*unstructured.Unstructured
		for _, obj := range inf.GetStore().List() {
			if u := obj.(*unstructured.Unstructured); c.serves(u) {
				items = append(items, u)
			}
		}
		c.sync(ctx, items)
		select {
		case <-ctx.Done():
			return nil
		case <-c.poked:
		case <-tick.C:
		}
	}
}

// PolicyName names the admission policies, and their bindings, that record a subscription's
// subject (the chart's files/subscriptions/admission.yaml).
const PolicyName = "subscriptions.events.dynwatch.io"

var (
	mutatingBindings   = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicybindings"}
	validatingBindings = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
)

// unguarded is why spec.subject cannot be trusted now, or nil: both admission policies must be
// bound, the validating one to deny. Without them a writer's subject is whatever it wrote. A
// binding that cannot be read for a reason other than its absence or dynwatch's rights (the
// apiserver restarting, a timeout, a 5xx) says nothing either way: the error is an unknown.
func (c *Controller) unguarded(ctx context.Context) error {
	for _, b := range []struct {
		gvr  schema.GroupVersionResource
		kind string
	}{{mutatingBindings, "MutatingAdmissionPolicyBinding"}, {validatingBindings, "ValidatingAdmissionPolicyBinding"}} {
		u, err := c.o.Client.Resource(b.gvr).Get(ctx, PolicyName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			return fmt.Errorf("the %s %s, which records who wrote a subscription, cannot be read: %w; without it spec.subject is whatever a writer wrote, so no subscription is served", b.kind, PolicyName, err)
		case err != nil:
			return unknown{fmt.Errorf("whether the %s %s binds its policy is not known: %w", b.kind, PolicyName, err)}
		}
		policy, _, _ := unstructured.NestedString(u.Object, "spec", "policyName")
		actions, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "validationActions")
		if policy != PolicyName || (b.gvr == validatingBindings && !slices.Contains(actions, "Deny")) {
			return fmt.Errorf("the %s %s does not bind the policy %s (to deny); without it spec.subject is whatever a writer wrote, so no subscription is served", b.kind, PolicyName, PolicyName)
		}
	}
	return nil
}

// unknown is an answer the apiserver did not give (it is restarting, timed out, answered 5xx):
// whether the admission policies are bound, whether a subject may read a Secret, the Secret.
// It decides nothing: what was served is served as it was until the apiserver answers.
type unknown struct{ error }

// serves reports whether u's namespace is one subscriptions.namespaces names (all, if none).
func (c *Controller) serves(u *unstructured.Unstructured) bool {
	ns := c.o.Config().Subscriptions.Namespaces
	return len(ns) == 0 || slices.Contains(ns, u.GetNamespace())
}

// sync applies items' sinks and writes the statuses that changed.
func (c *Controller) sync(ctx context.Context, items []*unstructured.Unstructured) {
	unguarded := c.unguarded(ctx)
	if errors.As(unguarded, new(unknown)) {
		// Removing the sinks would dead-letter what their outboxes hold, for an apiserver
		// that did not answer: they are served as they were until it does (the next change,
		// or Every).
		if ctx.Err() == nil {
			c.o.Logger.Warn("the subscriptions are served as they were", "err", unguarded)
		}
		return
	}
	if unguarded != nil && ctx.Err() == nil {
		c.o.Logger.Error("no subscription is served", "err", unguarded)
	}
	sinks, states, _ := c.sinks(items, unguarded)
	applied := c.o.Apply(sinks)
	if applied != nil {
		c.o.Logger.Error("apply the subscriptions' sinks", "err", applied)
	}
	if !c.o.Writes() {
		return
	}
	for i, u := range items {
		st := states[i]
		if st.kept {
			continue
		}
		if applied != nil && st.sink != nil {
			st.ready = condition("Ready", metav1.ConditionFalse, "NotApplied", applied.Error())
		}
		if err := c.writeStatus(ctx, u, st); err != nil && ctx.Err() == nil {
			c.o.Logger.Warn("write a subscription's status", "namespace", u.GetNamespace(), "name", u.GetName(), "err", err)
		}
	}
}

// state is what dynwatch makes of one subscription.
type state struct {
	sink                        config.SinkConfig // nil: not accepted
	kept                        bool              // sink is the one built before: its status is left as it was
	accepted, authorized, ready metav1.Condition
	durable                     metav1.Condition // a stream's; no Type for a webhook
}

// sinks builds each item's sink and state; the sinks are those accepted, sorted by name.
// While unguarded (the admission policies are missing) none is. An item whose sink needs what
// the apiserver cannot answer now (an unknown) keeps the sink it was last turned into; one that
// was never turned into a sink is not accepted, and named in unverified.
func (c *Controller) sinks(items []*unstructured.Unstructured, unguarded error) (out []config.SinkConfig, states []state, unverified []error) {
	cfg := c.o.Config()
	disabled, durable := c.delivering()
	states = make([]state, len(items))
	built := map[types.UID]config.SinkConfig{}
	over := c.overQuota(items, cfg.Subscriptions.Quota.PerNamespace)
	for i, u := range items {
		switch {
		case unguarded != nil:
			states[i] = notAccepted("NoAdmissionPolicy", unguarded.Error())
			continue
		case over[i]:
			states[i] = notAccepted("QuotaExceeded", fmt.Sprintf("namespace %s has more subscriptions than the %d subscriptions.quota.perNamespace accepts (the oldest are)",
				u.GetNamespace(), cfg.Subscriptions.Quota.PerNamespace))
			continue
		}
		w, s, err := c.accept(u, cfg)
		if prev, ok := c.built[u.GetUID()]; ok && errors.As(err, new(unknown)) {
			// Served as it was, its status left as it was, until the apiserver answers.
			c.o.Logger.Warn("a subscription is served as it was", "namespace", u.GetNamespace(), "name", u.GetName(), "err", err)
			out = append(out, prev)
			built[u.GetUID()] = prev
			states[i] = state{sink: prev, kept: true}
			continue
		}
		switch {
		case errors.As(err, new(unknown)):
			states[i] = notAccepted("Unverified", err.Error())
			unverified = append(unverified, fmt.Errorf("subscription %s/%s: %w", u.GetNamespace(), u.GetName(), err))
			continue
		case err != nil:
			states[i] = notAccepted("Invalid", err.Error())
			continue
		}
		out = append(out, w)
		built[u.GetUID()] = w
		name := w.Shared().Name
		st := state{sink: w, accepted: condition("Accepted", metav1.ConditionTrue, "Valid", "delivered as the "+kindOf(w)+" sink "+name)}
		st.authorized = c.authorized(u.GetNamespace(), s, w.Shared())
		if _, webhook := w.(*config.Webhook); !webhook {
			st.durable = durableCondition(durable[name])
		}
		states[i] = st
	}
	refused := c.refusals(out)
	for i, st := range states {
		if st.sink != nil && !st.kept {
			name := st.sink.Shared().Name
			states[i].ready = c.ready(st.authorized, refused[name], disabled[name])
		}
	}
	slices.SortFunc(out, func(a, b config.SinkConfig) int { return strings.Compare(a.Shared().Name, b.Shared().Name) })
	c.forgetLimiters(out)
	c.built = built
	return out, states, unverified
}

// forgetLimiters forgets the limiters of namespaces none of sinks is in: a namespace's last
// subscription gone, its limiter goes too.
func (c *Controller) forgetLimiters(sinks []config.SinkConfig) {
	used := map[*rate.Limiter]bool{}
	for _, s := range sinks {
		used[s.Shared().Limiter] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.DeleteFunc(c.limiters, func(_ string, l *rate.Limiter) bool { return !used[l] })
}

// notAccepted is the state of a subscription refused for reason.
func notAccepted(reason, message string) state {
	return state{
		accepted:   condition("Accepted", metav1.ConditionFalse, reason, message),
		authorized: condition("Authorized", metav1.ConditionUnknown, "NotAccepted", "the subscription is not accepted"),
		ready:      condition("Ready", metav1.ConditionFalse, "NotAccepted", "the subscription is not accepted: see the Accepted condition"),
	}
}

// accept turns u into its sink: checked, with its signing keys and its namespace's limiter.
func (c *Controller) accept(u *unstructured.Unstructured, cfg *config.Config) (config.SinkConfig, *spec, error) {
	sink, s, err := sinkOf(u, cfg)
	if err != nil {
		return nil, nil, err
	}
	if w, ok := sink.(*config.Webhook); ok && s.Signing != nil {
		if err := c.sign(u.GetNamespace(), s, w); err != nil {
			return nil, nil, err
		}
	}
	if l, field, to := s.login(sink); l != nil {
		data, err := c.readSecret(u.GetNamespace(), s.Subject, field+".secretName", l.SecretName)
		if err != nil {
			return nil, nil, err
		}
		if err := readLogin(l, field, data, to); err != nil {
			return nil, nil, err
		}
	}
	sink.Shared().Limiter = c.limiter(u.GetNamespace(), cfg.Subscriptions.Quota.DeliveriesPerSecond)
	return sink, s, nil
}

// kindOf names sink's kind.
func kindOf(sink config.SinkConfig) string {
	switch sink.(type) {
	case *config.JetStream:
		return "JetStream"
	case *config.Kafka:
		return "Kafka"
	}
	return "webhook"
}

// ready is the Ready condition of an accepted subscription: refused is a host of its sink that
// resolves to an address its egress policy refuses (none: a nil err), gone why its receiver
// disabled it ("": it did not).
func (c *Controller) ready(authorized metav1.Condition, refused refusal, gone string) metav1.Condition {
	if authorized.Status != metav1.ConditionTrue {
		return condition("Ready", metav1.ConditionFalse, "NotAuthorized", "see the Authorized condition")
	}
	if gone != "" {
		return condition("Ready", metav1.ConditionFalse, "Gone", gone)
	}
	if refused.err != nil {
		return condition("Ready", metav1.ConditionFalse, "EgressRefused",
			fmt.Sprintf("%s: %s resolves to an address a subscription may not reach, so nothing is sent: %v", refused.at.field, refused.at.host, refused.err))
	}
	return condition("Ready", metav1.ConditionTrue, "Delivering", "events the subject may watch are delivered")
}

// delivering is, by sink name, why each sink its receiver disabled (410 Gone) sends nothing,
// and each stream sink's durability as last checked.
func (c *Controller) delivering() (disabled map[string]string, durable map[string]*delivery.Durability) {
	disabled, durable = map[string]string{}, map[string]*delivery.Durability{}
	if c.o.Sinks == nil {
		return disabled, durable
	}
	for _, st := range c.o.Sinks() {
		if st.Disabled != nil {
			disabled[st.Name] = fmt.Sprintf("the receiver asked dynwatch to stop (%s) at %s: nothing more is sent, and what was queued is dead-lettered as gone, until the subscription's spec changes",
				st.Disabled.Reason, st.Disabled.Since.UTC().Format(time.RFC3339))
		}
		durable[st.Name] = st.Durable
	}
	return disabled, durable
}

// durableCondition is a stream subscription's Durable condition: its sink's last durability
// check (see docs/streams.md), Unknown before the first.
func durableCondition(d *delivery.Durability) metav1.Condition {
	if d == nil {
		return condition("Durable", metav1.ConditionUnknown, "NotChecked", "the stream's durability has not been checked yet")
	}
	return condition("Durable", metav1.ConditionStatus(d.Status), d.Reason, d.Message)
}

// secretsResource is what a subject must be allowed to get for its subscription to use a
// Secret (to sign, to log in to a stream).
var secretsResource = schema.GroupResource{Resource: "secrets"}

// sign reads w's signing keys from the Secret s names, once the subject may read it.
func (c *Controller) sign(namespace string, s *spec, w *config.Webhook) error {
	data, err := c.readSecret(namespace, s.Subject, "spec.signing.secretName", s.Signing.SecretName)
	if err != nil {
		return err
	}
	w.SigningSecrets, w.SigningKeys, err = readKeys(s.Signing, data)
	return err
}

// readSecret reads the Secret name of namespace, which field names, once subject may get it:
// dynwatch reads it with its own identity, so it would otherwise lend the Secret to anyone who
// may write subscriptions.
func (c *Controller) readSecret(namespace string, subject *config.Subject, field, name string) (map[string][]byte, error) {
	ok, err := c.o.Reviewer.MayGet(subject, secretsResource, namespace, name)
	switch {
	case err != nil:
		return nil, unknown{fmt.Errorf("%s: could not review whether %s may read it: %w", field, subject.Username, err)}
	case !ok:
		return nil, fmt.Errorf("%s: %s may not get the Secret %s, so the subscription may not use it", field, subject.Username, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
	defer cancel()
	data, err := c.o.Secret(ctx, namespace, name)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
		return nil, fmt.Errorf("%s: %w", field, err)
	case err != nil:
		return nil, unknown{fmt.Errorf("%s: %w", field, err)}
	}
	return data, nil
}

// overQuota marks the items past the first perNamespace of their namespace, oldest first.
func (c *Controller) overQuota(items []*unstructured.Unstructured, perNamespace int) []bool {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ua, ub := items[a], items[b]
		if ct := ua.GetCreationTimestamp().Compare(ub.GetCreationTimestamp().Time); ct != 0 {
			return ct
		}
		return strings.Compare(ua.GetName(), ub.GetName())
	})
	over := make([]bool, len(items))
	seen := map[string]int{}
	for _, i := range order {
		ns := items[i].GetNamespace()
		seen[ns]++
		over[i] = seen[ns] > perNamespace
	}
	return over
}

// limiter is namespace's shared rate limiter, at perSecond (nil: no bound); it keeps its
// state while the rate stays the same.
func (c *Controller) limiter(namespace string, perSecond float64) *rate.Limiter {
	if perSecond == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.limiters[namespace]
	if l == nil || l.Limit() != rate.Limit(perSecond) {
		l = rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))
		c.limiters[namespace] = l
	}
	return l
}

// authorizedChecks bounds the (resource, namespace) pairs the Authorized condition asks about
// for one subscription at each sync: one naming 256 namespaces would otherwise spend the
// reviews every subscription shares. The others are decided event by event, as for a
// subscription naming no namespace.
const authorizedChecks = 16

// authorized is the Authorized condition: whether the subject may watch each resource the
// subscription names in each namespace it names, or, naming none, in its own namespace (the
// first authorizedChecks of those pairs). Elsewhere it is asked event by event: a subscription
// to every namespace receives those where its subject may watch.
func (c *Controller) authorized(own string, s *spec, w *config.Sink) metav1.Condition {
	namespaces := s.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{own}
	}
	var denied []string
	checked, pairs := 0, len(w.GroupResources)*len(namespaces)
checking:
	for _, gr := range w.GroupResources {
		for _, ns := range namespaces {
			if checked == authorizedChecks {
				break checking
			}
			checked++
			ok, err := c.o.Reviewer.Allowed(s.Subject, gr.WithVersion(""), ns)
			if err != nil {
				return condition("Authorized", metav1.ConditionUnknown, "ReviewFailed", err.Error())
			}
			if !ok {
				denied = append(denied, fmt.Sprintf("%s in namespace %s", gr, ns))
			}
		}
	}
	unchecked := ""
	if checked < pairs {
		unchecked = fmt.Sprintf(" (the first %d of its %d resources and namespaces; the others are decided event by event)", checked, pairs)
	}
	if len(denied) > 0 {
		return condition("Authorized", metav1.ConditionFalse, "Forbidden",
			fmt.Sprintf("%s may not watch %s: nothing of those is delivered%s", s.Subject.Username, strings.Join(denied, ", "), unchecked))
	}
	return condition("Authorized", metav1.ConditionTrue, "Allowed", s.Subject.Username+" may watch what the subscription names"+unchecked)
}

// resolveTimeout bounds the lookups of every subscription's host names together, and
// resolveAtOnce how many are under way at once.
const (
	resolveTimeout = 2 * time.Second
	resolveAtOnce  = 16
)

// refusal is a host of a sink that resolves to an address its egress policy refuses, and why.
type refusal struct {
	at    host
	index int // of the host among the sink's
	err   error
}

// refusals resolves the host names of sinks, resolveAtOnce at a time and all within one
// resolveTimeout, and returns, by sink name, the first host of each that resolves now to an
// address its egress policy refuses. A slow resolver, or a tenant's many names, holds the
// sync up for resolveTimeout at most; a name not resolved in time counts as not refused. The
// status reports what resolution finds; what keeps a sink from reaching such an address is the
// check on every connection it dials (egress.Policy.Control), whatever the name resolves to
// then.
func (c *Controller) refusals(sinks []config.SinkConfig) map[string]refusal {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	var (
		mu  sync.Mutex
		out = map[string]refusal{}
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, resolveAtOnce)
	defer wg.Wait() // before out is returned: every lookup has written to it
	for _, sink := range sinks {
		for i, h := range hosts(sink) {
			if _, err := netip.ParseAddr(h.host); err == nil {
				continue // checked when the subscription was accepted
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return out
			}
			wg.Go(func() {
				defer func() { <-sem }()
				addrs, err := c.lookup(ctx, h.host)
				if err != nil {
					return // not known now; each dial checks what it finds
				}
				for _, a := range addrs {
					if err := sink.Shared().Egress.Check(a); err != nil {
						mu.Lock()
						defer mu.Unlock()
						if r, seen := out[sink.Shared().Name]; !seen || i < r.index {
							out[sink.Shared().Name] = refusal{at: h, index: i, err: err}
						}
						return
					}
				}
			})
		}
	}
	return out
}

// maxMessage bounds a condition's message (the CRD's limit is 32768).
const maxMessage = 4096

func condition(typ string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	if len(message) > maxMessage {
		message = message[:maxMessage-3] + "..."
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message}
}

// writeStatus writes st into u's status if it changed.
func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, st state) error {
	var cur status
	if raw, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &cur); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	next := status{ObservedGeneration: u.GetGeneration(), Conditions: slices.Clone(cur.Conditions)}
	if st.sink != nil {
		next.Sink = st.sink.Shared().Name
		if w, ok := st.sink.(*config.Webhook); ok {
			if keys := webhook.PublicKeys(w); len(keys) > 0 {
				next.SigningKeys = keys
			}
		}
	}
	for _, cond := range []metav1.Condition{st.accepted, st.authorized, st.ready, st.durable} {
		if cond.Type == "" {
			continue
		}
		cond.ObservedGeneration = u.GetGeneration()
		meta.SetStatusCondition(&next.Conditions, cond)
	}
	if equality.Semantic.DeepEqual(cur, next) {
		return nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&next)
	if err != nil {
		return err
	}
	out := u.DeepCopy()
	out.Object["status"] = raw
	_, err = c.o.Client.Resource(GVR).Namespace(u.GetNamespace()).UpdateStatus(ctx, out, metav1.UpdateOptions{FieldManager: "dynwatch"})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // changed or gone meanwhile: the informer hands it over again
	}
	return err
}

// status is a Subscription's status.
type status struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Sink               string             `json:"sink,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	// SigningKeys are the public halves of the Ed25519 keys that sign the requests (v1a), for
	// receivers to verify with.
	SigningKeys []webhook.PublicKey `json:"signingKeys,omitempty"`
}
