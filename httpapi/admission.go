package httpapi

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/utils/lru"
)

// errReviewsBusy is a credential that could not be reviewed now: too many are being reviewed,
// or the rate of reviews for unknown credentials is spent. The caller gets 429 at once.
var errReviewsBusy = errors.New("too many credentials are being reviewed; retry later")

// knownCredentials is how many credentials admission remembers as authenticated before, and
// for how long after their last success.
const (
	knownCredentials   = 4096
	knownCredentialTTL = time.Hour
)

// admission stands between the token cache and the TokenReview webhook: only what the cache
// does not answer reaches it. A credential authenticated before is reviewed at once; any other
// needs a share of the concurrency cap (limit in all, a quarter of it per client address) and a
// token from the unknown-credential rate, or is refused with errReviewsBusy without waiting. So
// a flood of made-up tokens costs the apiserver no more than that rate, and a known caller is
// neither queued behind it nor refused.
type admission struct {
	next    authenticator.Token
	unknown *rate.Limiter
	limit   int

	mu        sync.Mutex
	reviewing int
	bySource  map[string]int
	known     *lru.Cache // sha256 of a credential → when it was last authenticated
}

func newAdmission(next authenticator.Token, limit int, unknown *rate.Limiter) *admission {
	return &admission{next: next, unknown: unknown, limit: limit, bySource: map[string]int{}, known: lru.New(knownCredentials)}
}

// AuthenticateToken implements authenticator.Token.
func (a *admission) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	sum := sha256.Sum256([]byte(token))
	if !a.isKnown(sum) {
		source := sourceOf(ctx)
		if !a.enter(source) {
			return nil, false, errReviewsBusy
		}
		defer a.leave(source)
	}
	resp, ok, err := a.next.AuthenticateToken(ctx, token)
	if ok && err == nil {
		a.known.Add(sum, time.Now())
	}
	return resp, ok, err
}

func (a *admission) isKnown(sum [sha256.Size]byte) bool {
	at, ok := a.known.Get(sum)
	return ok && time.Since(at.(time.Time)) < knownCredentialTTL
}

// enter takes a share of the cap for source and a token of the unknown-credential rate.
func (a *admission) enter(source string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reviewing >= a.limit || a.bySource[source] >= max(1, a.limit/4) || !a.unknown.Allow() {
		return false
	}
	a.reviewing++
	a.bySource[source]++
	return true
}

func (a *admission) leave(source string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reviewing--
	if a.bySource[source]--; a.bySource[source] == 0 {
		delete(a.bySource, source)
	}
}

type sourceKey struct{}

// withSource records the client address a request came from, for admission's fairness.
func withSource(ctx context.Context, source string) context.Context {
	return context.WithValue(ctx, sourceKey{}, source)
}

func sourceOf(ctx context.Context) string {
	s, _ := ctx.Value(sourceKey{}).(string)
	return s
}
