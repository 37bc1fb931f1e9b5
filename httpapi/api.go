package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/history"
	"github.com/dynwatch/dynwatch/object"
)

// StatusResponse is the body of GET /status.
type StatusResponse struct {
	// Cluster names the cluster dynwatch watches.
	Cluster   object.Cluster           `json:"cluster"`
	Ready     bool                     `json:"ready"`
	NotReady  []string                 `json:"notReady,omitempty"`
	Resources []dynamicinformer.Status `json:"resources"`
	// Reload is the outcome of the last configuration reload.
	Reload config.ReloadStatus `json:"reload"`
	// LeaderElection is this replica's view of the election; absent without one.
	LeaderElection any `json:"leaderElection,omitempty"`
	// Journal is the journal's backpressure: whether the informers are held back, and the
	// bytes of events waiting to be committed against their limit.
	Journal any `json:"journal,omitempty"`
	// Sinks are the sinks' states: one disabled by a 410 Gone says so.
	Sinks any `json:"sinks,omitempty"`
	// History is what each resource's history holds: its disk, its versions, how far back it
	// reaches; absent without a state store.
	History []history.Stats `json:"history,omitempty"`
}

// APIOptions are the API handler's dependencies and limits.
type APIOptions struct {
	Logger    *slog.Logger
	Informers *dynamicinformer.Manager
	Watches   *Hub
	// History reads the histories of the resources that keep one; nil when none does.
	History    History
	Registerer prometheus.Registerer
	// Reloads reports the last configuration reload.
	Reloads interface{ Status() config.ReloadStatus }
	// LeaderElection reports the leader election's state for /status; nil without one.
	LeaderElection func() any
	// Cluster names the cluster in /status and in every answer's ClusterIDHeader.
	Cluster object.Cluster
	// SigningKeys is GET /signing-keys: the public keys each webhook signs with (v1a); nil
	// serves none.
	SigningKeys func() any
	// Journal reports the journal's backpressure for /status; nil leaves it out.
	Journal func() any
	// Sinks reports the sinks' states for /status; nil leaves them out.
	Sinks func() any
	// MaxPageSize caps the items of one list response; more come through continue tokens.
	MaxPageSize int
	// RequestTimeout bounds writing the answer to a request other than a watch.
	RequestTimeout time.Duration
	// MaxWatchTimeout bounds a watch; clients ask for less with timeoutSeconds.
	MaxWatchTimeout time.Duration
	// Authenticator and Authorizer check every request but /version through the cluster;
	// both nil serve everyone (api.auth.mode none).
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// Limits bound what one request and one user can cost.
	Limits config.Limits
	// AnyFieldSelectors accepts field selectors on any dot path (api.fieldSelectors any);
	// otherwise only the fields the apiserver accepts, and jsonPath indexers' paths.
	AnyFieldSelectors bool
	// Kubernetes and Dynamic read, with dynwatch's identity, what the caches do not hold:
	// OpenAPI documents, CustomResourceDefinitions (printer columns, selectable fields) and,
	// with EventsFromAPIServer, the events kubectl describe lists. nil reads none of them.
	Kubernetes          kubernetes.Interface
	Dynamic             dynamic.Interface
	EventsFromAPIServer bool
}

type api struct {
	APIOptions
	crds     *crds
	openAPI  *openAPI
	gate     *gate
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	rejected *prometheus.CounterVec
	// watchInitial counts the cached objects read to open watches.
	watchInitial prometheus.Counter
	pins         *pins  // the snapshots of paged lists
	chunks       chunks // the buffers lists are written through
}

// routes are the values of the route label.
var routes = []string{"discovery", "openapi", "list", "get", "watch", "status", "signing-keys", "version", "write", "other"}

// routeKey is the gin context key under which handlers name their route for metrics.
const routeKey = "dynwatch.route"

// NewAPI returns the API handler: GET /status, /version, discovery, and read-only list, get
// and watch of every watched resource at the Kubernetes API's paths.
func NewAPI(o APIOptions) (http.Handler, error) {
	if (o.Authenticator == nil) != (o.Authorizer == nil) {
		return nil, errors.New("an authenticator needs an authorizer, and the other way round")
	}
	a := &api{
		APIOptions: o,
		gate:       newGate(o.Authenticator, o.Authorizer, o.Limits),
		pins:       newPins(time.Now),
		chunks:     newChunks(8),
		crds:       newCRDs(o.Dynamic, o.Logger),
		openAPI:    newOpenAPI(o.Kubernetes),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_api_rejected_requests_total",
			Help: "API requests refused before they were answered, by reason: url_too_long, unauthenticated, forbidden, server_busy, user_busy, authenticating_busy, authorizing_busy (429), auth_error, timeout.",
		}, []string{"reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_api_requests_total",
			Help: "API requests, by route (discovery, openapi, list, get, watch, status, signing-keys, version, write, other) and HTTP status code.",
		}, []string{"route", "code"}),
		watchInitial: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynwatch_api_watch_initial_objects_total",
			Help: "Cached objects read to open watches with initial events: a namespaced watch reads its namespace's, a watch of one object that object.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dynwatch_api_request_duration_seconds",
			Help:    "Time to answer API requests, by route; for watches, how long they lasted.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300},
		}, []string{"route"}),
	}
	if err := registerAll(o.Registerer, a.requests, a.latency, a.rejected, a.watchInitial); err != nil {
		return nil, err
	}
	for _, route := range routes {
		a.latency.WithLabelValues(route)
		a.requests.WithLabelValues(route, "200") // so that ratios over it have a denominator from the start
	}
	for _, reason := range rejectReasons {
		a.rejected.WithLabelValues(reason)
	}
	r := gin.New()
	r.RedirectTrailingSlash = false
	r.Use(a.instrument, recovery(o.Logger), a.guard, a.named)
	r.GET("/status", a.status)
	r.GET("/signing-keys", a.signingKeys)
	r.GET("/version", a.version)
	r.GET("/openapi/v2", a.openAPIV2)
	r.GET("/openapi/v3", a.openAPIV3)
	r.GET("/openapi/v3/*path", a.openAPIV3)
	r.NoRoute(a.serve) // every Kubernetes path: gin's router cannot express their overlaps
	return r, nil
}

// The headers every answer to an authenticated caller names the cluster in (see
// object.Cluster): its id, and its display name when it has one.
const (
	ClusterIDHeader   = "Dynwatch-Cluster-Id"
	ClusterNameHeader = "Dynwatch-Cluster-Name"
)

// named puts the cluster's headers on the answer to a caller the guard let through; not on
// those anyone may read (/version).
func (a *api) named(c *gin.Context) {
	if unauthenticatedPaths[c.Request.URL.Path] {
		return
	}
	if a.Cluster.ID != "" {
		c.Header(ClusterIDHeader, a.Cluster.ID)
	}
	if a.Cluster.Name != "" {
		c.Header(ClusterNameHeader, a.Cluster.Name)
	}
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (a *api) instrument(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.GetString(routeKey)
	if route == "" {
		route = "other"
	}
	a.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	a.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	a.Logger.Debug("request", "method", c.Request.Method, "path", truncated(c.Request.URL.Path), "query", truncated(c.Request.URL.RawQuery),
		"route", route, "status", c.Writer.Status(), "duration", time.Since(start))
}

// loggedLength is how much of a request's path or query string a log line carries: a URL may
// be up to api.limits.maxURLLength long, and anyone may send one.
const loggedLength = 256

// truncated is s cut to loggedLength bytes, saying how long it was.
func truncated(s string) string {
	if len(s) <= loggedLength {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:loggedLength], len(s))
}

// recovery answers a request whose handler panicked with a 500 that names nothing internal;
// the log has the panic.
func recovery(log *slog.Logger) gin.HandlerFunc {
	return gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, err any) {
		log.Error("panic serving request", "method", c.Request.Method, "path", truncated(c.Request.URL.Path), "err", err)
		writeStatus(c.Writer, apierrors.NewInternalError(errors.New("the request could not be answered")))
		c.Abort()
	})
}

func (a *api) status(c *gin.Context) {
	c.Set(routeKey, "status")
	a.deadline(c, a.RequestTimeout)
	ok, reasons := a.Informers.Ready()
	resp := StatusResponse{Cluster: a.Cluster, Ready: ok, NotReady: reasons, Resources: a.Informers.Status(), Reload: a.Reloads.Status()}
	if a.LeaderElection != nil {
		resp.LeaderElection = a.LeaderElection()
	}
	if a.Journal != nil {
		resp.Journal = a.Journal()
	}
	if a.Sinks != nil {
		resp.Sinks = a.Sinks()
	}
	if a.History != nil {
		resp.History = a.History.Stats()
	}
	c.JSON(http.StatusOK, resp)
}

// signingKeys answers GET /signing-keys (see APIOptions.SigningKeys).
func (a *api) signingKeys(c *gin.Context) {
	c.Set(routeKey, "signing-keys")
	var keys any = struct{}{}
	if a.SigningKeys != nil {
		keys = a.SigningKeys()
	}
	c.JSON(http.StatusOK, keys)
}

func (a *api) version(c *gin.Context) {
	c.Set(routeKey, "version")
	v := a.Informers.ServerVersion()
	if v == nil {
		writeStatus(c.Writer, apierrors.NewServiceUnavailable("the apiserver's version is not known yet"))
		return
	}
	c.JSON(http.StatusOK, v)
}

// timeoutGrace is how long after api.requestTimeout a response may still be written: the
// work is cut at the timeout, and its 504 must still reach the client.
const timeoutGrace = 5 * time.Second

// deadline bounds writing the response to d and the grace after it.
func (a *api) deadline(c *gin.Context, d time.Duration) {
	_ = http.NewResponseController(c.Writer).SetWriteDeadline(time.Now().Add(d + timeoutGrace))
}

// serve answers every Kubernetes API path.
func (a *api) serve(c *gin.Context) {
	w := c.Writer
	t, ok := parsePath(c.Request.URL.Path)
	if !ok {
		writeStatus(w, notServed())
		return
	}
	c.Set(routeKey, routeOf(c.Request, t))
	if c.Request.Method != http.MethodGet && c.Request.Method != http.MethodHead {
		writeStatus(w, apierrors.NewMethodNotSupported(t.gv.WithResource(t.resource).GroupResource(), c.Request.Method))
		return
	}
	if t.discovery != "" {
		a.deadline(c, a.RequestTimeout)
		a.discovery(w, t)
		return
	}
	res, ok := a.lookup(c, t)
	if !ok {
		return
	}
	if t.subresource != "" && t.subresource != revisionsSubresource {
		writeStatus(w, notServed())
		return
	}
	q, serr := parseQuery(c.Request.URL.Query(), a.MaxPageSize)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	out, serr := a.responder(c, res, q)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	if !synced(c, res) {
		return
	}
	switch {
	case t.watch(c.Request.URL.Query()):
		a.serveWatch(c, res, t, q, out)
	case t.subresource != "":
		a.deadline(c, a.RequestTimeout)
		a.revisions(c, res, t)
	case t.name == "" && boolParameter(c.Request.URL.Query(), "deleted"):
		a.deadline(c, a.RequestTimeout)
		a.deleted(c, res, t, q, out)
	case t.name != "":
		a.deadline(c, a.RequestTimeout)
		obj, found := res.Get(t.namespace, t.name)
		if !found {
			gvr, _, _ := res.API()
			writeStatus(w, apierrors.NewNotFound(gvr.GroupResource(), t.name))
			return
		}
		out.object(w, obj)
	default:
		a.deadline(c, a.RequestTimeout)
		a.list(c, res, t, q, out)
	}
}

// lookup is the running resource t names; false once it has answered otherwise: with the
// events from the apiserver, or not served.
func (a *api) lookup(c *gin.Context, t target) (*dynamicinformer.Resource, bool) {
	res, ok := a.Informers.Lookup(t.gv.WithResource(t.resource))
	if !ok {
		if !a.eventsFromAPIServer(c, t) {
			writeStatus(c.Writer, notServed())
		}
		return nil, false
	}
	_, info, running := res.API()
	if !running || (info.Namespaced && t.namespace == "" && t.name != "") || (!info.Namespaced && t.namespace != "") {
		writeStatus(c.Writer, notServed())
		return nil, false
	}
	return res, true
}

// responder is how an answer of res is written, as a table or objects; q's field selectors
// are checked first against the fields res's kind can be selected by.
func (a *api) responder(c *gin.Context, res *dynamicinformer.Resource, q *query) (responder, *apierrors.StatusError) {
	gvr, info, _ := res.API()
	gk := schema.GroupKind{Group: gvr.Group, Kind: info.Kind}
	table := wantsTable(c.Request)
	var crd crdView
	if table || !q.fields.Empty() {
		crd = a.crds.view(c.Request.Context(), gvr)
	}
	if !q.fields.Empty() {
		if serr := q.selectFields(selectableFields(gk, crd.selectable, res.Config(), a.AnyFieldSelectors)); serr != nil {
			return responder{}, serr
		}
	}
	out := responder{gvk: gvr.GroupVersion().WithKind(info.Kind), table: table, include: includeObject(c.Request), printer: printerFor(gk, crd), chunks: a.chunks}
	if res.Config().MetadataOnly() {
		// The cache holds what the apiserver sends metadata informers, and says so: a client
		// that reads the kind's fields finds none, rather than empty ones.
		out.gvk, out.printer = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata"), defaultPrinter
	}
	return out, nil
}

// synced reports whether res's cache may answer: synced, or stale once listed (with a
// warning); otherwise it answers 503.
func synced(c *gin.Context, res *dynamicinformer.Resource) bool {
	switch st := res.State(); {
	case st == dynamicinformer.StateSynced:
	case st == dynamicinformer.StateStale && !res.Listed():
		writeStatus(c.Writer, apierrors.NewServiceUnavailable(res.Name()+" has never been listed: its list keeps failing"))
		return false
	case st == dynamicinformer.StateStale:
		// Kubernetes' warning format (RFC 7234 299), which kubectl and client-go print.
		c.Header("Warning", `299 - "dynwatch: the data of `+res.Name()+` is stale: its list and watch keep failing"`)
	default:
		writeStatus(c.Writer, apierrors.NewServiceUnavailable(res.Name()+" has not synced yet"))
		return false
	}
	return true
}

// routeOf names a Kubernetes API path's route for metrics, before anything about the request
// is checked, so that refusals are counted under the route asked for.
func routeOf(r *http.Request, t target) string {
	switch {
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		return "write"
	case t.discovery != "":
		return "discovery"
	}
	if t.watch(r.URL.Query()) {
		return "watch"
	}
	if t.name != "" {
		return "get"
	}
	return "list"
}

// printerFor is how kind gk is shown as a Table: its CRD's printer columns, the apiserver's
// columns for the built-in kinds dynwatch knows, or Name and Age.
func printerFor(gk schema.GroupKind, crd crdView) printer {
	if p, ok := crd.printer(); ok {
		return p
	}
	if p, ok := builtinPrinters[gk]; ok {
		return p
	}
	return defaultPrinter
}
