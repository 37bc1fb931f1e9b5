package subscription

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynwatch/dynwatch/config"
)

// loadConfig is a configuration watching configmaps and deployments.apps.
func loadConfig(t *testing.T) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("resources:\n  - {version: v1, resource: configmaps}\n  - {group: apps, version: v1, resource: deployments}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func subscriptionOf(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "events.dynwatch.io/v1alpha1", "kind": "Subscription"}}
	u.SetNamespace("team-a")
	u.SetName("changes")
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

func TestASubscriptionBecomesAWebhookNamedAfterItWithItsSubject(t *testing.T) {
	u := subscriptionOf(map[string]any{
		"url": "https://receiver.team-a.svc/events", "resources": []any{"configmaps", "deployments.apps"}, "eventTypes": []any{"MODIFIED"},
		"filter": "has(object.data)", "payload": map[string]any{"diff": "mergePatch"},
		"subject": map[string]any{"username": "alice", "groups": []any{"team-a"}},
	})
	w, s, err := sinkOf(u, loadConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "subscription.team-a.changes" || w.Endpoint.Host != "receiver.team-a.svc" || len(w.GroupResources) != 2 || w.Program == nil ||
		w.Payload.Diff != config.DiffMergePatch || w.Payload.Object != config.PayloadFull || w.Workers != config.DefaultWebhookWorkers {
		t.Errorf("the webhook is %+v", w)
	}
	if w.Subject == nil || w.Subject.Username != "alice" || s.Subject != w.Subject {
		t.Errorf("the webhook's subject is %+v, want alice's", w.Subject)
	}
	again, _, _ := sinkOf(u, loadConfig(t))
	if !w.Same(again) {
		t.Error("the same subscription read twice does not configure the same sink")
	}
	u.Object["spec"].(map[string]any)["subject"] = map[string]any{"username": "bob"}
	if other, _, _ := sinkOf(u, loadConfig(t)); w.Same(other) {
		t.Error("a subscription whose subject changed configures the same sink: its deliveries would stay authorized as the old subject")
	}
}

func TestABadSubscriptionIsRefusedNamingItsField(t *testing.T) {
	subject := map[string]any{"username": "alice"}
	for _, tt := range []struct {
		name  string
		spec  map[string]any
		field []string
	}{
		{"no spec", nil, []string{"spec: is required"}},
		{"no subject: the admission policy is missing", map[string]any{"url": "http://r/", "resources": []any{"configmaps"}}, []string{"spec.subject"}},
		{"no resources", map[string]any{"url": "http://r/", "subject": subject}, []string{"spec.resources"}},
		{"an unwatched resource and a filter that does not compile", map[string]any{"url": "http://r/", "resources": []any{"secrets"}, "filter": "object.(", "subject": subject},
			[]string{"spec.resources[0]", "spec.filter"}},
		{"a URL that is not http", map[string]any{"url": "file:///etc/passwd", "resources": []any{"configmaps"}, "subject": subject}, []string{"spec.url"}},
		{"a bad label selector and event type", map[string]any{"url": "http://r/", "resources": []any{"configmaps"}, "labelSelector": "a in (", "eventTypes": []any{"CHANGED"}, "subject": subject},
			[]string{"spec.labelSelector", "spec.eventTypes[0]"}},
		{"a payload of nothing", map[string]any{"url": "http://r/", "resources": []any{"configmaps"}, "payload": map[string]any{"object": "none"}, "subject": subject}, []string{"spec.payload.object"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := sinkOf(subscriptionOf(tt.spec), loadConfig(t))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, f := range tt.field {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("the error does not name %s: %v", f, err)
				}
			}
		})
	}
}
