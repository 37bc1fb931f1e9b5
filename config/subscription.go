package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unique"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dynwatch/dynwatch/egress"
)

// Subscriptions configures the sinks teams declare themselves: Subscription objects
// (events.dynwatch.io/v1alpha1), each delivered as a webhook under its writer's own RBAC (see
// docs/subscriptions.md).
type Subscriptions struct {
	// Enabled watches Subscription objects; their CRD must be installed (the chart's
	// subscriptions.enabled installs it with its admission policies).
	Enabled bool `mapstructure:"enabled"`
	// Namespaces are those whose Subscriptions this dynwatch serves; empty: every namespace.
	// Two installs in one cluster must not serve the same namespace: each would deliver.
	Namespaces []string `mapstructure:"namespaces"`
	// ReviewEvery is how often each decision of whether a subscription's subject may watch a
	// resource in a namespace is asked again: a grant revoked stops deliveries within it.
	ReviewEvery time.Duration `mapstructure:"reviewEvery"`
	// Egress bounds the addresses a subscription's URL may reach.
	Egress Egress `mapstructure:"egress"`
	// Quota bounds what one namespace's subscriptions may cost.
	Quota Quota `mapstructure:"quota"`
	// SigningSecretNames are the names a Secret holding a subscription's signing keys may
	// have, in the subscription's namespace: dynwatch may read Secrets of these names only
	// (the chart grants get on them by name), and only for a subject that may read them too.
	SigningSecretNames []string `mapstructure:"signingSecretNames"`
	// CredentialSecretNames are the names a Secret holding a stream subscription's user name
	// and password may have, in the subscription's namespace, read as SigningSecretNames are.
	CredentialSecretNames []string `mapstructure:"credentialSecretNames"`
}

// Quota bounds the subscriptions of one namespace.
type Quota struct {
	// PerNamespace is how many subscriptions of a namespace are accepted, the oldest first;
	// the others are refused in their status (QuotaExceeded).
	PerNamespace int `mapstructure:"perNamespace"`
	// QueueSize is each subscription's queue, in events.
	QueueSize int `mapstructure:"queueSize"`
	// DeliveriesPerSecond is how many attempts a second the subscriptions of one namespace
	// make together, at most (a burst of as many); 0 bounds nothing.
	DeliveriesPerSecond float64 `mapstructure:"deliveriesPerSecond"`
}

// The subscriptions.quota defaults.
const (
	DefaultQuotaPerNamespace  = 10
	DefaultQuotaQueueSize     = 1000
	DefaultQuotaDeliveriesSec = 50
)

// Egress is what a subscription may reach besides public addresses: by default no loopback,
// link-local (cloud metadata), private, shared, multicast or reserved address (see package
// egress). Both lists are CIDRs, checked on the address each connection dials.
type Egress struct {
	// Allow lets a subscription reach these ranges (a receiver Service's ClusterIP range, say).
	Allow []string `mapstructure:"allow"`
	// Deny refuses these ranges besides the defaults, winning over Allow: the cluster's pod
	// and Service ranges where they are public addresses.
	Deny []string `mapstructure:"deny"`

	// Policy is Allow and Deny parsed, by Load.
	Policy egress.Policy `mapstructure:"-"`
}

// DefaultReviewEvery is subscriptions.reviewEvery unless set.
const DefaultReviewEvery = time.Minute

func (s *Subscriptions) validate(p *problems) {
	if s.ReviewEvery < time.Second {
		p.add("subscriptions.reviewEvery", "must be at least 1s, got %s", s.ReviewEvery)
	}
	for i, ns := range s.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			p.add(fmt.Sprintf("subscriptions.namespaces[%d]", i), "%s", msg)
		}
	}
	for key, names := range map[string][]string{"signingSecretNames": s.SigningSecretNames, "credentialSecretNames": s.CredentialSecretNames} {
		for i, name := range names {
			for _, msg := range validation.IsDNS1123Subdomain(name) {
				p.add(fmt.Sprintf("subscriptions.%s[%d]", key, i), "%s", msg)
			}
		}
	}
	q := s.Quota
	if q.PerNamespace < 1 {
		p.add("subscriptions.quota.perNamespace", "must be at least 1, got %d", q.PerNamespace)
	}
	if q.QueueSize < 1 {
		p.add("subscriptions.quota.queueSize", "must be at least 1, got %d", q.QueueSize)
	}
	if q.DeliveriesPerSecond < 0 {
		p.add("subscriptions.quota.deliveriesPerSecond", "must be 0 (no bound) or more, got %v", q.DeliveriesPerSecond)
	}
	for _, l := range []struct {
		key   string
		cidrs []string
		into  *[]netip.Prefix
	}{{"allow", s.Egress.Allow, &s.Egress.Policy.Allow}, {"deny", s.Egress.Deny, &s.Egress.Policy.Deny}} {
		*l.into = nil
		for i, c := range l.cidrs {
			prefix, err := netip.ParsePrefix(c)
			if err != nil {
				p.add(fmt.Sprintf("subscriptions.egress.%s[%d]", l.key, i), "must be a CIDR (127.0.0.1/32, 10.96.0.0/12, fd00::/8), got %q", c)
				continue
			}
			*l.into = append(*l.into, prefix.Masked())
		}
	}
}

// Login is a user name and password held in memory instead of files: a stream Subscription's,
// read from a Secret of its namespace.
type Login struct {
	User, Password Secret
}

// same reports whether l and o hold the same login, or are both nil.
func (l *Login) same(o *Login) bool {
	if l == nil || o == nil {
		return l == o
	}
	return bytes.Equal(l.User, o.User) && bytes.Equal(l.Password, o.Password)
}

// Subject is the user a sink's deliveries are authorized as: each event is delivered only if
// this user may watch its resource in its namespace. Configured sinks have none (the operator
// chose them); a Subscription's is its last writer, as admission recorded it.
type Subject struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`

	key unique.Handle[string] // Key, once Seal has set it
}

// Seal computes the subject's Key once, for a subject no longer changed: a sink's is asked for
// it on every event.
func (s *Subject) Seal() { s.key = s.encode() }

// Key is the subject as a map key, cheap to hash and compare: its JSON (maps in key order),
// interned. Two subjects with the same user, UID, groups and extra have the same Key.
func (s *Subject) Key() unique.Handle[string] {
	if s.key != (unique.Handle[string]{}) {
		return s.key
	}
	return s.encode()
}

func (s *Subject) encode() unique.Handle[string] {
	b, _ := json.Marshal(s)
	return unique.Make(string(b))
}

// CheckSink fills in s's defaults, then checks and parses it as a sink entry of c at path
// (its fields named under path, as in "spec.url"), against c's resources: the configuration's
// own rules for a sink declared elsewhere (a Subscription), whose caller sets Source to what
// declared it, so that Same tells when that changed. A sink so built may not read files: its
// entry's file fields must be empty (a Kafka sink may still turn TLS on, verified with the
// system's roots).
func (c *Config) CheckSink(s SinkConfig, path string) error {
	if namesFiles(s) {
		return errors.New("a sink declared outside the configuration file may not name files")
	}
	s.setDefaults()
	env, err := celEnv()
	if err != nil {
		return err
	}
	var p problems
	s.validate(path, c.Resources, env, &p)
	if len(p) > 0 {
		return errors.Join(p...)
	}
	return nil
}

// namesFiles reports whether s names a file to read: credentials, TLS, signing keys, dead
// letters.
func namesFiles(s SinkConfig) bool {
	return len(s.SecretFiles()) > 0 || s.Shared().DeadLetter != (DeadLetter{})
}
