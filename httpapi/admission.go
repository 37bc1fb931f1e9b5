package httpapi

import (
	"context"
	"crypto/sha256"
	"net"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/utils/lru"
)

// knownCredentials is how many credentials admission remembers as authenticated before, and
// for how long after their last success.
const (
	knownCredentials   = 4096
	knownCredentialTTL = time.Hour
)

// admission stands in front of the token cache and its TokenReviews. A credential
// authenticated before goes straight on; any other waits for a turn of the unknown-credential
// queue, fair between client addresses and, within an address, between connections, or is
// refused with errReviewsBusy. So a flood of made-up tokens costs the apiserver no more than
// the queue's rate, a known caller is neither queued behind it nor refused, and a valid caller
// arriving during the flood waits for one turn of each other address and connection, not for
// the flood to end.
//
// It stands in front of the cache, not behind it, because the cache detaches the context of
// the review it makes (one review may answer several callers): behind it, no caller's address
// would reach the queue. Like the cache, it takes one turn for every request that carries the
// same credential meanwhile (200 watches opened at once with a new token make one review).
type admission struct {
	next   authenticator.Token
	queue  *fairQueue
	known  *lru.Cache // sha256 of a credential → when it was last authenticated
	flight singleflight.Group
}

// authenticated is what a review answered.
type authenticated struct {
	resp *authenticator.Response
	ok   bool
}

func newAdmission(next authenticator.Token, queue *fairQueue) *admission {
	return &admission{next: next, queue: queue, known: lru.New(knownCredentials)}
}

// AuthenticateToken implements authenticator.Token.
func (a *admission) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	sum := sha256.Sum256([]byte(token))
	if a.isKnown(sum) {
		return a.next.AuthenticateToken(ctx, token)
	}
	// The review may answer several callers: it runs apart from the first one's context.
	shared := context.WithoutCancel(ctx)
	result := a.flight.DoChan(string(sum[:]), func() (any, error) {
		connection := connectionOf(shared)
		done, err := a.queue.wait(shared, addressOf(connection), connection)
		if err != nil {
			return authenticated{}, err
		}
		defer done()
		resp, ok, err := a.next.AuthenticateToken(shared, token)
		if ok && err == nil {
			a.known.Add(sum, time.Now())
		}
		return authenticated{resp, ok}, err
	})
	select {
	case r := <-result:
		v := r.Val.(authenticated)
		return v.resp, v.ok, r.Err
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

func (a *admission) isKnown(sum [sha256.Size]byte) bool {
	at, ok := a.known.Get(sum)
	return ok && time.Since(at.(time.Time)) < knownCredentialTTL
}

type connectionKey struct{}

// withConnection records the connection a request came on (its remote address and port), for
// admission's fairness.
func withConnection(ctx context.Context, remoteAddr string) context.Context {
	return context.WithValue(ctx, connectionKey{}, remoteAddr)
}

func connectionOf(ctx context.Context) string {
	s, _ := ctx.Value(connectionKey{}).(string)
	return s
}

// addressOf is a connection's client address, without its port.
func addressOf(remoteAddr string) string {
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}
