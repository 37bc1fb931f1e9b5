package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// writeSigningKey writes a new Ed25519 private key to path as PKCS#8 PEM, as openssl genpkey
// -algorithm ed25519 writes one.
func writeSigningKey(t *testing.T, path string) {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
}

// publishedKeys are the public keys GET /signing-keys names for the webhook r.
func publishedKeys(t *testing.T, api string) []ed25519.PublicKey {
	t.Helper()
	code, body, err := get(t.Context(), api+"/signing-keys")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /signing-keys: %d %v", code, err)
	}
	var published struct {
		Webhooks []struct {
			Name string
			Keys []struct{ PublicKey string }
		}
	}
	if err := json.Unmarshal([]byte(body), &published); err != nil {
		t.Fatal(err)
	}
	var out []ed25519.PublicKey
	for _, w := range published.Webhooks {
		for _, k := range w.Keys {
			b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(k.PublicKey, "whpk_"))
			if err != nil || len(b) != ed25519.PublicKeySize {
				t.Fatalf("a published key %q", k.PublicKey)
			}
			out = append(out, b)
		}
	}
	return out
}

// signedBy reports whether one of the v1a signatures of the request r verifies with pub.
func signedBy(r received, pub ed25519.PublicKey) bool {
	h := r.header
	msg := fmt.Appendf(nil, "%s.%s.%s", h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), r.body)
	for _, s := range strings.Fields(h.Get("Webhook-Signature")) {
		if sig, ok := strings.CutPrefix(s, "v1a,"); ok {
			if b, err := base64.StdEncoding.DecodeString(sig); err == nil && ed25519.Verify(pub, msg, b) {
				return true
			}
		}
	}
	return false
}

// TestAReceiverWithOnlyThePublicKeyVerifiesEveryEventThroughAKeyRotation: a receiver that
// holds no secret, only the public keys dynwatch publishes at /signing-keys, verifies every
// request (v1a, Ed25519) while the key is rotated under a stream of changes: the new key is
// added beside the old (both sign), the receiver trusts the new one alone once it has seen it,
// and the old key is removed. No request fails verification.
func TestAReceiverWithOnlyThePublicKeyVerifiesEveryEventThroughAKeyRotation(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	dir := t.TempDir()
	keyA, keyB := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
	writeSigningKey(t, keyA)
	writeSigningKey(t, keyB)
	var trusted atomic.Pointer[[]ed25519.PublicKey]
	trusted.Store(&[]ed25519.PublicKey{})
	var failed, newSigned atomic.Int64
	var newKey atomic.Pointer[ed25519.PublicKey]
	rc := newJudge(t, func(r received, _ int, _ http.Header) int {
		if k := newKey.Load(); k != nil && signedBy(r, *k) {
			newSigned.Add(1)
		}
		for _, pub := range *trusted.Load() {
			if signedBy(r, pub) {
				return http.StatusOK
			}
		}
		failed.Add(1)
		return http.StatusUnauthorized
	})
	config := filepath.Join(dir, "config.yaml")
	write := func(keys ...string) {
		writeFile(t, config, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s, workers: 1, signingKeyFiles: [%s], retry: {initialBackoff: 10ms, maxBackoff: 100ms}}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL, strings.Join(keys, ", ")))
	}
	write(keyA)
	p := startProcess(t, config)
	api, _, _ := p.WaitListening(t.Context())
	first := publishedKeys(t, api)
	if len(first) != 1 {
		t.Fatalf("/signing-keys publishes %d keys, want 1", len(first))
	}
	trusted.Store(&first)

	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	stop := make(chan struct{})
	var churn sync.WaitGroup
	var writes atomic.Int64
	churn.Go(func() {
		cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "rotating"}}, metav1.CreateOptions{})
		for i := 0; err == nil; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			cm.Data = map[string]string{"i": fmt.Sprint(i)}
			cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
			writes.Add(1)
		}
		t.Errorf("churn: %v", err)
	})
	defer func() { close(stop); churn.Wait() }()
	arrived := func(n int) {
		t.Helper()
		from := len(rc.got())
		testbed.Eventually(t, time.Minute, func() error {
			if got := len(rc.got()) - from; got < n {
				return fmt.Errorf("%d requests since, want %d", got, n)
			}
			return nil
		})
	}
	arrived(10)

	// The new key signs beside the old one: the receiver still trusts the old one alone.
	write(keyA, keyB)
	var both []ed25519.PublicKey
	testbed.Eventually(t, time.Minute, func() error {
		if both = publishedKeys(t, api); len(both) != 2 {
			return fmt.Errorf("/signing-keys publishes %d keys, want 2", len(both))
		}
		return nil
	})
	next := both[1]
	if next.Equal(first[0]) {
		next = both[0]
	}
	newKey.Store(&next)
	testbed.Eventually(t, time.Minute, func() error {
		if newSigned.Load() == 0 {
			return errors.New("no request signed with the new key yet")
		}
		return nil
	})
	// Every later request is signed with the new key too (one worker): trust it alone, then
	// take the old key away.
	trusted.Store(&[]ed25519.PublicKey{next})
	arrived(10)
	write(keyB)
	testbed.Eventually(t, time.Minute, func() error {
		if keys := publishedKeys(t, api); len(keys) != 1 || !keys[0].Equal(next) {
			return fmt.Errorf("/signing-keys publishes %d keys, want the new one alone", len(keys))
		}
		return nil
	})
	arrived(10)
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed verification with the keys the receiver trusted", n, len(rc.got()))
	}
	t.Logf("%d requests verified, %d writes", len(rc.got()), writes.Load())
}

// TestAReceiverThatAnswersGoneIsSentNothingMoreUntilItsConfigurationChanges: a receiver that
// answers 410 Gone asks the sender to stop, as Standard Webhooks says. It receives that one
// request and nothing more: its events are dead-lettered with reason gone, /status and
// dynwatch_webhook_disabled say the sink is disabled; a changed configuration sends again.
func TestAReceiverThatAnswersGoneIsSentNothingMoreUntilItsConfigurationChanges(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	dir := t.TempDir()
	var gone atomic.Bool
	gone.Store(true)
	rc := newJudge(t, func(received, int, http.Header) int {
		if gone.Load() {
			return http.StatusGone
		}
		return http.StatusOK
	})
	config, dead := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "dead.jsonl")
	write := func(timeout string) {
		writeFile(t, config, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s, workers: 1, timeout: %s, deadLetter: {file: %s}}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL, timeout, dead))
	}
	write("5s")
	p := startProcess(t, config)
	api, metrics, _ := p.WaitListening(t.Context())
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	for i := range 5 {
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf(`"name":"c-%d"`, i))
	}
	lines := strings.Split(strings.TrimSpace(waitDeadLetters(t, dead, time.Minute, want...)), "\n")
	for _, l := range lines {
		if !strings.Contains(l, `"reason":"gone"`) {
			t.Errorf("a dead letter not for reason gone: %s", l)
		}
	}
	if n := len(rc.got()); n != 1 {
		t.Fatalf("the receiver got %d requests, want the one it answered 410", n)
	}
	if v := metricValue(t, metrics, `dynwatch_webhook_disabled{sink="r"}`); v != 1 {
		t.Errorf("dynwatch_webhook_disabled is %v, want 1", v)
	}
	code, body, err := get(t.Context(), api+"/status")
	if err != nil || code != http.StatusOK || !strings.Contains(body, `"disabled":{"reason":"POST `+rc.URL+`: 410 Gone"`) {
		t.Fatalf("/status (%d, %v) does not say the sink is disabled: %s", code, err, body)
	}

	// A changed configuration sends again.
	gone.Store(false)
	write("6s")
	testbed.Eventually(t, time.Minute, func() error {
		if v := metricValue(t, metrics, `dynwatch_webhook_disabled{sink="r"}`); v != 0 {
			return fmt.Errorf("dynwatch_webhook_disabled is %v", v)
		}
		return nil
	})
	if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, time.Minute, func() error {
		for _, r := range rc.got() {
			if r.subject == ns+"/after" && r.code == http.StatusOK {
				return nil
			}
		}
		return errors.New("the event after the reload has not arrived")
	})
}
