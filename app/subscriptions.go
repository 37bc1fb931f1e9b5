package app

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/leader"
	"github.com/dynwatch/dynwatch/subscription"
)

// sinkSet is every sink delivery runs: the configuration's and the subscriptions', each set
// replaced whole by its own source (a reload, the subscription controller), then handed to
// delivery together.
type sinkSet struct {
	mu                     sync.Mutex
	configured, subscribed []config.SinkConfig
	update                 func([]config.SinkConfig) error // set once delivery is built
}

func (s *sinkSet) all() []config.SinkConfig {
	return append(slices.Clone(s.configured), s.subscribed...)
}

// setConfigured replaces the configuration's sinks; nothing changes if delivery refuses them.
func (s *sinkSet) setConfigured(sinks []config.SinkConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.update(append(slices.Clone(sinks), s.subscribed...)); err != nil {
		return err
	}
	s.configured = sinks
	return nil
}

// setSubscribed replaces the subscriptions' sinks; nothing changes if delivery refuses them.
func (s *sinkSet) setSubscribed(sinks []config.SinkConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.update(append(slices.Clone(s.configured), sinks...)); err != nil {
		return err
	}
	s.subscribed = sinks
	return nil
}

// subscriptions are the parts that run Subscriptions: nil unless subscriptions.enabled.
type subscriptions struct {
	reviewer   *subscription.Reviewer
	controller *subscription.Controller
}

// newSubscriptions builds the subscription controller and its reviewer, and lists the
// subscriptions' sinks delivery starts with; status is the sinks' state in delivery. Its reviews go through a client of their own,
// with the access reviews' rate limit: subscriptions cannot starve the query API's reviews.
func newSubscriptions(ctx context.Context, log *slog.Logger, reg prometheus.Registerer, restConfig *rest.Config, dyn dynamic.Interface, cfg *atomic.Pointer[config.Config], sinks *sinkSet, status func() []delivery.SinkStatus, elector *leader.Elector) (*subscriptions, []config.SinkConfig, error) {
	c := cfg.Load().Subscriptions
	reviews, err := kubernetes.NewForConfig(forConcern(restConfig, "subscription-reviews", cfg.Load().Client.RateLimits.AccessReviews))
	if err != nil {
		return nil, nil, fmt.Errorf("subscription review client: %w", err)
	}
	reviewer, err := subscription.NewReviewer(log, reg, reviews.AuthorizationV1().SubjectAccessReviews(), c.ReviewEvery)
	if err != nil {
		return nil, nil, err
	}
	secrets, err := kubernetes.NewForConfig(forConcern(restConfig, "subscriptions", cfg.Load().Client.RateLimits.Reads))
	if err != nil {
		return nil, nil, fmt.Errorf("subscription secrets client: %w", err)
	}
	secret := func(ctx context.Context, namespace, name string) (map[string][]byte, error) {
		s, err := secrets.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return s.Data, nil
	}
	var writes func() bool
	if elector != nil {
		writes = elector.Leading
	}
	controller := subscription.NewController(subscription.Options{
		Logger: log.With("controller", "subscriptions"), Client: dyn, Reviewer: reviewer, Config: cfg.Load,
		Apply: sinks.setSubscribed, Writes: writes, Every: c.ReviewEvery, Sinks: status, Secret: secret,
	})
	initial, err := controller.Initial(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &subscriptions{reviewer: reviewer, controller: controller}, initial, nil
}

// access is what delivery asks about the subscriptions' subjects: nil without subscriptions.
func (s *subscriptions) access() delivery.Access {
	if s == nil {
		return nil
	}
	return s.reviewer
}
