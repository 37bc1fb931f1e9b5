// Command dynwatch watches any set of Kubernetes resources through dynamic informers and serves
// their state and changes. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/httpapi"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if err := run(ctx, os.Args[1:], hup); err != nil {
		fmt.Fprintf(os.Stderr, "dynwatch: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, hup <-chan os.Signal) error {
	flags := flag.NewFlagSet("dynwatch", flag.ContinueOnError)
	configPath := flags.String("config", "", "path of the YAML configuration file (required)")
	kubeconfig := flags.String("kubeconfig", "", "path of a kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log)
	klog.SetSlogLogger(log)
	gin.SetMode(gin.ReleaseMode)

	// Before any client exists: client-go reads its feature gates as it builds them.
	clientfeatures.ReplaceFeatureGates(clientGates{base: clientfeatures.FeatureGates(), cbor: cfg.Client.CBOR})
	restConfig, err := clientConfig(*kubeconfig)
	if err != nil {
		return err
	}
	encodings := newEncodings()
	restConfig.Wrap(encodings.wrap)
	clientset, dyn, err := clients(restConfig)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), encodings.responses)
	watches := httpapi.NewHub(cfg.API.WatchHistory)
	store, err := openStore(log, cfg.State)
	if err != nil {
		return err
	}
	if sameDir(cfg.State.Path, *configPath) {
		log.Warn("state.path is in the configuration file's directory, which dynwatch watches for changes: every commit to the store wakes the watcher (about 5% of the CPU under load); give the store a directory of its own", "path", cfg.State.Path)
	}
	var election *webhook.Election
	if cfg.LeaderElection.Enabled {
		election = &webhook.Election{Config: cfg.LeaderElection, Client: clientset}
	}
	webhooks, err := webhook.New(webhook.Options{Logger: log, Registerer: reg, Webhooks: cfg.Webhooks, Store: store, Election: election, ShutdownTimeout: cfg.ShutdownTimeout})
	if err != nil {
		return err
	}
	informers, err := dynamicinformer.New(dynamicinformer.Options{
		Logger: log, Dynamic: dyn, Discovery: disco, Registerer: reg,
		Resources: cfg.Resources, Interval: cfg.Discovery.Interval,
		Subscribers: []dynamicinformer.Subscriber{watches, webhooks},
	})
	if err != nil {
		return err
	}
	reloader, err := config.NewReloader(config.ReloaderOptions{
		Logger: log, Registerer: reg, Path: *configPath, Current: cfg, Signals: hup,
		Apply: func(next *config.Config) error {
			if err := webhooks.Update(next.Webhooks); err != nil {
				return err
			}
			informers.Update(next.Resources)
			return nil
		},
	})
	if err != nil {
		return err
	}
	security, err := httpapi.NewSecurity(log, cfg.API, clientset)
	if err != nil {
		return err
	}
	// What the query API reads from the apiserver for its callers (events, OpenAPI, CRDs) has
	// a rate limit of its own: callers cannot starve the informers or the leader's renewals.
	upstream := rest.CopyConfig(restConfig)
	upstream.QPS, upstream.Burst = 20, 40
	upstreamClient, upstreamDynamic, err := clients(upstream)
	if err != nil {
		return err
	}
	api, err := httpapi.NewAPI(httpapi.APIOptions{
		Logger: log, Informers: informers, Watches: watches, Registerer: reg, Reloads: reloader, LeaderElection: leaderStatus(webhooks),
		MaxPageSize: cfg.API.MaxPageSize, RequestTimeout: cfg.API.RequestTimeout, MaxWatchTimeout: cfg.API.MaxWatchTimeout,
		Authenticator: security.Authenticator, Authorizer: security.Authorizer, Limits: cfg.API.Limits,
		AnyFieldSelectors: cfg.API.FieldSelectors == config.FieldSelectorsAny, Kubernetes: upstreamClient, Dynamic: upstreamDynamic,
		EventsFromAPIServer: cfg.API.Events == config.EventsFromAPIServer,
	})
	if err != nil {
		return err
	}

	log.Info("starting", "resources", len(cfg.Resources), "webhooks", len(cfg.Webhooks), "apiserver", restConfig.Host)
	g, ctx := errgroup.WithContext(ctx)
	// Delivery stops only once the informers have: no event may reach a sink that is draining.
	deliver, stopDelivery := context.WithCancel(context.WithoutCancel(ctx))
	g.Go(func() error { defer stopDelivery(); return informers.Run(ctx) })
	g.Go(func() error { return webhooks.Run(deliver) })
	g.Go(func() error { return reloader.Run(ctx) })
	g.Go(func() error { return security.Run(ctx) })
	g.Go(func() error {
		return httpapi.Serve(ctx, log.With("server", "api"), cfg.API.Address, api, httpapi.ServerOptions{Read: 30 * time.Second, TLS: security.ServerTLS()})
	})
	g.Go(func() error {
		return httpapi.Serve(ctx, log.With("server", "metrics"), cfg.Metrics.Address, httpapi.NewOps(reg, cfg.Metrics.PProf, informers, webhooks), httpapi.ServerOptions{Read: 30 * time.Second, Write: 30 * time.Second})
	})
	err = g.Wait()
	log.Info("stopped", "err", err)
	return err
}

// leaderStatus reports the dispatcher's leader election for /status, or nil without one.
func leaderStatus(d *webhook.Dispatcher) func() any {
	if _, ok := d.Leader(); !ok {
		return nil
	}
	return func() any { s, _ := d.Leader(); return s }
}

// openStore opens the state store, or returns nil when state.path is not set.
func openStore(log *slog.Logger, c config.State) (*journal.Store, error) {
	if c.Path == "" {
		log.Warn("state.path is not set: events queued at shutdown are dead-lettered, and a restart delivers every object as ADDED again")
		return nil, nil
	}
	store, err := journal.OpenStore(c.Path)
	if err != nil {
		return nil, err
	}
	if store.Damaged != "" {
		log.Error("state store damaged: set aside, and every object is delivered again as ADDED with its usual event id", "path", c.Path, "setAside", store.Damaged, "err", store.DamageErr)
	} else if store.Fresh {
		log.Warn("state store created: with no earlier state, every object is delivered as ADDED (expected on a first start; otherwise the state was lost)", "path", c.Path)
	}
	return store, nil
}

// sameDir reports whether the files a and b are in the same directory.
func sameDir(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	da, errA := filepath.Abs(filepath.Dir(a))
	db, errB := filepath.Abs(filepath.Dir(b))
	return errA == nil && errB == nil && da == db
}

func newLogger(c config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.SlogLevel}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}

// clientGates are client-go's feature gates with ClientsAllowCBOR as configured. With it, the
// dynamic clients send Accept: application/json;q=0.9,application/cbor;q=1 and decode whichever
// the apiserver chose; requests they send stay JSON (ClientsPreferCBOR stays off).
type clientGates struct {
	base clientfeatures.Gates
	cbor bool
}

func (g clientGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.ClientsAllowCBOR {
		return g.cbor
	}
	return g.base.Enabled(f)
}

// encodings counts the apiserver's responses by the encoding it chose, so that an operator (and
// a test) can see whether client.cbor is in effect.
type encodings struct{ responses *prometheus.CounterVec }

func newEncodings() encodings {
	e := encodings{responses: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dynwatch_apiserver_responses_total",
		Help: "Responses from the apiserver to dynwatch's own requests, by encoding (cbor, json, protobuf, other).",
	}, []string{"encoding"})}
	for _, enc := range []string{"cbor", "json", "protobuf", "other"} {
		e.responses.WithLabelValues(enc)
	}
	return e
}

func (e encodings) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
			enc := "other"
			switch media {
			case "application/cbor", "application/cbor-seq":
				enc = "cbor"
			case "application/json":
				enc = "json"
			case "application/vnd.kubernetes.protobuf":
				enc = "protobuf"
			}
			e.responses.WithLabelValues(enc).Inc()
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// clients returns a typed and a dynamic client for c, sharing nothing with other clients.
func clients(c *rest.Config) (*kubernetes.Clientset, *dynamic.DynamicClient, error) {
	typed, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	return typed, dyn, nil
}

// clientConfig resolves the apiserver connection as client-go tools do: the --kubeconfig flag,
// then $KUBECONFIG, then ~/.kube/config, then the in-cluster service account.
func clientConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	c.UserAgent = "dynwatch"
	c.QPS, c.Burst = 50, 100
	return c, nil
}
