package httpapi

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	unionauth "k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	"k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/config"
)

// reviewTimeout bounds one TokenReview or SubjectAccessReview call to the apiserver, retries
// included.
const reviewTimeout = 10 * time.Second

// maxReviewWait is how long a request waits for its turn to be reviewed before it is answered
// 429.
const maxReviewWait = 5 * time.Second

// reviewBackoff is how a failed review is retried: the apiserver's own default for
// delegated authentication and authorization webhooks.
func reviewBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// delegatedAuth is the authenticator and authorizer that kube-apiserver's own aggregated
// servers use (authenticatorfactory.DelegatingAuthenticatorConfig and
// authorizerfactory.DelegatingAuthorizerConfig, assembled from the same parts so that a fair
// queue can stand in front of each kind of review): client certificates against clientCA
// (when not nil), bearer tokens (in the Authorization header or a websocket's protocol)
// checked with TokenReview, and every decision taken by SubjectAccessReview, all cached for
// the configured TTLs. Anonymous requests are not authenticated.
//
// TokenReviews and SubjectAccessReviews go through clients of their own, each with its own
// rate limit, so that neither waits behind the other. A credential the token cache does not
// answer and that was never authenticated before waits for a turn of the unknown-credential
// queue (admission.go: half the TokenReview client's rate, maxAuthenticating at once, fair
// between addresses and connections); a decision not cached waits for a turn of the
// access-review queue (authorization.go: the SubjectAccessReview client's rate, maxAuthorizing
// at once, fair between users). Run gives out both queues' turns.
type delegatedAuth struct {
	authn  authenticator.Request
	authz  authorizer.Authorizer
	queues []*fairQueue
}

// ReviewClients are the clients delegated authentication and authorization review with, and
// their rate limits.
type ReviewClients struct {
	Tokens      kubernetes.Interface // TokenReviews
	TokensLimit config.RateLimit
	Access      kubernetes.Interface // SubjectAccessReviews
	AccessLimit config.RateLimit
}

func newDelegatedAuth(clients ReviewClients, c config.Auth, limits config.Limits, clientCA dynamiccertificates.CAContentProvider) (*delegatedAuth, error) {
	webhook, err := webhooktoken.NewFromInterface(clients.Tokens.AuthenticationV1(), nil, *reviewBackoff(), reviewTimeout, webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal:   authenticatorfactory.RecordRequestTotal,
		RecordRequestLatency: authenticatorfactory.RecordRequestLatency,
	})
	if err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	unknown := newFairQueue(rate.NewLimiter(rate.Limit(clients.TokensLimit.QPS/2), max(1, clients.TokensLimit.Burst/2)),
		limits.MaxAuthenticating, 2, 4*limits.MaxAuthenticating, maxReviewWait)
	tokens := newAdmission(cache.New(webhook, false, c.TokenCacheTTL, c.TokenCacheTTL), unknown)
	var authenticators []authenticator.Request
	if clientCA != nil {
		authenticators = append(authenticators, x509.NewDynamic(clientCA.VerifyOptions, x509.CommonNameUserConversion))
	}
	authenticators = append(authenticators, bearertoken.New(tokens), websocket.NewProtocolAuthenticator(tokens))
	authn := group.NewAuthenticatedGroupAdder(unionauth.New(authenticators...))
	// The webhook's own cache is off (TTLs of 0): authorization caches per user.
	sar, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: clients.Access.AuthorizationV1(),
		WebhookRetryBackoff:       reviewBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	access := newFairQueue(rate.NewLimiter(rate.Limit(clients.AccessLimit.QPS), clients.AccessLimit.Burst),
		limits.MaxAuthorizing, max(1, limits.MaxAuthorizing/4), 4*limits.MaxAuthorizing, maxReviewWait)
	authz := newAuthorization(sar, access, c.AllowCacheTTL, c.DenyCacheTTL, reviewTimeout)
	return &delegatedAuth{authn: authn, authz: authz, queues: []*fairQueue{unknown, access}}, nil
}

// Run gives out the review queues' turns until ctx ends.
func (d *delegatedAuth) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, q := range d.queues {
		g.Go(func() error { return q.Run(ctx) })
	}
	return g.Wait()
}

// Security is the query API's authentication, authorization and TLS, as configured.
type Security struct {
	// Authenticator and Authorizer are nil with api.auth.mode none.
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// TLS is nil with api.tls.enabled false.
	TLS *TLS
	// auth gives out the review queues' turns; nil with api.auth.mode none.
	auth *delegatedAuth
}

// NewSecurity builds what c.Auth and c.TLS ask for, with clients to reach the apiserver's
// TokenReview and SubjectAccessReview. It warns about every insecure choice it is given.
func NewSecurity(log *slog.Logger, c config.API, clients ReviewClients) (Security, error) {
	var s Security
	if c.TLS.Enabled {
		t, err := newTLS(log, c)
		if err != nil {
			return s, err
		}
		s.TLS = t
	} else if !config.IsLoopback(c.Address) {
		log.Warn("api.tls.enabled is false: requests, bearer tokens included, cross the network in the clear", "address", c.Address)
	}
	if c.Auth.Mode == config.AuthNone {
		log.Warn("api.auth.mode is none: anyone who reaches the API reads every watched object with dynwatch's permissions", "address", c.Address)
		return s, nil
	}
	var clientCA dynamiccertificates.CAContentProvider
	if s.TLS != nil {
		clientCA = s.TLS.ClientCA()
	}
	auth, err := newDelegatedAuth(clients, c.Auth, c.Limits, clientCA)
	if err != nil {
		return s, err
	}
	s.Authenticator, s.Authorizer, s.auth = auth.authn, auth.authz, auth
	return s, nil
}

// Run keeps the certificates current and gives out the review queues' turns until ctx ends.
func (s Security) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if s.TLS != nil {
		g.Go(func() error { return s.TLS.Run(ctx) })
	}
	if s.auth != nil {
		g.Go(func() error { return s.auth.Run(ctx) })
	}
	return g.Wait()
}

// ServerTLS is the server's TLS configuration, nil for plain HTTP.
func (s Security) ServerTLS() *tls.Config {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.Config()
}
