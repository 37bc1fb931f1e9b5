package subscription

import (
	"encoding/json"
	"errors"
	"fmt"

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
	FilterErrors  string   `json:"filterErrors,omitempty"`
	Payload       struct {
		Diff   string `json:"diff,omitempty"`
		Object string `json:"object,omitempty"`
	} `json:"payload"`
	Subject *config.Subject `json:"subject,omitempty"`
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
	w := &config.Webhook{URL: s.URL, Sink: config.Sink{
		Name: sinkName(u.GetNamespace(), u.GetName()), Resources: s.Resources, EventTypes: s.EventTypes, Namespaces: s.Namespaces,
		LabelSelector: s.LabelSelector, Filter: s.Filter, FilterErrors: config.FilterErrors(s.FilterErrors),
		Payload: config.Payload{Diff: config.Diff(s.Payload.Diff), Object: config.PayloadObject(s.Payload.Object)},
		Subject: s.Subject, Source: string(b),
	}}
	if err := cfg.CheckWebhook(w, "spec"); err != nil {
		return nil, &s, err
	}
	return w, &s, nil
}
