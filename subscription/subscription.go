package subscription

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
)

// GVR is the Subscription resource.
var GVR = schema.GroupVersionResource{Group: "events.dynwatch.io", Version: "v1alpha1", Resource: "subscriptions"}

// spec is a Subscription's spec as the CRD declares it: the sink settings a team may choose (a
// webhook's URL, a JetStream stream's servers or a Kafka topic's brokers: one of the three),
// and the subject admission recorded. Nothing in it names a file on dynwatch's disk.
type spec struct {
	URL           string     `json:"url,omitempty"`
	JetStream     *jetStream `json:"jetstream,omitempty"`
	Kafka         *kafka     `json:"kafka,omitempty"`
	Resources     []string   `json:"resources"`
	EventTypes    []string   `json:"eventTypes,omitempty"`
	Namespaces    []string   `json:"namespaces,omitempty"`
	LabelSelector string     `json:"labelSelector,omitempty"`
	Filter        string     `json:"filter,omitempty"`
	// Filters are CloudEvents Subscriptions API filters (exact, prefix, suffix, all, any,
	// not) over the attributes type, source and subject; all must match, and filter too.
	Filters      []map[string]any `json:"filters,omitempty"`
	FilterErrors string           `json:"filterErrors,omitempty"`
	Payload      struct {
		Diff   string `json:"diff,omitempty"`
		Object string `json:"object,omitempty"`
	} `json:"payload"`
	// Signing names a Secret in the subscription's namespace and the keys of it that sign.
	Signing *signing        `json:"signing,omitempty"`
	Subject *config.Subject `json:"subject,omitempty"`
}

// jetStream is a subscription delivered as a JetStream sink: each event published to
// <subjectPrefix>.<resource>.<group>.<namespace>.<name>, into stream if named.
type jetStream struct {
	Servers       []string `json:"servers"`
	SubjectPrefix string   `json:"subjectPrefix,omitempty"`
	Stream        string   `json:"stream,omitempty"`
	Credentials   *login   `json:"credentials,omitempty"`
}

// kafka is a subscription delivered as a Kafka sink: each event produced to topic.
type kafka struct {
	Brokers     []string `json:"brokers"`
	Topic       string   `json:"topic"`
	TLS         bool     `json:"tls,omitempty"` // verified with the system's roots
	Compression string   `json:"compression,omitempty"`
	SASL        *sasl    `json:"sasl,omitempty"`
}

// sasl is how a Kafka subscription authenticates: a mechanism, and its login.
type sasl struct {
	Mechanism string `json:"mechanism"`
	login
}

// login names a Secret in the subscription's namespace, and the keys of it holding a user name
// and a password (default username and password).
type login struct {
	SecretName  string `json:"secretName"`
	UsernameKey string `json:"usernameKey,omitempty"`
	PasswordKey string `json:"passwordKey,omitempty"`
}

// login is the spec's login, the field that declares it, and the sink's login to fill in from
// its Secret; nil for a sink without one.
func (s *spec) login(sink config.SinkConfig) (*login, string, *config.Login) {
	switch sink := sink.(type) {
	case *config.JetStream:
		if s.JetStream.Credentials != nil {
			return s.JetStream.Credentials, "spec.jetstream.credentials", sink.Login
		}
	case *config.Kafka:
		if s.Kafka.SASL != nil {
			return &s.Kafka.SASL.login, "spec.kafka.sasl", sink.SASL.Login
		}
	}
	return nil, "", nil
}

// readLogin fills in to from data, the Secret's: its errors name the field and the key, never
// the content.
func readLogin(l *login, field string, data map[string][]byte, to *config.Login) error {
	for _, k := range []struct {
		field, key string
		into       *config.Secret
	}{{"usernameKey", cmp.Or(l.UsernameKey, "username"), &to.User}, {"passwordKey", cmp.Or(l.PasswordKey, "password"), &to.Password}} {
		b := bytes.TrimSpace(data[k.key])
		if len(b) == 0 {
			return fmt.Errorf("%s.%s: the Secret %s has no key %q, or it is empty", field, k.field, l.SecretName, k.key)
		}
		*k.into = config.Secret(b)
	}
	return nil
}

// signing is a subscription's signing keys: each of Keys, a key of the Secret SecretName in
// the subscription's namespace, holds a Standard Webhooks secret (whsec_..., v1) or an Ed25519
// private key in PKCS#8 PEM (v1a); each signs every request.
type signing struct {
	SecretName string   `json:"secretName"`
	Keys       []string `json:"keys"`
}

// sinkName names the sink of the subscription namespace/name in metrics, logs, dead letters and
// the state store. Configured sinks' names are DNS labels, without dots: the two never meet.
func sinkName(namespace, name string) string { return "subscription." + namespace + "." + name }

// sinkOf turns a Subscription into its sink, checked against cfg as a configured sink is: an
// error names the spec's field.
func sinkOf(u *unstructured.Unstructured, cfg *config.Config) (config.SinkConfig, *spec, error) {
	raw, ok := u.Object["spec"]
	if !ok {
		return nil, nil, errors.New("spec: is required")
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("spec: %w", err)
	}
	var s spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, fmt.Errorf("spec: %w", err)
	}
	switch {
	case s.Subject == nil || s.Subject.Username == "":
		return nil, &s, errors.New("spec.subject: is not set; admission records who wrote the subscription (the chart's MutatingAdmissionPolicy), and without it nothing is delivered")
	case len(s.Resources) == 0:
		return nil, &s, errors.New("spec.resources: is required: name each resource to receive (resource.group, e.g. deployments.apps)")
	}
	s.Subject.Seal()
	filter := s.Filter
	if len(s.Filters) > 0 {
		expr, err := dialects("spec.filters", s.Filters)
		if err != nil {
			return nil, &s, err
		}
		if filter != "" {
			expr = "(" + filter + ") && " + expr
		}
		filter = expr
	}
	shared := config.Sink{QueueSize: cfg.Subscriptions.Quota.QueueSize,
		Name: sinkName(u.GetNamespace(), u.GetName()), Resources: s.Resources, EventTypes: s.EventTypes, Namespaces: s.Namespaces,
		LabelSelector: s.LabelSelector, Filter: filter, FilterErrors: config.FilterErrors(s.FilterErrors),
		Payload: config.Payload{Diff: config.Diff(s.Payload.Diff), Object: config.PayloadObject(s.Payload.Object)},
		Subject: s.Subject, Source: string(b), Egress: &cfg.Subscriptions.Egress.Policy,
	}
	sink, fields, err := s.sink(shared)
	if err != nil {
		return nil, &s, err
	}
	if err := cfg.CheckSink(sink, "spec"); err != nil {
		return nil, &s, fields.Replace(err.Error())
	}
	if s.Signing != nil && !slices.Contains(cfg.Subscriptions.SigningSecretNames, s.Signing.SecretName) {
		return nil, &s, fmt.Errorf("spec.signing.secretName: must be one of %q (subscriptions.signingSecretNames: the Secrets dynwatch may read), got %q",
			cfg.Subscriptions.SigningSecretNames, s.Signing.SecretName)
	}
	if l, field, _ := s.login(sink); l != nil && !slices.Contains(cfg.Subscriptions.CredentialSecretNames, l.SecretName) {
		return nil, &s, fmt.Errorf("%s.secretName: must be one of %q (subscriptions.credentialSecretNames: the Secrets dynwatch may read), got %q",
			field, cfg.Subscriptions.CredentialSecretNames, l.SecretName)
	}
	for _, h := range hosts(sink) {
		if ip, err := netip.ParseAddr(h.host); err == nil {
			if err := shared.Egress.Check(ip); err != nil {
				return nil, &s, fmt.Errorf("%s: %w", h.field, err)
			}
		}
	}
	return sink, &s, nil
}

// fieldNames renames the fields a stream sink's checks name (spec.servers) to where the
// Subscription declares them (spec.jetstream.servers): the checks are the configuration's,
// where they sit beside the shared ones.
type fieldNames []string

// Replace renames the fields in msg.
func (f fieldNames) Replace(msg string) error {
	if len(f) > 0 {
		msg = strings.NewReplacer(f...).Replace(msg)
	}
	return errors.New(msg)
}

// sink is the sink of the kind the spec declares, exactly one, with shared, and how its
// fields are renamed.
func (s *spec) sink(shared config.Sink) (config.SinkConfig, fieldNames, error) {
	kinds := 0
	for _, set := range []bool{s.URL != "", s.JetStream != nil, s.Kafka != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return nil, nil, errors.New("spec: set exactly one of url (a webhook), jetstream and kafka")
	}
	switch {
	case s.JetStream != nil:
		if s.Signing != nil {
			return nil, nil, errors.New("spec.signing: only a webhook's requests are signed")
		}
		js := &config.JetStream{Sink: shared, Servers: s.JetStream.Servers, SubjectPrefix: s.JetStream.SubjectPrefix, Stream: s.JetStream.Stream}
		if s.JetStream.Credentials != nil {
			js.Login = &config.Login{} // filled in from the Secret once accepted; checked as a password meanwhile
		}
		return js, renames("jetstream", "servers", "subjectPrefix", "stream"), nil
	case s.Kafka != nil:
		if s.Signing != nil {
			return nil, nil, errors.New("spec.signing: only a webhook's requests are signed")
		}
		k := &config.Kafka{Sink: shared, Brokers: s.Kafka.Brokers, Topic: s.Kafka.Topic, TLS: config.KafkaTLS{Enabled: s.Kafka.TLS}, Compression: config.Compression(s.Kafka.Compression)}
		if s.Kafka.SASL != nil {
			k.SASL = config.SASL{Mechanism: config.SASLMechanism(s.Kafka.SASL.Mechanism), Login: &config.Login{}}
		}
		return k, renames("kafka", "brokers", "topic", "tls", "compression", "sasl"), nil
	}
	return &config.Webhook{Sink: shared, URL: s.URL}, nil, nil
}

func renames(kind string, fields ...string) fieldNames {
	var out fieldNames
	for _, f := range fields {
		out = append(out, "spec."+f, "spec."+kind+"."+f)
	}
	return out
}

// host is a host name or address a sink dials, and the field that names it.
type host struct{ field, host string }

// hosts are the hosts sink names: a webhook's URL's, a JetStream sink's servers', a Kafka
// sink's brokers'.
func hosts(sink config.SinkConfig) []host {
	var out []host
	switch sink := sink.(type) {
	case *config.Webhook:
		out = append(out, host{"spec.url", sink.Endpoint.Hostname()})
	case *config.JetStream:
		for i, raw := range sink.Servers {
			if u, err := url.Parse(raw); err == nil {
				out = append(out, host{fmt.Sprintf("spec.jetstream.servers[%d]", i), u.Hostname()})
			}
		}
	case *config.Kafka:
		for i, b := range sink.Brokers {
			if h, _, err := net.SplitHostPort(b); err == nil {
				out = append(out, host{fmt.Sprintf("spec.kafka.brokers[%d]", i), h})
			}
		}
	}
	return out
}

// readKeys reads s's signing keys from data, the Secret's: each named key holds a Standard
// Webhooks secret or an Ed25519 private key. Its errors name the field and the key, never the
// content.
func readKeys(s *signing, data map[string][]byte) (secrets, keys []config.Secret, err error) {
	for i, k := range s.Keys {
		b, ok := data[k]
		name := fmt.Sprintf("spec.signing.keys[%d]: key %q of Secret %s", i, k, s.SecretName)
		if !ok {
			return nil, nil, fmt.Errorf("%s: no such key", name)
		}
		if bytes.HasPrefix(bytes.TrimSpace(b), []byte("-----BEGIN")) {
			key, err := config.ParseSigningKey(b, name)
			if err != nil {
				return nil, nil, err
			}
			keys = append(keys, key)
			continue
		}
		secret, err := config.ParseSigningSecret(b, name)
		if err != nil {
			return nil, nil, err
		}
		secrets = append(secrets, secret)
	}
	return secrets, keys, nil
}
