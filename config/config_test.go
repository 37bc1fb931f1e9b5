package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadParsesTheFullExample(t *testing.T) {
	c, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Resources) != 6 {
		t.Fatalf("got %d resources, want 6", len(c.Resources))
	}
	cm := c.Resources[0]
	if got := cm.Labels.String(); got != "app in (api,web),tier!=test" {
		t.Errorf("label selector parsed as %q", got)
	}
	if got := cm.Fields.String(); got != "metadata.name!=kube-root-ca.crt" {
		t.Errorf("field selector parsed as %q", got)
	}
	if len(cm.Transform.Paths) != 2 || !*cm.Transform.StripManagedFields {
		t.Errorf("transform parsed as %+v", cm.Transform)
	}
	if got := c.Resources[1].Indexers[1].JSONPath.String(); got != "{.spec.containers[*].image}" {
		t.Errorf("jsonPath indexer parsed as %q", got)
	}
	if !c.Resources[2].IsSecrets() || c.Resources[3].String() != "Deployment.v1.apps" {
		t.Errorf("resources parsed as %v, %v", c.Resources[2].String(), c.Resources[3].String())
	}
	if whole := c.Resources[4]; !whole.IsWildcard() || whole.String() != "*.*.example.com" || whole.ExcludeResources[0] != "secretwidgets" {
		t.Errorf("whole group parsed as %s excluding %v", &whole, whole.ExcludeResources)
	}
	if sel := c.Resources[5].Namespaced; sel == nil || sel.String() != "team in (payments,search)" {
		t.Errorf("namespace selector parsed as %v", sel)
	}
	if len(c.JetStream) != 1 || c.JetStream[0].Stream != "DYNWATCH" || c.JetStream[0].Workers != 4 {
		t.Errorf("jetstream parsed as %+v", c.JetStream)
	}
	if len(c.Kafka) != 1 || c.Kafka[0].Topic != "dynwatch-events" || c.Kafka[0].TLSConfig == nil || c.Kafka[0].Compression != CompressionNone {
		t.Errorf("kafka parsed as %+v", c.Kafka)
	}
	if sinks := c.Sinks(); len(sinks) != 3 || sinks[1].Shared().Name != "changes" || sinks[2].Shared().Name != "audit-log" {
		t.Errorf("sinks are %d, want the webhook, the jetstream and the kafka sink", len(sinks))
	}
}

func TestLoadAppliesDefaults(t *testing.T) {
	c, err := Load(writeConfig(t, "resources: [{version: v1, resource: configmaps}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Resources[0].Transform
	got := []any{c.API.Address, c.Metrics.Address, c.Discovery.Interval, c.Log.Level, c.Log.Format,
		*tr.StripManagedFields, *tr.StripLastAppliedConfiguration, c.Resources[0].Labels.Empty(),
		c.API.Auth.Mode, c.API.TLS.Enabled, c.API.Limits.MaxURLLength, c.Client.CBOR}
	want := []any{":8443", ":9090", 5 * time.Second, "info", "json", true, true, true, AuthKubernetes, true, 8192, true}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("default %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestASinksQueueDefaultsToAWindowOverTheOutboxWithAStateStore(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		want        int
	}{
		{"no state store: the queue holds what waits", "", DefaultQueueSize},
		{"a state store: the rest waits in the outbox", "state: {path: /var/lib/dynwatch}\n", DefaultQueueSizeWithState},
		{"a queueSize set wins", "state: {path: /var/lib/dynwatch}\nwebhooks: [{name: set, url: 'http://127.0.0.1:1/', queueSize: 20000}]\n", 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sinks := tc.extra
			if !strings.Contains(sinks, "webhooks:") {
				sinks += "webhooks: [{name: hook, url: 'http://127.0.0.1:1/'}]\n"
			}
			c, err := Load(writeConfig(t, "resources: [{version: v1, resource: configmaps}]\n"+sinks))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Webhooks[0].QueueSize; got != tc.want {
				t.Errorf("queueSize = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestEnvironmentOverridesTheFile(t *testing.T) {
	t.Setenv("DYNWATCH_API_ADDRESS", "127.0.0.1:1234")
	t.Setenv("DYNWATCH_LOG_LEVEL", "debug")
	c, err := Load(writeConfig(t, "resources: [{version: v1, resource: configmaps}]\napi: {address: ':7000'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.API.Address != "127.0.0.1:1234" || c.Log.Level != "debug" {
		t.Fatalf("api.address=%q log.level=%q, want the environment's values", c.API.Address, c.Log.Level)
	}
}

func TestLoadRejectsBadConfigNamingTheField(t *testing.T) {
	dir := t.TempDir()
	tokenFile, shortSecretFile := filepath.Join(dir, "token"), filepath.Join(dir, "short")
	if err := os.WriteFile(tokenFile, []byte("t0ken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shortSecretFile, []byte("whsec_MDEyMzQ1Njc4OWFiY2RlZg=="), 0o600); err != nil {
		t.Fatal(err)
	}
	// Signing key files: one Ed25519 key, one ECDSA key, and a file that is no PEM at all.
	edFile, ecFile := filepath.Join(dir, "ed.pem"), filepath.Join(dir, "ec.pem")
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for file, key := range map[string]any{edFile: ed, ecFile: ec} {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"a config without resources", "api: {address: ':1'}\n",
			[]string{"resources: at least one resource"}},
		{"an unknown key in a resource", "resources: [{version: v1, resource: configmaps, labelSelectr: x}]\n",
			[]string{"resources[0]", "labelselectr"}},
		{"an unknown top-level key", "resources: [{version: v1, resource: pods}]\ninformers: {resync: 1s}\n",
			[]string{"informers"}},
		{"a duplicate resource", "resources: [{version: v1, resource: pods}, {group: '', version: v1, resource: pods}]\n",
			[]string{"resources[1]: duplicate of resources[0] (pods.v1)"}},
		{"namespaces to watch and to leave out", "resources: [{version: v1, resource: pods, namespaces: [a], excludeNamespaces: [b]}]\n",
			[]string{"resources[0].excludeNamespaces: cannot be set with namespaces"}},
		{"an exclusion of every namespace", "resources: [{version: v1, resource: pods, excludeNamespaces: [kube-system, '*']}]\n",
			[]string{`resources[0].excludeNamespaces[1]: "*" excludes every namespace`}},
		{"an exclusion that is no glob", "resources: [{version: v1, resource: pods, excludeNamespaces: ['team-[a']}]\n",
			[]string{`resources[0].excludeNamespaces[0]: "team-[a" is not a valid glob`}},
		{"an exclusion that is no namespace name", "resources: [{version: v1, resource: pods, excludeNamespaces: [Team_A]}]\n",
			[]string{"resources[0].excludeNamespaces[0]: a lowercase RFC 1123 label"}},
		{"a namespace selector that does not parse", "resources: [{version: v1, resource: pods, namespaceSelector: 'team in (a'}]\n",
			[]string{"resources[0].namespaceSelector: unable to parse requirement"}},
		{"a namespace selector that selects every namespace", "resources: [{version: v1, resource: pods, namespaceSelector: ' '}]\n",
			[]string{`resources[0].namespaceSelector: " " selects every namespace`}},
		{"namespaces to watch and a namespace selector", "resources: [{version: v1, resource: pods, namespaces: [a], namespaceSelector: team=a}]\n",
			[]string{"resources[0].namespaceSelector: cannot be set with namespaces"}},
		{"a bad label selector", "resources: [{version: v1, resource: pods, labelSelector: 'app in (a'}]\n",
			[]string{"resources[0].labelSelector:"}},
		{"a bad field selector", "resources: [{version: v1, resource: pods, fieldSelector: 'spec.nodeName'}]\n",
			[]string{"resources[0].fieldSelector:"}},
		{"an unknown field selector mode", "resources: [{version: v1, resource: pods}]\napi: {fieldSelectors: loose}\n",
			[]string{`api.fieldSelectors: must be "strict" or "any", got "loose"`}},
		{"an unknown events source", "resources: [{version: v1, resource: pods}]\napi: {events: cluster}\n",
			[]string{`api.events: must be "apiserver" or "none", got "cluster"`}},
		{"a bad JSONPath", "resources: [{version: v1, resource: pods, indexers: [{name: x, type: jsonPath, path: '{.spec[}'}]}]\n",
			[]string{"resources[0].indexers[0].path: invalid JSONPath"}},
		{"a bad duration", "resources: [{version: v1, resource: pods, resync: 5parsecs}]\n",
			[]string{"resources[0].resync", `invalid duration "5parsecs"`}},
		{"a too short resync", "resources: [{version: v1, resource: pods, resync: 10ms}]\n",
			[]string{"resources[0].resync: must be 0 (off) or at least 1s"}},
		{"duplicate indexer names", "resources: [{version: v1, resource: pods, indexers: [{name: a, type: owner}, {name: a, type: label, key: app}]}]\n",
			[]string{`resources[0].indexers[1].name: duplicate indexer name "a"`}},
		{"the reserved namespace indexer", "resources: [{version: v1, resource: pods, indexers: [{name: namespace, type: owner}]}]\n",
			[]string{"resources[0].indexers[0].name: \"namespace\" is reserved"}},
		{"an indexer of unknown type", "resources: [{version: v1, resource: pods, indexers: [{name: a, type: regex}]}]\n",
			[]string{"resources[0].indexers[0].type: must be one of"}},
		{"a label indexer without key", "resources: [{version: v1, resource: pods, indexers: [{name: a, type: label}]}]\n",
			[]string{"resources[0].indexers[0].key:"}},
		{"a path on an owner indexer", "resources: [{version: v1, resource: pods, indexers: [{name: a, type: owner, path: x}]}]\n",
			[]string{"resources[0].indexers[0].path: is not used by type owner"}},
		{"both resource and kind", "resources: [{version: v1, resource: pods, kind: Pod}]\n",
			[]string{"resources[0]: set resource or kind, not both"}},
		{"neither resource nor kind", "resources: [{version: v1}]\n",
			[]string{"resources[0]: one of resource or kind is required"}},
		{"a missing version", "resources: [{resource: pods}]\n",
			[]string{"resources[0].version: is required"}},
		{"a removeFields filter", "resources: [{version: v1, resource: pods, transform: {removeFields: ['{.spec.containers[?(@.name==\"x\")].env}']}}]\n",
			[]string{"resources[0].transform.removeFields[0]: invalid path", "not supported for removal"}},
		{"keepSecretData on configmaps", "resources: [{version: v1, resource: configmaps, transform: {keepSecretData: true}}]\n",
			[]string{"resources[0].transform.keepSecretData: only applies to core v1 secrets"}},
		{"an unknown cache", "resources: [{version: v1, resource: configmaps, cache: bytes}]\n",
			[]string{`resources[0].cache: must be full or metadata, got "bytes"`}},
		{"metadata only, with what needs the body", `resources:
  - version: v1
    resource: secrets
    cache: metadata
    transform: {removeFields: [metadata.annotations.x, data], keepSecretData: true}
    indexers:
      - {name: byApp, type: jsonPath, path: "{.metadata.labels.app}"}
      - {name: byType, type: jsonPath, path: "{.type}"}
      - {name: byOwner, type: owner}
`, []string{
			`resources[0].transform.removeFields[1]: "data" reads the object's body, which cache: metadata does not keep: only metadata.* paths apply`,
			"resources[0].transform.keepSecretData: keeps the secret's data, which cache: metadata does not keep",
			`resources[0].indexers[1].path: "{.type}" reads the object's body, which cache: metadata does not keep: only {.metadata...} paths apply, or an indexer of type label, annotation or owner`,
		}},
		{"a bad namespace", "resources: [{version: v1, resource: pods, namespaces: [Team_A]}]\n",
			[]string{"resources[0].namespaces[0]:"}},
		{"bad listeners and log settings", "resources: [{version: v1, resource: pods}]\napi: {address: nowhere}\nlog: {level: loud, format: xml}\n",
			[]string{"api.address: must be host:port", "log.level:", "log.format:"}},
		{"auth none on a network address", "resources: [{version: v1, resource: pods}]\napi: {address: ':8443', auth: {mode: none}}\n",
			[]string{"api.auth.mode: none serves every watched object to anyone"}},
		{"an unknown auth mode", "resources: [{version: v1, resource: pods}]\napi: {auth: {mode: oidc}}\n",
			[]string{`api.auth.mode: must be kubernetes or none, got "oidc"`}},
		{"a certificate without key", "resources: [{version: v1, resource: pods}]\napi: {tls: {certFile: /nonexistent/tls.crt}}\n",
			[]string{"api.tls: certFile and keyFile must be set together", "api.tls.certFile:"}},
		{"client certificates without TLS", "resources: [{version: v1, resource: pods}]\napi: {auth: {clientCAFile: /nonexistent/ca.crt}, tls: {enabled: false}}\n",
			[]string{"api.auth.clientCAFile: client certificates need api.tls.enabled", "api.auth.clientCAFile: stat /nonexistent/ca.crt"}},
		{"limits below their minimum", "resources: [{version: v1, resource: pods}]\napi: {limits: {maxURLLength: 100, maxWatchesPerUser: 0}}\n",
			[]string{"api.limits.maxURLLength: must be at least 1024", "api.limits.maxWatchesPerUser: must be at least 1"}},
		{"a rate limit that allows nothing", "resources: [{version: v1, resource: pods}]\napi: {limits: {maxAuthenticating: 0}}\nclient: {rateLimits: {reviews: {qps: 0}, leaderElection: {burst: 0}}}\n",
			[]string{"api.limits.maxAuthenticating: must be at least 1", "client.rateLimits.reviews.qps: must be above 0, got 0", "client.rateLimits.leaderElection.burst: must be at least 1, got 0"}},
		{"a webhook without url", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a}]\n",
			[]string{"webhooks[0].url: is required"}},
		{"a webhook with a bad url", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'ftp://x'}]\n",
			[]string{"webhooks[0].url: must be an http or https URL"}},
		{"duplicate webhook names", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x'}, {name: a, url: 'http://y'}]\n",
			[]string{"webhooks[1].name: duplicate of webhooks[0]"}},
		{"a webhook for a resource not watched", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', resources: [deployments.apps]}]\n",
			[]string{`webhooks[0].resources[0]: "deployments.apps" is not a watched resource`}},
		{"a bad CEL filter", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', filter: 'type ==='}]\n",
			[]string{"webhooks[0].filter:"}},
		{"an unknown diff", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', payload: {diff: strategicMerge}}]\n",
			[]string{`webhooks[0].payload.diff: must be none, jsonPatch or mergePatch, got "strategicMerge"`}},
		{"no object and no diff", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', payload: {object: none}}]\n",
			[]string{"webhooks[0].payload.object: is none, so MODIFIED events would carry nothing of the change"}},
		{"a CEL filter that is not a bool", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', filter: 'type + \"x\"'}]\n",
			[]string{"webhooks[0].filter: must evaluate to a bool"}},
		{"an unknown event type", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', eventTypes: [UPDATED]}]\n",
			[]string{"webhooks[0].eventTypes[0]: must be ADDED, MODIFIED or DELETED"}},
		{"a reserved header", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', headers: [{name: ce-id, value: x}]}]\n",
			[]string{"webhooks[0].headers[0].name: ce-id is set by dynwatch"}},
		{"a missing signing secret file", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', signingSecretFile: /nonexistent/secret}]\n",
			[]string{"webhooks[0].signingSecretFile:"}},
		{"TLS on an http url", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', tls: {insecureSkipVerify: true}}]\n",
			[]string{"webhooks[0].tls: is set, but url is not https"}},
		{"bad retry bounds", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', retry: {initialBackoff: 5s, maxBackoff: 1s}, workers: 1000}]\n",
			[]string{"webhooks[0].retry.maxBackoff: must be at least initialBackoff", "webhooks[0].workers: must be between 1 and 256"}},
		{"a dead-letter file in a missing directory", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x', deadLetter: {file: /nonexistent/dir/dl.jsonl}}]\n",
			[]string{"webhooks[0].deadLetter.file: directory /nonexistent/dir does not exist"}},
		{"a jetstream sink without servers, with a bad prefix and stream", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, subjectPrefix: 'dw.*', stream: 'a.b'}]\n",
			[]string{"jetstream[0].servers: is required", `jetstream[0].subjectPrefix: must be subject tokens`, `jetstream[0].stream: must be letters, digits, - and _, got "a.b"`}},
		{"a jetstream durability with too few replicas, too short a check, and monitoring URLs that are not HTTP or carry credentials", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['nats://127.0.0.1:4222'], durability: {minReplicas: -1, checkEvery: 10ms, monitorURLs: ['nats://x:8222', 'http://u:secretpw@x:8222']}}]\n",
			[]string{"jetstream[0].durability.minReplicas: must be at least 1, got -1", "jetstream[0].durability.checkEvery: must be at least 1s, got 10ms", `jetstream[0].durability.monitorURLs[0]: must be an http:// or https:// URL, got "nats://x:8222"`, "jetstream[0].durability.monitorURLs[1]: must not carry credentials"}},
		{"monitoring URLs on a kafka sink", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a, brokers: ['127.0.0.1:9092'], topic: t, durability: {monitorURLs: ['http://x:8222']}}]\n",
			[]string{"kafka[0].durability.monitorURLs: is for jetstream sinks only"}},
		{"a jetstream server that is not a NATS URL, or carries credentials", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['http://x:4222', 'nats://u:secretpw@x:4222']}]\n",
			[]string{`jetstream[0].servers[0]: must be a nats:// or tls:// URL, got "http://x:4222"`, "jetstream[0].servers[1]: must not carry credentials"}},
		{"jetstream credentials two ways, and a user without password", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['nats://127.0.0.1:4222'], credentialsFile: " + tokenFile + ", userFile: " + tokenFile + "}]\n",
			[]string{"jetstream[0]: credentialsFile, nkeyFile and userFile with passwordFile exclude each other", "jetstream[0]: userFile and passwordFile go together"}},
		{"a jetstream password over plain NATS to a remote server", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['nats://nats.example:4222'], userFile: " + tokenFile + ", passwordFile: " + tokenFile + "}]\n",
			[]string{"jetstream[0].servers: include a nats:// server other than loopback, without tls, and the sink has a password"}},
		{"a missing jetstream credentials file", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['tls://x:4222'], credentialsFile: /nonexistent/user.creds}]\n",
			[]string{"jetstream[0].credentialsFile: open /nonexistent/user.creds"}},
		{"a jetstream sink named as a webhook", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://x'}]\njetstream: [{name: a, servers: ['nats://127.0.0.1:4222'], workers: 0, retry: {initialBackoff: 5s, maxBackoff: 1s}}]\n",
			[]string{"jetstream[0].name: duplicate of webhooks[0] (a)", "jetstream[0].retry.maxBackoff: must be at least initialBackoff"}},
		{"a kafka sink without brokers or topic", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a}]\n",
			[]string{"kafka[0].brokers: is required", "kafka[0].topic: is required"}},
		{"a kafka broker that is not host:port, a bad topic and codec", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a, brokers: ['kafka:', 'kafka:99999', 'SASL_SSL://u:pw@kafka:9092'], topic: 'a/b', compression: brotli}]\n",
			[]string{`kafka[0].brokers[0]: must be host:port, got "kafka:"`, `kafka[0].brokers[1]: must be host:port`, `kafka[0].brokers[2]: must be host:port, got "[unparsable URL redacted]"`,
				`kafka[0].topic: must be 1 to 249 letters`, `kafka[0].compression: must be none, gzip, snappy, lz4 or zstd, got "brotli"`}},
		{"a kafka sink asking for fewer acks or no idempotence", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a, brokers: ['127.0.0.1:9092'], topic: t, acks: '1', idempotent: false}]\n",
			[]string{`kafka[0].acks: must be all, got "1"`, "kafka[0].idempotent: must be true"}},
		{"kafka SASL without a mechanism, an unknown one, a missing file", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a, brokers: ['127.0.0.1:9092'], topic: t, sasl: {userFile: " + tokenFile + ", passwordFile: " + tokenFile + "}}, {name: b, brokers: ['127.0.0.1:9092'], topic: t, sasl: {mechanism: GSSAPI, userFile: /nonexistent/user}}]\n",
			[]string{"kafka[0].sasl.mechanism: is required with userFile and passwordFile", `kafka[1].sasl.mechanism: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got "GSSAPI"`, "kafka[1].sasl.userFile: open /nonexistent/user"}},
		{"a kafka PLAIN password to a remote broker without TLS", "resources: [{version: v1, resource: pods}]\nkafka: [{name: a, brokers: ['kafka.example:9092'], topic: t, sasl: {mechanism: PLAIN, userFile: " + tokenFile + ", passwordFile: " + tokenFile + "}}]\n",
			[]string{"kafka[0].sasl.mechanism: is PLAIN, which sends the password as it is, to brokers other than loopback without tls"}},
		{"a kafka sink named as a jetstream sink", "resources: [{version: v1, resource: pods}]\njetstream: [{name: a, servers: ['nats://127.0.0.1:4222']}]\nkafka: [{name: a, brokers: ['127.0.0.1:9092'], topic: t}]\n",
			[]string{"kafka[0].name: duplicate of jetstream[0] (a)"}},
		{"a staleAfter below a second and a shutdownTimeout of 0", "resources: [{version: v1, resource: pods, staleAfter: 10ms}]\nshutdownTimeout: 0s\n",
			[]string{"resources[0].staleAfter: must be at least 1s", "shutdownTimeout: must be at least 1s"}},
		{"a consistency check every 10ms", "resources: [{version: v1, resource: pods}]\nconsistencyCheck: {period: 10ms}\n",
			[]string{"consistencyCheck.period: must be at least 1s"}},
		{"a state store bounded below a mebibyte", "resources: [{version: v1, resource: pods}]\nstate: {maxPendingBytes: 4096}\n",
			[]string{"state.maxPendingBytes: must be at least 1048576 (1 MiB), got 4096"}},
		{"leader election without a state store, a namespace, or a fencing margin", "resources: [{version: v1, resource: pods}]\nleaderElection: {enabled: true, leaseName: Bad_Name, leaseDuration: 5s, renewDeadline: 5s}\n",
			[]string{"leaderElection.enabled: needs state.path", "leaderElection.namespace: is required", "leaderElection.leaseName: a lowercase RFC 1123 subdomain",
				"leaderElection.leaseDuration: must be more than renewDeadline"}},
		{"a token over http to a remote host", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'http://receiver.example/x', bearerTokenFile: " + tokenFile + "}]\n",
			[]string{"webhooks[0].url: is plain http to a host other than loopback"}},
		{"a signing secret shorter than 24 bytes", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'https://x', signingSecretFile: " + shortSecretFile + "}]\n",
			[]string{"webhooks[0].signingSecretFile:", "16-byte key; Standard Webhooks requires at least 24"}},
		{"signing key files that are not Ed25519 keys", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'https://x', signingKeyFiles: [" + edFile + ", " + ecFile + ", " + tokenFile + "]}]\n",
			[]string{"webhooks[0].signingKeyFiles[1]: " + ecFile + " holds a *ecdsa.PrivateKey key; Standard Webhooks' v1a signatures need an Ed25519 key",
				"webhooks[0].signingKeyFiles[2]: " + tokenFile + " does not hold a PKCS#8 private key in PEM"}},
		{"a signing secret of a list shorter than 24 bytes", "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'https://x', signingSecretFiles: [" + shortSecretFile + "]}]\n",
			[]string{"webhooks[0].signingSecretFiles[0]:", "16-byte key"}},
		{"a whole group without a group", "resources: [{version: v1, resource: pods}, {version: v1, resource: '*'}]\n",
			[]string{`resources[1].resource: "*" watches a whole API group and needs group`}},
		{"a wildcard kind", "resources: [{group: example.com, version: v1, kind: '*'}]\n",
			[]string{`resources[0].kind: "*" is not a Kind: watch a whole API group with resource: "*"`}},
		{"the preferred version of a single resource", "resources: [{group: example.com, version: '*', resource: widgets}]\n",
			[]string{`resources[0].version: "*" (the preferred version of each resource) is only for a whole API group`}},
		{"excluded resources of a single resource", "resources: [{group: example.com, version: v1, resource: widgets, excludeResources: [gadgets]}]\n",
			[]string{`resources[0].excludeResources: only applies to a whole API group (resource: "*")`}},
		{"bad excluded resources", "resources: [{group: example.com, version: '*', resource: '*', excludeResources: [Widgets, gadgets, gadgets, 'widgets/status', '*']}]\n",
			[]string{"resources[0].excludeResources[0]: must be a resource's plural name", `resources[0].excludeResources[2]: duplicate "gadgets"`,
				"resources[0].excludeResources[3]: must be a resource's plural name", `resources[0].excludeResources[4]: "*" excludes every resource`}},
		{"a group watched whole twice", "resources: [{group: example.com, version: '*', resource: '*'}, {group: example.com, version: v1, resource: '*'}]\n",
			[]string{`resources[1].group: "example.com" is already watched whole by resources[0]`}},
		{"several problems at once", "resources: [{version: v1, resource: pods, labelSelector: '=x', indexers: [{name: b, type: jsonPath, path: '{['}]}, {kind: lower}]\n",
			[]string{"resources[0].labelSelector:", "resources[0].indexers[0].path:", "resources[1].version: is required", "resources[1].kind: must be a Kind"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tt.yaml))
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not mention %q:\n%v", want, err)
				}
			}
		})
	}
}

func TestCredentialsOverHTTPNeedAnExplicitOptIn(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t0ken"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, url, extra string }{
		{"to loopback", "http://127.0.0.1:8080/x", ""},
		{"to localhost", "http://localhost:8080/x", ""},
		{"with allowCredentialsOverHTTP", "http://receiver.example/x", ", allowCredentialsOverHTTP: true"},
		{"over https", "https://receiver.example/x", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			yaml := "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: '" + tt.url + "', bearerTokenFile: " + token + tt.extra + "}]\n"
			if _, err := Load(writeConfig(t, yaml)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestURLsAreRedactedInErrors(t *testing.T) {
	_, err := Load(writeConfig(t, "resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'ftp://user:hunter2@x/?token=s3cret'}]\n"))
	if err == nil || !strings.Contains(err.Error(), "webhooks[0].url") {
		t.Fatalf("Load = %v, want an error naming webhooks[0].url", err)
	}
	for _, leak := range []string{"hunter2", "s3cret"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("the error repeats %q: %v", leak, err)
		}
	}
	if got := RedactURL("https://u:p@host/path?a=1&b=2"); got != "https://redacted@host/path?a=redacted&b=redacted" {
		t.Errorf("RedactURL = %s", got)
	}
}

func TestLoadRequiresAPath(t *testing.T) {
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("Load(\"\") = %v, want an error naming --config", err)
	}
}

func TestFieldPathRemovesWhatItSelects(t *testing.T) {
	tests := []struct {
		name, path, in, want string
	}{
		{"a dot path", "data.password", `{"data":{"password":"x","user":"u"}}`, `{"data":{"user":"u"}}`},
		{"an escaped dot in a key", `metadata.annotations.example\.com/secret`,
			`{"metadata":{"annotations":{"example.com/secret":"s","keep":"k"}}}`, `{"metadata":{"annotations":{"keep":"k"}}}`},
		{"a JSONPath over every list item", "{.spec.containers[*].env}",
			`{"spec":{"containers":[{"name":"a","env":[1]},{"name":"b","env":[2]}]}}`, `{"spec":{"containers":[{"name":"a"},{"name":"b"}]}}`},
		{"one list item", "{.spec.containers[1].env}",
			`{"spec":{"containers":[{"env":[1]},{"env":[2]}]}}`, `{"spec":{"containers":[{"env":[1]},{}]}}`},
		{"every field of a map", "{.data.*}", `{"data":{"a":"1","b":"2"},"kind":"K"}`, `{"data":{},"kind":"K"}`},
		{"a missing field", "status.secret", `{"spec":{}}`, `{"spec":{}}`},
		{"a path through a scalar", "spec.x.y", `{"spec":{"x":"scalar"}}`, `{"spec":{"x":"scalar"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseFieldPath(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			var obj map[string]any
			if err := json.Unmarshal([]byte(tt.in), &obj); err != nil {
				t.Fatal(err)
			}
			p.Remove(obj)
			got, _ := json.Marshal(obj)
			if string(got) != tt.want {
				t.Errorf("after removing %s: %s, want %s", tt.path, got, tt.want)
			}
		})
	}
}

func TestJSONPathYieldsEveryScalar(t *testing.T) {
	jp, err := ParseJSONPath("{.spec.containers[*].image}")
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{"spec": map[string]any{"containers": []any{
		map[string]any{"image": "nginx:1"}, map[string]any{"image": "redis:7"}, map[string]any{"name": "no-image"},
	}}}
	got, err := jp.Values(obj)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "nginx:1,redis:7" {
		t.Fatalf("values = %v, want [nginx:1 redis:7]", got)
	}
	if got, _ := jp.Values(map[string]any{}); len(got) != 0 {
		t.Fatalf("values of an object without the path = %v, want none", got)
	}
}

func TestDotPathIsTheFieldSelectorASimpleJSONPathNames(t *testing.T) {
	for _, tt := range []struct {
		path, want string
		ok         bool
	}{
		{"{.spec.nodeName}", "spec.nodeName", true},
		{".spec.nodeName", "spec.nodeName", true},
		{"spec.nodeName", "spec.nodeName", true},
		{" {.status.phase} ", "status.phase", true},
		{"{.spec.containers[*].image}", "", false},
		{"{.spec.containers[0].image}", "", false},
		{"{..image}", "", false},
		{"{.metadata.labels['app']}", "", false},
		{"{.a}{.b}", "", false},
		{"", "", false},
	} {
		got, ok := DotPath(tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("DotPath(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}

func TestWebhookSecretsAreReadAndNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(writeConfig(t, fmt.Sprintf("resources: [{version: v1, resource: pods}]\nwebhooks: [{name: a, url: 'https://x', signingSecretFile: %s, bearerTokenFile: %s}]\n", secret, token)))
	if err != nil {
		t.Fatal(err)
	}
	w := c.Webhooks[0]
	if string(w.BearerToken) != "tok-123" || len(w.SigningSecrets) != 1 {
		t.Fatalf("token %q, %d signing secrets", string(w.BearerToken), len(w.SigningSecrets))
	}
	if w.Timeout != DefaultWebhookTimeout || w.Workers != DefaultWebhookWorkers || w.Retry.MaxElapsed != DefaultMaxElapsed {
		t.Errorf("defaults not applied: %+v", w)
	}
	for _, s := range []string{fmt.Sprint(w.BearerToken), fmt.Sprintf("%v %+v %#v", w, w, w)} {
		if strings.Contains(s, "tok-123") {
			t.Fatalf("the token is printed: %s", s)
		}
	}
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "tok-123") {
		t.Fatalf("the token is in JSON: %s", b)
	}
}

// TestDocsShowTheFullExample keeps the full example in docs/configuration.md identical to
// testdata/full.yaml, which TestLoadParsesTheFullExample loads.
func TestDocsShowTheFullExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```yaml\n"+string(full)+"```") {
		t.Fatal("docs/configuration.md's full example differs from config/testdata/full.yaml: copy the file, byte for byte, into the yaml block under \"Every setting\" in docs/configuration.md")
	}
}

func TestExcludeNamespacesLeavesNamesToTheAPIServerAndGlobsToDynwatch(t *testing.T) {
	c, err := Load(writeConfig(t, "resources: [{version: v1, resource: pods, fieldSelector: 'spec.nodeName=n1', excludeNamespaces: [kube-system, 'team-*', 'ci-?']}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Resources[0]
	if got, want := r.Exclusions().String(), "spec.nodeName=n1,metadata.namespace!=kube-system"; got != want {
		t.Errorf("field selector %q, want %q", got, want)
	}
	for ns, want := range map[string]bool{"team-a": true, "ci-1": true, "ci-10": false, "kube-system": false, "default": false} {
		if got := r.Excludes(ns); got != want {
			t.Errorf("Excludes(%q) = %v, want %v (names are the apiserver's to leave out)", ns, got, want)
		}
	}
}

func TestAWholeGroupIsOneEntryWhoseMembersShareItsSettings(t *testing.T) {
	c, err := Load(writeConfig(t, `
resources:
  - {group: example.com, version: "*", resource: "*", excludeResources: [secrets], namespaces: [a], labelSelector: app=web, staleAfter: 5s}
  - {group: example.com, version: v1, resource: widgets}
webhooks: [{name: a, url: "http://127.0.0.1:1", resources: [gadgets.example.com]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	whole := &c.Resources[0]
	if !whole.IsWildcard() || whole.String() != "*.*.example.com" || c.Resources[1].IsWildcard() {
		t.Fatalf("entries %s (wildcard %t) and %s (wildcard %t); want only the first a whole group", whole, whole.IsWildcard(), &c.Resources[1], c.Resources[1].IsWildcard())
	}
	m := whole.Member("v1beta1", "gadgets")
	if m.String() != "gadgets.v1beta1.example.com" || m.IsWildcard() || len(m.ExcludeResources) != 0 {
		t.Errorf("member = %s with excludeResources %v; want gadgets.v1beta1.example.com, a resource of its own", m, m.ExcludeResources)
	}
	if m.Labels.String() != "app=web" || m.StaleAfter != 5*time.Second || m.Namespaces[0] != "a" || m.Source != whole.Source {
		t.Errorf("member settings %+v; want the entry's", m)
	}
	if whole.Version != "*" || whole.Resource != "*" {
		t.Errorf("Member changed the entry: %s", whole)
	}
}

// TestTurningInitialStateOnOrOffLeavesAWebhookTheSame: initialState matters only when a sink
// is first seen, so a reload that changes nothing else restarts nothing; any other change
// still does.
func TestTurningInitialStateOnOrOffLeavesAWebhookTheSame(t *testing.T) {
	load := func(extra string) *Webhook {
		t.Helper()
		c, err := Load(writeConfig(t, "resources: [{version: v1, resource: configmaps}]\nwebhooks: [{name: a, url: 'http://127.0.0.1:1/'"+extra+"}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		return &c.Webhooks[0]
	}
	off, on := load(""), load(", initialState: true")
	if off.InitialState || !on.InitialState {
		t.Fatalf("initialState parsed as %v and %v; want false and true", off.InitialState, on.InitialState)
	}
	if !off.Same(on) {
		t.Errorf("turning initialState on makes another sink: %s vs %s", off.Source, on.Source)
	}
	if other := load(", initialState: true, workers: 2"); on.Same(other) {
		t.Errorf("a change of workers beside initialState is not seen: %s", other.Source)
	}
}

func TestASinkDeclaredOutsideTheFileMayNotNameFiles(t *testing.T) {
	cfg := &Config{Resources: []Resource{{Version: "v1", Resource: "configmaps"}}}
	for _, s := range []SinkConfig{
		&Webhook{URL: "http://r/", BearerTokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token"},
		&Webhook{URL: "http://r/", SigningKeyFiles: []string{"/etc/dynwatch/key.pem"}},
		&Webhook{URL: "http://r/", TLS: TLS{CAFile: "/etc/ssl/ca.pem"}},
		&Webhook{URL: "http://r/", Sink: Sink{DeadLetter: DeadLetter{File: "/tmp/dead"}}},
		&JetStream{Servers: []string{"nats://n:4222"}, CredentialsFile: "/etc/nats/creds"},
		&JetStream{Servers: []string{"nats://n:4222"}, TLS: TLS{CertFile: "/etc/nats/tls.crt", KeyFile: "/etc/nats/tls.key"}},
		&Kafka{Brokers: []string{"k:9092"}, Topic: "t", SASL: SASL{Mechanism: "PLAIN", UserFile: "/etc/kafka/user", PasswordFile: "/etc/kafka/password"}},
		&Kafka{Brokers: []string{"k:9092"}, Topic: "t", TLS: KafkaTLS{Enabled: true, TLS: TLS{CAFile: "/etc/ssl/ca.pem"}}},
	} {
		if err := cfg.CheckSink(s, "spec"); err == nil {
			t.Errorf("a %s sink naming a file was accepted: %+v", s.key(), s)
		}
	}
	shared := Sink{Name: "subscription.a.b", Resources: []string{"configmaps"}}
	for _, s := range []SinkConfig{
		&Webhook{URL: "http://r/", Sink: shared},
		&JetStream{Servers: []string{"nats://n:4222"}, Sink: shared},
		&Kafka{Brokers: []string{"k:9092"}, Topic: "t", TLS: KafkaTLS{Enabled: true}, Sink: shared},
	} {
		if err := cfg.CheckSink(s, "spec"); err != nil {
			t.Errorf("a %s sink naming no file, with a subscription's name: %v", s.key(), err)
		}
	}
}
