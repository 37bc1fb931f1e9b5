package subscription

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
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
	sink, s, err := sinkOf(u, loadConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	w, ok := sink.(*config.Webhook)
	if !ok {
		t.Fatalf("the sink is a %T, not a webhook", sink)
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

// TestASubscriptionToAStreamBecomesAJetStreamOrKafkaSinkWithinTheEgressPolicy: a spec with
// jetstream or kafka instead of url is that kind of sink, with the subscription's subject and
// the subscriptions' egress policy, which its transport dials within.
func TestASubscriptionToAStreamBecomesAJetStreamOrKafkaSinkWithinTheEgressPolicy(t *testing.T) {
	subject := map[string]any{"username": "alice"}
	js, _, err := sinkOf(subscriptionOf(map[string]any{"resources": []any{"configmaps"}, "subject": subject,
		"jetstream": map[string]any{"servers": []any{"nats://nats.team-a.svc:4222"}, "subjectPrefix": "team-a", "stream": "TEAM_A"}}), loadConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if j, ok := js.(*config.JetStream); !ok || j.Servers[0] != "nats://nats.team-a.svc:4222" || j.SubjectPrefix != "team-a" || j.Stream != "TEAM_A" ||
		j.Subject.Username != "alice" || j.Egress == nil || j.Name != "subscription.team-a.changes" {
		t.Errorf("the JetStream sink is %+v", js)
	}
	k, _, err := sinkOf(subscriptionOf(map[string]any{"resources": []any{"configmaps"}, "subject": subject,
		"kafka": map[string]any{"brokers": []any{"kafka.team-a.svc:9092"}, "topic": "changes", "tls": true}}), loadConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := k.(*config.Kafka); !ok || k.Brokers[0] != "kafka.team-a.svc:9092" || k.Topic != "changes" || !k.TLS.Enabled || k.TLSConfig == nil ||
		k.Subject.Username != "alice" || k.Egress == nil {
		t.Errorf("the Kafka sink is %+v", k)
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
		{"a loopback address", map[string]any{"url": "http://127.0.0.2:8080/", "resources": []any{"configmaps"}, "subject": subject}, []string{"spec.url", "127.0.0.2 is a loopback address"}},
		{"cloud metadata, IPv4-mapped", map[string]any{"url": "http://[::ffff:169.254.169.254]/", "resources": []any{"configmaps"}, "subject": subject}, []string{"spec.url", "link-local"}},
		{"a signing Secret of a name dynwatch does not read", map[string]any{"url": "http://r/", "resources": []any{"configmaps"}, "subject": subject,
			"signing": map[string]any{"secretName": "kube-root-ca.crt", "keys": []any{"ca.crt"}}}, []string{"spec.signing.secretName", "dynwatch-signing"}},
		{"a payload of nothing", map[string]any{"url": "http://r/", "resources": []any{"configmaps"}, "payload": map[string]any{"object": "none"}, "subject": subject}, []string{"spec.payload.object"}},
		{"no sink", map[string]any{"resources": []any{"configmaps"}, "subject": subject}, []string{"spec: set exactly one of url (a webhook), jetstream and kafka"}},
		{"a webhook and a stream", map[string]any{"url": "http://r/", "jetstream": map[string]any{"servers": []any{"nats://n:4222"}}, "resources": []any{"configmaps"}, "subject": subject},
			[]string{"spec: set exactly one of url"}},
		{"no servers, a subject prefix with a wildcard", map[string]any{"jetstream": map[string]any{"subjectPrefix": "a.*"}, "resources": []any{"configmaps"}, "subject": subject},
			[]string{"spec.jetstream.servers", "spec.jetstream.subjectPrefix"}},
		{"a NATS server at a private address", map[string]any{"jetstream": map[string]any{"servers": []any{"nats://10.0.0.7:4222"}}, "resources": []any{"configmaps"}, "subject": subject},
			[]string{"spec.jetstream.servers[0]", "10.0.0.7 is a private address"}},
		{"a Kafka broker on loopback, no topic", map[string]any{"kafka": map[string]any{"brokers": []any{"127.0.0.1:9092"}}, "resources": []any{"configmaps"}, "subject": subject},
			[]string{"spec.kafka.topic"}},
		{"a Kafka broker on loopback", map[string]any{"kafka": map[string]any{"brokers": []any{"127.0.0.1:9092"}, "topic": "t"}, "resources": []any{"configmaps"}, "subject": subject},
			[]string{"spec.kafka.brokers[0]", "127.0.0.1 is a loopback address"}},
		{"a credentials Secret of a name dynwatch does not read", map[string]any{"jetstream": map[string]any{"servers": []any{"tls://n:4222"}, "credentials": map[string]any{"secretName": "db-password"}},
			"resources": []any{"configmaps"}, "subject": subject}, []string{"spec.jetstream.credentials.secretName", "dynwatch-credentials"}},
		{"a password to a NATS server that is not loopback, without TLS", map[string]any{"jetstream": map[string]any{"servers": []any{"nats://n:4222"}, "credentials": map[string]any{"secretName": "dynwatch-credentials"}},
			"resources": []any{"configmaps"}, "subject": subject}, []string{"spec.jetstream.servers", "password"}},
		{"SASL PLAIN to a broker that is not loopback, without TLS", map[string]any{"kafka": map[string]any{"brokers": []any{"k:9092"}, "topic": "t",
			"sasl": map[string]any{"mechanism": "PLAIN", "secretName": "dynwatch-credentials"}}, "resources": []any{"configmaps"}, "subject": subject}, []string{"spec.kafka.sasl.mechanism", "PLAIN"}},
		{"a stream that signs", map[string]any{"kafka": map[string]any{"brokers": []any{"k:9092"}, "topic": "t"}, "resources": []any{"configmaps"}, "subject": subject,
			"signing": map[string]any{"secretName": "dynwatch-signing", "keys": []any{"v1"}}}, []string{"spec.signing: only a webhook's requests are signed"}},
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

func TestALoginIsReadFromTheSecretAndAMissingKeyIsNamedWithoutTheContent(t *testing.T) {
	data := map[string][]byte{"username": []byte("team\n"), "password": []byte("hunter2"), "user": []byte("other")}
	var got config.Login
	if err := readLogin(&login{SecretName: "dynwatch-credentials"}, "spec.kafka.sasl", data, &got); err != nil || string(got.User) != "team" || string(got.Password) != "hunter2" {
		t.Fatalf("read the default keys: %q, %v", got.User, err)
	}
	if err := readLogin(&login{SecretName: "dynwatch-credentials", UsernameKey: "user", PasswordKey: "pass"}, "spec.kafka.sasl", data, &got); err == nil ||
		!strings.Contains(err.Error(), `spec.kafka.sasl.passwordKey: the Secret dynwatch-credentials has no key "pass"`) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a missing password key: %v", err)
	}
}

func TestSigningKeysAreReadFromTheSecretAndABadOneIsNamedWithoutItsContent(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	edPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: rsaDER})
	whsec := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	data := map[string][]byte{"v1": []byte(whsec + "\n"), "v1a": edPEM, "rsa": rsaPEM, "short": []byte("whsec_c2hvcnQ="), "junk": []byte("hunter2-is-my-password")}

	secrets, keys, err := readKeys(&signing{SecretName: "dynwatch-signing", Keys: []string{"v1", "v1a"}}, data)
	if err != nil || len(secrets) != 1 || len(keys) != 1 || !bytes.Equal(keys[0], priv) {
		t.Fatalf("read v1 and v1a: %d secrets, %d keys, %v", len(secrets), len(keys), err)
	}
	for key, want := range map[string]string{
		"rsa":     `spec.signing.keys[1]: key "rsa" of Secret dynwatch-signing holds a *rsa.PrivateKey key`,
		"short":   "requires at least 24",
		"junk":    "does not hold a Standard Webhooks secret",
		"missing": "no such key",
	} {
		_, _, err := readKeys(&signing{SecretName: "dynwatch-signing", Keys: []string{"v1", key}}, data)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("key %s: %v, want an error saying %q", key, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("key %s: the error holds the Secret's content: %v", key, err)
		}
	}
}
