package httpapi

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
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
// aggregated servers use: bearer tokens checked with TokenReview, client certificates against
// clientCA (when not nil), and every decision taken by SubjectAccessReview, all cached for the
// configured TTLs. Anonymous requests are not authenticated.
func newDelegatedAuth(client kubernetes.Interface, c config.Auth, clientCA dynamiccertificates.CAContentProvider) (authenticator.Request, authorizer.Authorizer, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:            client.AuthenticationV1(),
		TokenAccessReviewTimeout:           reviewTimeout,
		WebhookRetryBackoff:                reviewBackoff(),
		CacheTTL:                           c.TokenCacheTTL,
		ClientCertificateCAContentProvider: clientCA,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("delegated authentication: %w", err)
	}
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
// TokenReview and SubjectAccessReview. It warns about every insecure choice it is given.
func NewSecurity(log *slog.Logger, c config.API, client kubernetes.Interface) (Security, error) {
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
	s.Authenticator, s.Authorizer, err = newDelegatedAuth(client, c.Auth, clientCA)
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
