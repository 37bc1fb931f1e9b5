package httpapi

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/utils/lru"
)

// The decision cache's bounds: users remembered, and decisions remembered per user. One user
// asking for random names evicts only its own decisions.
const (
	cachedUsers            = 512
	cachedDecisionsPerUser = 256
	// maxCachedAttributes is the longest request (its attributes' key) whose decision is
	// cached, as the apiserver's webhook authorizer bounds its own cache.
	maxCachedAttributes = 10000
)

// authorization stands in front of the SubjectAccessReview webhook (whose own cache it turns
// off). Decisions are cached per user, so that no caller's requests evict another's
// decisions; a decision not cached is reviewed once for every request that asks for it
// meanwhile (200 identical watches opened at once make one review), after a turn of the
// access-review queue, fair between users, or is refused with errReviewsBusy; and a review
// that has its turn has timeout to answer. So one caller with a valid token asking for random
// names costs the apiserver no more than the queue's rate, and delays another caller's review
// by at most one turn of each user with reviews waiting.
type authorization struct {
	next     authorizer.Authorizer
	queue    *fairQueue
	allowTTL time.Duration
	denyTTL  time.Duration
	timeout  time.Duration

	flight singleflight.Group // by userKey and attributesKey

	mu    sync.Mutex
	users *lru.Cache // userKey → *lru.Cache of attributesKey → cachedDecision
}

type cachedDecision struct {
	decision authorizer.Decision
	reason   string
	expires  time.Time
}

func newAuthorization(next authorizer.Authorizer, queue *fairQueue, allowTTL, denyTTL, timeout time.Duration) *authorization {
	return &authorization{next: next, queue: queue, allowTTL: allowTTL, denyTTL: denyTTL, timeout: timeout, users: lru.New(cachedUsers)}
}

// Authorize implements authorizer.Authorizer.
func (a *authorization) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	user, request := userKey(attrs), attributesKey(attrs)
	if d, ok := a.cached(user, request); ok {
		return d.decision, d.reason, nil
	}
	// The review may answer several callers: it runs apart from the first one's context.
	shared := context.WithoutCancel(ctx)
	result := a.flight.DoChan(user+"\xff"+request, func() (any, error) {
		return a.review(shared, user, request, attrs)
	})
	select {
	case r := <-result:
		if r.Err != nil {
			return authorizer.DecisionNoOpinion, "", r.Err
		}
		d := r.Val.(cachedDecision)
		return d.decision, d.reason, nil
	case <-ctx.Done():
		return authorizer.DecisionNoOpinion, "", ctx.Err()
	}
}

// review waits for a turn of the user's, asks the webhook within the timeout and caches what
// it answers.
func (a *authorization) review(ctx context.Context, user, request string, attrs authorizer.Attributes) (cachedDecision, error) {
	name := attrs.GetUser().GetName()
	done, err := a.queue.wait(ctx, name, name)
	if err != nil {
		return cachedDecision{}, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	decision, reason, err := a.next.Authorize(ctx, attrs)
	if err != nil {
		return cachedDecision{}, err
	}
	ttl := a.denyTTL
	if decision == authorizer.DecisionAllow {
		ttl = a.allowTTL
	}
	d := cachedDecision{decision: decision, reason: reason, expires: time.Now().Add(ttl)}
	if len(request) <= maxCachedAttributes {
		a.remember(user, request, d)
	}
	return d, nil
}

func (a *authorization) cached(user, request string) (cachedDecision, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	decisions, ok := a.users.Get(user)
	if !ok {
		return cachedDecision{}, false
	}
	d, ok := decisions.(*lru.Cache).Get(request)
	if !ok || time.Now().After(d.(cachedDecision).expires) {
		return cachedDecision{}, false
	}
	return d.(cachedDecision), true
}

func (a *authorization) remember(user, request string, d cachedDecision) {
	if !d.expires.After(time.Now()) { // a TTL of 0: not cached
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	decisions, ok := a.users.Get(user)
	if !ok {
		decisions = lru.New(cachedDecisionsPerUser)
		a.users.Add(user, decisions)
	}
	decisions.(*lru.Cache).Add(request, d)
}

// userKey is everything of the user a SubjectAccessReview sends.
func userKey(attrs authorizer.Attributes) string {
	u := attrs.GetUser()
	if u == nil {
		return ""
	}
	groups := slices.Clone(u.GetGroups())
	slices.Sort(groups)
	var b strings.Builder
	b.WriteString(u.GetName())
	b.WriteByte(0)
	b.WriteString(u.GetUID())
	b.WriteByte(0)
	b.WriteString(strings.Join(groups, "\x01"))
	extra := u.GetExtra()
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strings.Join(extra[k], "\x01"))
	}
	return b.String()
}

// attributesKey is everything of the request a SubjectAccessReview sends.
func attributesKey(attrs authorizer.Attributes) string {
	var b strings.Builder
	for _, s := range []string{
		attrs.GetVerb(), attrs.GetAPIGroup(), attrs.GetAPIVersion(), attrs.GetResource(), attrs.GetSubresource(),
		attrs.GetNamespace(), attrs.GetName(), attrs.GetPath(), strconv.FormatBool(attrs.IsResourceRequest()),
	} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	if reqs, _ := attrs.GetLabelSelector(); len(reqs) > 0 {
		for _, r := range reqs {
			b.WriteString(r.String())
			b.WriteByte(1)
		}
	}
	b.WriteByte(0)
	if reqs, _ := attrs.GetFieldSelector(); len(reqs) > 0 {
		for _, r := range reqs {
			b.WriteString(string(r.Operator) + r.Field + "\x02" + r.Value)
			b.WriteByte(1)
		}
	}
	return b.String()
}
