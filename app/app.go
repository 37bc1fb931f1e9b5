package app

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/history"
	"github.com/dynwatch/dynwatch/httpapi"
	"github.com/dynwatch/dynwatch/object"
)

// Options are what Run needs from its caller.
type Options struct {
	// ConfigPath is the YAML configuration file (required).
	ConfigPath string
	// Kubeconfig is a kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, then in-cluster.
	Kubeconfig string
	// Reload asks for the configuration to be read again: main sends SIGHUP here.
	Reload <-chan os.Signal
	// Log receives the log; os.Stderr when nil.
	Log io.Writer
}

// Run loads the configuration, builds every part of dynwatch and runs them until ctx ends or
// one of them fails. It returns nil after a clean shutdown.
func Run(ctx context.Context, o Options) error {
	ctx, cancel := context.WithCancel(ctx) // ends what Run started (the memory limit's refresh) when it returns
	defer cancel()
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return err
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	log := newLogger(o.Log, cfg.Log)
	klog.SetSlogLogger(log)
	starting := releaseWhileStarting(ctx, log, startPagesEvery, startPagesGrowth, startPagesFor)
	defer starting.Stop()
	setGCPercent(log)
	setMemoryLimit(ctx, log)
	gin.SetMode(gin.ReleaseMode)
	s, err := build(ctx, log, cfg, o)
	if err != nil {
		return err
	}
	s.starting = starting
	log.Info("starting", "cluster", s.cluster.ID, "resources", len(cfg.Resources), "webhooks", len(cfg.Webhooks), "jetstream", len(cfg.JetStream), "kafka", len(cfg.Kafka), "apiserver", s.host)
	err = s.run(ctx)
	log.Info("stopped", "err", err)
	return err
}

// service is dynwatch's parts, built and not yet running.
type service struct {
	cfg       *config.Config
	log       *slog.Logger
	host      string
	cluster   object.Cluster
	keys      signingKeys // GET /signing-keys
	informers *dynamicinformer.Manager
	ready     *releasingReadiness // the informers' readiness, /readyz's first
	starting  *startRelease       // the releases of the executable's pages while starting
	pipeline  *pipeline
	history   *history.Recorder // nil without a state store
	reloader  *config.Reloader
	// current is the running configuration, sinks what delivery runs; subscriptions is nil
	// unless subscriptions.enabled.
	current       atomic.Pointer[config.Config]
	sinks         sinkSet
	subscriptions *subscriptions
	security      httpapi.Security
	api, ops      http.Handler
}

// run runs the parts under one errgroup until ctx ends or one fails. The pipeline and the
// history stop only once the informers have: no event may reach a journal that is closing.
func (s *service) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	deliver, stopDelivery := context.WithCancel(context.WithoutCancel(ctx))
	g.Go(func() error { defer stopDelivery(); return s.informers.Run(ctx) })
	g.Go(func() error { return s.pipeline.run(deliver) })
	if s.history != nil {
		g.Go(func() error { return s.history.Run(deliver) }) // like the pipeline, once the informers have stopped
	}
	g.Go(func() error { return s.reloader.Run(ctx) })
	if s.subscriptions != nil {
		g.Go(func() error { return s.subscriptions.reviewer.Run(ctx) })
		g.Go(func() error { return s.subscriptions.controller.Run(ctx) })
	}
	g.Go(func() error { return s.security.Run(ctx) })
	g.Go(func() error {
		releaseStartPagesOnceReady(ctx, s.ready)
		return nil
	})
	g.Go(func() error {
		ready := func() bool { ok, _ := s.ready.Ready(); return ok }
		// The first burst over is the start's: its releases end there.
		release := func() error { s.starting.Stop(); return releaseBurstMemory() }
		returnMemoryAfterBursts(ctx, s.log, ready, s.pipeline.journal.Backlog, release)
		return nil
	})
	g.Go(func() error {
		return httpapi.Serve(ctx, s.log.With("server", "api"), s.cfg.API.Address, s.api,
			httpapi.ServerOptions{Read: 30 * time.Second, TLS: s.security.ServerTLS()})
	})
	g.Go(func() error {
		return httpapi.Serve(ctx, s.log.With("server", "metrics"), s.cfg.Metrics.Address, s.ops,
			httpapi.ServerOptions{Read: 30 * time.Second, Write: 30 * time.Second})
	})
	return g.Wait()
}

func newLogger(w io.Writer, c config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.SlogLevel}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
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
