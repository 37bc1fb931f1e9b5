package config

import (
	"errors"
	"time"
)

// Subscriptions configures the sinks teams declare themselves: Subscription objects
// (events.dynwatch.io/v1alpha1), each delivered as a webhook under its writer's own RBAC (see
// docs/subscriptions.md).
type Subscriptions struct {
	// Enabled watches Subscription objects; their CRD must be installed (the chart's
	// subscriptions.enabled installs it with its admission policies).
	Enabled bool `mapstructure:"enabled"`
	// ReviewEvery is how often each decision of whether a subscription's subject may watch a
	// resource in a namespace is asked again: a grant revoked stops deliveries within it.
	ReviewEvery time.Duration `mapstructure:"reviewEvery"`
}

// DefaultReviewEvery is subscriptions.reviewEvery unless set.
const DefaultReviewEvery = time.Minute

func (s *Subscriptions) validate(p *problems) {
	if s.ReviewEvery < time.Second {
		p.add("subscriptions.reviewEvery", "must be at least 1s, got %s", s.ReviewEvery)
	}
}

// Subject is the user a sink's deliveries are authorized as: each event is delivered only if
// this user may watch its resource in its namespace. Configured sinks have none (the operator
// chose them); a Subscription's is its last writer, as admission recorded it.
type Subject struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// CheckWebhook fills in w's defaults, then checks and parses it as a webhook entry of c at
// path (its fields named under path, as in "spec.url"), against c's resources: the
// configuration's own rules for a sink declared elsewhere (a Subscription), whose caller sets
// Source to what declared it, so that Same tells when that changed. A webhook so built may not
// read files: its entry's file fields must be empty.
func (c *Config) CheckWebhook(w *Webhook, path string) error {
	if w.BearerTokenFile != "" || w.SigningSecretFile != "" || len(w.SigningSecretFiles) > 0 || len(w.SigningKeyFiles) > 0 ||
		w.TLS != (TLS{}) || w.DeadLetter != (DeadLetter{}) {
		return errors.New("a webhook declared outside the configuration file may not name files")
	}
	w.setDefaults()
	env, err := celEnv()
	if err != nil {
		return err
	}
	var p problems
	w.validate(path, c.Resources, env, &p)
	if len(p) > 0 {
		return errors.Join(p...)
	}
	return nil
}
