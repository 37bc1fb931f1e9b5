package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/history"
	"github.com/dynwatch/dynwatch/httpapi"
	"github.com/dynwatch/dynwatch/leader"
)

// build makes every part from cfg; nothing runs yet. It reads the cluster's identity (see
// resolveCluster), asking again until ctx ends while the apiserver does not answer.
func build(ctx context.Context, log *slog.Logger, cfg *config.Config, o Options) (_ *service, err error) {
	// Before any client exists: client-go reads its feature gates as it builds them.
	clientfeatures.ReplaceFeatureGates(clientGates{base: clientfeatures.FeatureGates(), cbor: cfg.Client.CBOR})
	restConfig, err := clientConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	encodings := newEncodings()
	restConfig.Wrap(encodings.wrap)
	limits := cfg.Client.RateLimits
	informers := forInformers(restConfig, cfg.Client)
	dyn, err := dynamic.NewForConfig(informers)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	objects, err := dynamicinformer.NewJSONClient(informers)
	if err != nil {
		return nil, fmt.Errorf("JSON client: %w", err)
	}
	meta, err := metadata.NewForConfig(informers)
	if err != nil {
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(informers)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), encodings.responses)
	s := &service{cfg: cfg, log: log, host: restConfig.Host}
	s.keys.set(cfg)
	if s.cluster, err = resolveCluster(ctx, log, cfg.Cluster, dyn); err != nil {
		return nil, err
	}

	if sameDir(cfg.State.Path, o.ConfigPath) {
		log.Warn("state.path is in the configuration file's directory, which dynwatch watches for changes: every commit to the store wakes the watcher (about 5% of the CPU under load); give the store a directory of its own", "path", cfg.State.Path)
	}
	var elector *leader.Elector
	var status func() any
	if cfg.LeaderElection.Enabled {
		client, err := kubernetes.NewForConfig(forConcern(restConfig, "leader-election", limits.LeaderElection))
		if err != nil {
			return nil, fmt.Errorf("leader election client: %w", err)
		}
		if elector, err = leader.New(leader.Options{Config: cfg.LeaderElection, Client: client, Logger: log, Registerer: reg}); err != nil {
			return nil, err
		}
		status = func() any { return elector.Status() }
	}
	s.current.Store(cfg)
	s.sinks.configured = cfg.Sinks()
	if cfg.Subscriptions.Enabled {
		if s.subscriptions, s.sinks.subscribed, err = newSubscriptions(ctx, log, reg, restConfig, dyn, &s.current, &s.sinks, s.sinkStatus, elector); err != nil {
			return nil, err
		}
	}
	if s.pipeline, err = newPipeline(log, reg, cfg, s.sinks.all(), s.subscriptions.access(), s.cluster, elector, func() []*dynamicinformer.Resource { return s.informers.Resources() }); err != nil {
		return nil, err
	}
	s.sinks.update = s.pipeline.delivery.Update
	defer func() {
		if err != nil {
			_ = s.pipeline.journal.Close() // the state store: an in-process caller may try again
		}
	}()
	watches := httpapi.NewHub(cfg.API.WatchHistory)
	subscribers := []dynamicinformer.Subscriber{watches, s.pipeline.journal}
	if cfg.State.Path != "" {
		if s.history, err = history.New(history.Options{
			Logger: log, Registerer: reg, Path: filepath.Join(cfg.State.Path, "history"), Policy: s.historyOf,
		}); err != nil {
			return nil, err
		}
		subscribers = append(subscribers, s.history)
	}
	if s.informers, err = dynamicinformer.New(dynamicinformer.Options{
		Logger: log, JSON: objects, Dynamic: dyn, Metadata: meta, Discovery: disco, Registerer: reg,
		Resources: cfg.Resources, Interval: cfg.Discovery.Interval,
		Subscribers: subscribers, Gate: s.pipeline.journal,
		ConsistencyCheck: cfg.ConsistencyCheck.Every(),
	}); err != nil {
		return nil, err
	}
	if s.reloader, err = config.NewReloader(config.ReloaderOptions{
		Logger: log, Registerer: reg, Path: o.ConfigPath, Current: cfg, Signals: o.Reload,
		Apply: func(next *config.Config) error {
			if err := s.sinks.setConfigured(next.Sinks()); err != nil {
				return err
			}
			s.current.Store(next)
			s.keys.set(next)
			s.informers.Update(next.Resources)
			return nil
		},
	}); err != nil {
		return nil, err
	}
	tokenReviews, err := kubernetes.NewForConfig(forConcern(restConfig, "reviews", limits.Reviews))
	if err != nil {
		return nil, fmt.Errorf("token review client: %w", err)
	}
	accessReviews, err := kubernetes.NewForConfig(forConcern(restConfig, "access-reviews", limits.AccessReviews))
	if err != nil {
		return nil, fmt.Errorf("access review client: %w", err)
	}
	if s.security, err = httpapi.NewSecurity(log, cfg.API, httpapi.ReviewClients{
		Tokens: tokenReviews, TokensLimit: limits.Reviews, Access: accessReviews, AccessLimit: limits.AccessReviews,
	}); err != nil {
		return nil, err
	}
	if s.api, err = newAPI(log, cfg, restConfig, s, watches, status, reg); err != nil {
		return nil, err
	}
	s.ready = &releasingReadiness{Readiness: s.informers, log: log}
	s.ops = httpapi.NewOps(reg, cfg.Metrics.PProf, s.ready, s.pipeline.journal)
	return s, nil
}

// newAPI builds the query API. What it reads from the apiserver for its callers (events,
// OpenAPI, CRDs) goes through clients with a rate limit of their own: callers cannot starve
// the informers or the leader's renewals.
func newAPI(log *slog.Logger, cfg *config.Config, restConfig *rest.Config, s *service, watches *httpapi.Hub, leaderStatus func() any, reg *prometheus.Registry) (http.Handler, error) {
	reads := forConcern(restConfig, "reads", cfg.Client.RateLimits.Reads)
	upstreamClient, err := kubernetes.NewForConfig(reads)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	upstreamDynamic, err := dynamic.NewForConfig(reads)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return httpapi.NewAPI(httpapi.APIOptions{
		Logger: log, Informers: s.informers, Watches: watches, History: s.historyReader(), Registerer: reg, Reloads: s.reloader, LeaderElection: leaderStatus, Cluster: s.cluster, SigningKeys: s.keys.get,
		Journal:     func() any { return s.pipeline.journal.Pressure() },
		Sinks:       func() any { return s.pipeline.delivery.Status() },
		MaxPageSize: cfg.API.MaxPageSize, RequestTimeout: cfg.API.RequestTimeout, MaxWatchTimeout: cfg.API.MaxWatchTimeout,
		Authenticator: s.security.Authenticator, Authorizer: s.security.Authorizer, Limits: cfg.API.Limits,
		AnyFieldSelectors: cfg.API.FieldSelectors == config.FieldSelectorsAny, Kubernetes: upstreamClient, Dynamic: upstreamDynamic,
		EventsFromAPIServer: cfg.API.Events == config.EventsFromAPIServer,
	})
}

// historyOf is the history configured for gvr's resource: false while it is not watched.
func (s *service) historyOf(gvr schema.GroupVersionResource) (config.History, bool) {
	if r, ok := s.informers.Lookup(gvr); ok {
		return r.Config().History, true
	}
	return config.History{}, false
}

// historyReader is the histories as the query API reads them: nil without a state store.
func (s *service) historyReader() httpapi.History {
	if s.history == nil {
		return nil
	}
	return s.history
}

// sinkStatus is every sink's state in delivery: none before delivery is built.
func (s *service) sinkStatus() []delivery.SinkStatus {
	if s.pipeline == nil {
		return nil
	}
	return s.pipeline.delivery.Status()
}
