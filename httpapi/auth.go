package httpapi

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

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

// reviewTimeout bounds one TokenReview or SubjectAccessReview call to the apiserver.
const reviewTimeout = 10 * time.Second

// reviewBackoff is how a failed review is retried: the apiserver's own default for
// delegated authentication and authorization webhooks.
func reviewBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// newDelegatedAuth returns the authenticator and authorizer that kube-apiserver's own
// aggregated servers use (authenticatorfactory.DelegatingAuthenticatorConfig, assembled from
// the same parts so that admission can stand between its token cache and its TokenReviews):
// client certificates against clientCA (when not nil), bearer tokens (in the Authorization
// header or a websocket's protocol) checked with TokenReview, and every decision taken by
// SubjectAccessReview, all cached for the configured TTLs. Anonymous requests are not
// authenticated. Credentials the cache does not know are reviewed only as admission allows:
// at most maxReviewing at once and, for credentials never authenticated before, half the
// review client's rate.
func newDelegatedAuth(client kubernetes.Interface, c config.Auth, maxReviewing int, reviews config.RateLimit, clientCA dynamiccertificates.CAContentProvider) (authenticator.Request, authorizer.Authorizer, error) {
	webhook, err := webhooktoken.NewFromInterface(client.AuthenticationV1(), nil, *reviewBackoff(), reviewTimeout, webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal:   authenticatorfactory.RecordRequestTotal,
		RecordRequestLatency: authenticatorfactory.RecordRequestLatency,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("delegated authentication: %w", err)
	}
	unknown := rate.NewLimiter(rate.Limit(reviews.QPS/2), max(1, reviews.Burst/2))
	tokens := cache.New(newAdmission(webhook, maxReviewing, unknown), false, c.TokenCacheTTL, c.TokenCacheTTL)
	var authenticators []authenticator.Request
	if clientCA != nil {
		authenticators = append(authenticators, x509.NewDynamic(clientCA.VerifyOptions, x509.CommonNameUserConversion))
	}
	authenticators = append(authenticators, bearertoken.New(tokens), websocket.NewProtocolAuthenticator(tokens))
	authn := group.NewAuthenticatedGroupAdder(unionauth.New(authenticators...))
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             c.AllowCacheTTL,
		DenyCacheTTL:              c.DenyCacheTTL,
		WebhookRetryBackoff:       reviewBackoff(),
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("delegated authorization: %w", err)
	}
	return authn, authz, nil
}

// Security is the query API's authentication, authorization and TLS, as configured.
type Security struct {
	// Authenticator and Authorizer are nil with api.auth.mode none.
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// TLS is nil with api.tls.enabled false.
	TLS *TLS
}

// NewSecurity builds what c.Auth and c.TLS ask for, with client to reach the apiserver's
// TokenReview and SubjectAccessReview; reviews is that client's rate limit. It warns about every insecure choice it is given.
func NewSecurity(log *slog.Logger, c config.API, client kubernetes.Interface, reviews config.RateLimit) (Security, error) {
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
	var err error
	s.Authenticator, s.Authorizer, err = newDelegatedAuth(client, c.Auth, c.Limits.MaxAuthenticating, reviews, clientCA)
	return s, err
}

// Run keeps the certificates current until ctx ends.
func (s Security) Run(ctx context.Context) error {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.Run(ctx)
}

// ServerTLS is the server's TLS configuration, nil for plain HTTP.
func (s Security) ServerTLS() *tls.Config {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.Config()
}
