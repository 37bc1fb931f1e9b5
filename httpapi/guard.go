package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/dynwatch/dynwatch/config"
)

// Rejection reasons, the values of dynwatch_api_rejected_requests_total's reason label.
const (
	rejectURLTooLong     = "url_too_long"
	rejectUnauthorized   = "unauthenticated"
	rejectForbidden      = "forbidden"
	rejectServerBusy     = "server_busy"
	rejectUserBusy       = "user_busy"
	rejectAuthError      = "auth_error"
	rejectAuthenticating = "authenticating_busy"
	rejectAuthorizing    = "authorizing_busy"
	rejectRequestTimeout = "timeout"
)

var rejectReasons = []string{rejectURLTooLong, rejectUnauthorized, rejectForbidden, rejectServerBusy, rejectUserBusy, rejectAuthenticating, rejectAuthorizing, rejectAuthError, rejectRequestTimeout}

// retryAfterSeconds is the Retry-After of a 429, as the apiserver's max-in-flight filter sends.
const retryAfterSeconds = 1

// A 429 is answered once its Retry-After has passed, not at once, while at most
// maxWaitingRefusals wait (a parked goroutine and its request, a few KiB each): a caller that
// sends its next request when the last is answered, as a flood of requests at once does, is
// then refused at most its number of requests a second, and waiting costs no CPU. Answered at
// once, the refusals themselves were the flood's cost: 400 requests at once kept dynwatch at
// 1.4 of 2 cores answering 2,100 of them a second, and the callers it serves waited behind
// them for every turn of the scheduler. A refusal past the bound is answered at once.
const (
	refusalWait        = retryAfterSeconds * time.Second
	maxWaitingRefusals = 1024
)

// gate is what stands in front of every query: the URL limit, the server's and each user's
// share of in-flight requests and watches, and, unless auth is none, authentication and
// authorization through the cluster with the attributes the apiserver would check.
type gate struct {
	authn       authenticator.Request // nil with api.auth.mode none
	authz       authorizer.Authorizer
	limits      config.Limits
	infoFactory request.RequestInfoFactory
	mu          sync.Mutex
	held        map[slot]int
	refusalWait time.Duration // refusalWait, but in tests
	refusing    atomic.Int64  // refusals waiting to be answered
}

// slot is what a limit counts: watches or other requests, of one user or ("") of everyone.
type slot struct {
	user  string
	watch bool
}

func newGate(authn authenticator.Request, authz authorizer.Authorizer, limits config.Limits) *gate {
	return &gate{
		authn: authn, authz: authz, limits: limits, held: map[slot]int{}, refusalWait: refusalWait,
		infoFactory: request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")},
	}
}

// unauthenticatedPaths are served to anyone: the apiserver serves them to
// system:unauthenticated through system:public-info-viewer.
var unauthenticatedPaths = map[string]bool{"/version": true, "/version/": true}

func (a *api) guard(c *gin.Context) {
	g := a.gate
	if n := len(c.Request.RequestURI); n > g.limits.MaxURLLength {
		a.reject(c, rejectURLTooLong, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusRequestURITooLong, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("the request URL is %d bytes long; at most %d are accepted", n, g.limits.MaxURLLength),
		}})
		return
	}
	if unauthenticatedPaths[c.Request.URL.Path] {
		return
	}
	info, err := g.infoFactory.NewRequestInfo(c.Request)
	if err != nil {
		// Its error repeats the URL; the caller has it already.
		a.reject(c, rejectAuthError, apierrors.NewBadRequest("the path names no request that can be authorized"))
		return
	}
	watch := info.Verb == "watch"
	user := ""
	if g.authn != nil {
		// Authentication and authorization come first and hold no slot: what they cost is
		// bounded by the review caches and the fair queues in front of each kind of review (see
		// delegatedAuth), so that requests no one vouches for never crowd out the ones being
		// answered.
		if user = a.authorize(c, info); user == "" {
			return
		}
	}
	if !g.acquire(slot{watch: watch}) {
		a.busy(c, rejectServerBusy, "the server has too many requests in flight")
		return
	}
	if user != "" && !g.acquire(slot{user: user, watch: watch}) {
		g.release(slot{watch: watch}) // a refusal waits holding nothing
		a.busy(c, rejectUserBusy, fmt.Sprintf("user %q has too many requests in flight", user))
		return
	}
	defer g.release(slot{watch: watch})
	if user != "" {
		defer g.release(slot{user: user, watch: watch})
	}
	c.Next()
}

// authorize authenticates and authorizes the request as the apiserver would and returns the
// user's name, or answers the request (401, 403, 429 or 500) and returns "".
func (a *api) authorize(c *gin.Context, info *request.RequestInfo) string {
	g := a.gate
	c.Request = c.Request.WithContext(withConnection(c.Request.Context(), c.Request.RemoteAddr))
	resp, ok, err := g.authn.AuthenticateRequest(c.Request)
	switch {
	case errors.Is(err, errReviewsBusy):
		a.busy(c, rejectAuthenticating, "too many requests are being authenticated")
		return ""
	case err != nil || !ok:
		if err != nil {
			a.Logger.Debug("authentication failed", "err", err)
		}
		a.reject(c, rejectUnauthorized, apierrors.NewUnauthorized("Unauthorized"))
		return ""
	}
	// The credential has done its work; nothing after this needs it.
	c.Request.Header.Del("Authorization")
	attrs := attributes(resp, info)
	decision, reason, err := g.authz.Authorize(c.Request.Context(), attrs)
	switch {
	case decision == authorizer.DecisionAllow:
		return attrs.User.GetName()
	case errors.Is(err, errReviewsBusy):
		a.busy(c, rejectAuthorizing, "too many requests are being authorized")
	case err != nil:
		// The cause (a timeout, a throttled review) is the operator's to read, not the caller's.
		a.Logger.Warn("authorization failed", "user", attrs.User.GetName(), "err", err)
		a.reject(c, rejectAuthError, apierrors.NewInternalError(errors.New("the request could not be authorized now; retry later")))
	default:
		a.reject(c, rejectForbidden, responsewriters.ForbiddenStatusError(attrs, reason))
	}
	return ""
}

// attributes are the authorizer attributes the apiserver builds for the same request
// (filters.GetAuthorizerAttributes), the requirements of a list's or watch's label and field
// selectors included (AuthorizeWithSelectors, GA and locked on since Kubernetes 1.34, which
// sets them in info): the delegating authorizer sends them in the SubjectAccessReview, so an
// authorizer that grants reads by selector decides as it would for the apiserver. A selector
// that does not parse reaches the authorizer as its parse error, and the request is refused
// with 400 after authorization, as the apiserver refuses it.
func attributes(resp *authenticator.Response, info *request.RequestInfo) *authorizer.AttributesRecord {
	attrs := &authorizer.AttributesRecord{
		User: resp.User, Verb: info.Verb, Path: info.Path, ResourceRequest: info.IsResourceRequest,
		APIGroup: info.APIGroup, APIVersion: info.APIVersion, Resource: info.Resource,
		Subresource: info.Subresource, Namespace: info.Namespace, Name: info.Name,
	}
	if info.FieldSelector != "" {
		if s, err := fields.ParseSelector(info.FieldSelector); err != nil {
			attrs.FieldSelectorParsingErr = err
		} else if reqs := s.Requirements(); len(reqs) > 0 {
			attrs.FieldSelectorRequirements = reqs
		}
	}
	if info.LabelSelector != "" {
		if s, err := labels.Parse(info.LabelSelector); err != nil {
			attrs.LabelSelectorParsingErr = err
		} else if reqs, _ := s.Requirements(); len(reqs) > 0 {
			attrs.LabelSelectorRequirements = reqs
		}
	}
	return attrs
}

// limit is how many requests s may hold at once.
func (g *gate) limit(s slot) int {
	switch {
	case s.user == "" && s.watch:
		return g.limits.MaxWatches
	case s.user == "":
		return g.limits.MaxInFlight
	case s.watch:
		return g.limits.MaxWatchesPerUser
	}
	return g.limits.MaxInFlightPerUser
}

func (g *gate) acquire(s slot) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[s] >= g.limit(s) {
		return false
	}
	g.held[s]++
	return true
}

func (g *gate) release(s slot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[s]--; g.held[s] == 0 {
		delete(g.held, s)
	}
}

// waitToRefuse waits g.refusalWait, or until ctx ends, unless maxWaitingRefusals already wait.
func (g *gate) waitToRefuse(ctx context.Context) {
	defer g.refusing.Add(-1)
	if g.refusing.Add(1) > maxWaitingRefusals {
		return
	}
	t := time.NewTimer(g.refusalWait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (a *api) reject(c *gin.Context, reason string, err *apierrors.StatusError) {
	a.rejected.WithLabelValues(reason).Inc()
	writeStatus(c.Writer, err)
	c.Abort()
}

// busy answers 429 with Retry-After, once refusalWait has passed or the caller has gone (see
// maxWaitingRefusals).
func (a *api) busy(c *gin.Context, reason, message string) {
	a.gate.waitToRefuse(c.Request.Context())
	c.Header("Retry-After", strconv.Itoa(retryAfterSeconds))
	a.reject(c, reason, apierrors.NewTooManyRequests(message, retryAfterSeconds))
}
