package subscription

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
)

// GVR is the Subscription resource.
var GVR = schema.GroupVersionResource{Group: "events.dynwatch.io", Version: "v1alpha1", Resource: "subscriptions"}

// spec is a Subscription's spec as the CRD declares it: the webhook settings a team may choose,
// and the subject admission recorded. Nothing in it names a file on dynwatch's disk.
type spec struct {
	URL           string   `json:"url"`
	Resources     []string `json:"resources"`
	EventTypes    []string `json:"eventTypes,omitempty"`
	Namespaces    []string `json:"namespaces,omitempty"`
	LabelSelector string   `json:"labelSelector,omitempty"`
	Filter        string   `json:"filter,omitempty"`
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

// sinkOf turns a Subscription into its webhook, checked against cfg as a configured webhook
// is: an error names the spec's field.
func sinkOf(u *unstructured.Unstructured, cfg *config.Config) (*config.Webhook, *spec, error) {
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
	w := &config.Webhook{URL: s.URL, Sink: config.Sink{QueueSize: cfg.Subscriptions.Quota.QueueSize,
		Name: sinkName(u.GetNamespace(), u.GetName()), Resources: s.Resources, EventTypes: s.EventTypes, Namespaces: s.Namespaces,
		LabelSelector: s.LabelSelector, Filter: filter, FilterErrors: config.FilterErrors(s.FilterErrors),
		Payload: config.Payload{Diff: config.Diff(s.Payload.Diff), Object: config.PayloadObject(s.Payload.Object)},
		Subject: s.Subject, Source: string(b),
	}}
	if err := cfg.CheckWebhook(w, "spec"); err != nil {
		return nil, &s, err
	}
	if s.Signing != nil && !slices.Contains(cfg.Subscriptions.SigningSecretNames, s.Signing.SecretName) {
		return nil, &s, fmt.Errorf("spec.signing.secretName: must be one of %q (subscriptions.signingSecretNames: the Secrets dynwatch may read), got %q",
			cfg.Subscriptions.SigningSecretNames, s.Signing.SecretName)
	}
	w.Egress = &cfg.Subscriptions.Egress.Policy
	if ip, err := netip.ParseAddr(w.Endpoint.Hostname()); err == nil {
		if err := w.Egress.Check(ip); err != nil {
			return nil, &s, fmt.Errorf("spec.url: %w", err)
		}
	}
	return w, &s, nil
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
