package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of what a hostile operator, a leaky log or a slow shutdown could cost.

func TestDeadLettersAndLogsCarryNoBodiesOrCredentials(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rejecting := newReceiver(t, func(int) int { return http.StatusBadRequest }, false)
	u, _ := url.Parse(rejecting.URL)
	withCredentials := "http://user:hunter2@" + u.Host + "/hook?token=tok-SECRET-1"
	dir := t.TempDir()
	plain, bodies := filepath.Join(dir, "plain.jsonl"), filepath.Join(dir, "bodies.jsonl")
	configPath := filepath.Join(dir, "config.yaml")
	webhooks := fmt.Sprintf(`webhooks:
  - {name: plain, url: "%s", deadLetter: {file: %s}}
  - {name: bodies, url: %s, deadLetter: {file: %s, includeObject: true}}`, withCredentials, plain, rejecting.URL, bodies)
	writeFile(t, configPath, plainConfig(ns, webhooks))
	p := startProcess(t, configPath)
	_, create := configMaps(ns)
	if err := create(t.Context(), "cm", "payload-ABC"); err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		var line string
		testbed.Eventually(t, 20*time.Second, func() error {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if len(b) == 0 {
				return fmt.Errorf("no dead letter in %s yet", filepath.Base(path))
			}
			line = string(b)
			return nil
		})
		return line
	}
	var rec struct {
		ID, Reason, Type string
		Object           struct{ Resource, Namespace, Name, UID, ResourceVersion string }
	}
	line := read(plain)
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID == "" || rec.Reason != "rejected" || rec.Type != "ADDED" || rec.Object.Name != "cm" || rec.Object.Namespace != ns || rec.Object.UID == "" || rec.Object.Resource != "configmaps.v1" {
		t.Errorf("dead letter %s; want id, type, reason and the object's reference", line)
	}
	if !strings.Contains(read(bodies), "payload-ABC") {
		t.Errorf("a sink with deadLetter.includeObject wrote no object body")
	}
	// A broken edit naming the URL: the rejection in /status must not repeat its credentials.
	writeFile(t, configPath, plainConfig(ns, webhooks+"\n  - {name: broken, url: \"ftp://user:hunter2@example.invalid/?token=tok-SECRET-1\"}"))
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var status string
	testbed.Eventually(t, 10*time.Second, func() error {
		st, err := p.Status(t.Context())
		if err != nil {
			return err
		}
		if st.Reload.Error == "" {
			return fmt.Errorf("no rejected reload in /status yet")
		}
		status = st.Reload.Error
		return nil
	})
	if !strings.Contains(status, "webhooks[2].url") {
		t.Errorf("the rejection does not name webhooks[2].url: %s", status)
	}
	for _, leak := range []string{"hunter2", "tok-SECRET-1", "payload-ABC"} {
		for where, text := range map[string]string{"the plain dead letter": line, "/status": status, "the log": p.Log()} {
			if strings.Contains(text, leak) {
				t.Errorf("%s contains %q", where, leak)
			}
		}
	}
}

func TestCredentialsOverPlainHTTPAndShortSigningSecretsAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	token, short := filepath.Join(dir, "token"), filepath.Join(dir, "short")
	writeFile(t, token, "t0ken")
	writeFile(t, short, "whsec_"+"MDEyMzQ1Njc4OWFiY2RlZg==") // 16 bytes
	path := filepath.Join(dir, "config.yaml")
	// Should dynwatch start anyway, nothing selects an event: no request leaves loopback.
	writeFile(t, path, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [no-such-namespace]}]
webhooks:
  - {name: remote, url: "http://192.0.2.10/hook", bearerTokenFile: %s, namespaces: [no-such-namespace]}
  - {name: weak, url: "http://127.0.0.1:1/hook", signingSecretFile: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, token, short))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, dynwatchBinary(t), "--config", path, "--kubeconfig", cluster.Kubeconfig).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 || ctx.Err() != nil {
		t.Fatalf("err=%v, want a non-zero exit at load; output:\n%.2000s", err, out)
	}
	for _, want := range []string{"webhooks[0].url:", "webhooks[1].signingSecretFile:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %s:\n%s", want, out)
		}
	}
}

func TestRetryAfterZeroIsNotABusyLoop(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rc := newJudge(t, func(_ received, _ int, h http.Header) int {
		h.Set("Retry-After", "0")
		return http.StatusServiceUnavailable
	})
	startWithWebhooks(t, plainResources(ns)+fmt.Sprintf("webhooks: [{name: r, url: %s, retry: {initialBackoff: 500ms, maxBackoff: 1s, maxElapsed: 1h}}]", rc.URL))
	_, create := configMaps(ns)
	if err := create(t.Context(), "cm", "1"); err != nil {
		t.Fatal(err)
	}
	first := rc.waitFor(t, 1, 20*time.Second)[0].at
	window := time.NewTimer(2 * time.Second) // a measurement window, not a wait for a condition
	<-window.C
	n := 0
	for _, r := range rc.got() {
		if r.at.Sub(first) < 2*time.Second {
			n++
		}
	}
	if n > 6 {
		t.Errorf("%d requests in 2 s for one event answered Retry-After: 0; initialBackoff 500ms allows at most 5", n)
	}
}

func plainResources(ns string) string {
	return fmt.Sprintf("resources: [{version: v1, resource: configmaps, namespaces: [%s]}]\n", ns)
}

func TestARetryDeadlineSurvivesAReload(t *testing.T) {
	ns := namespace(t)
	rc := newReceiver(t, func(int) int { return http.StatusServiceUnavailable }, false)
	dir := t.TempDir()
	deadLetters, configPath := filepath.Join(dir, "dead.jsonl"), filepath.Join(dir, "config.yaml")
	sink := func(header string) string {
		return fmt.Sprintf("webhooks: [{name: r, url: %s, headers: [{name: X-Try, value: %s}], retry: {initialBackoff: 200ms, maxBackoff: 500ms, maxElapsed: 4s}, deadLetter: {file: %s}}]", rc.URL, header, deadLetters)
	}
	writeFile(t, configPath, plainConfig(ns, sink("one")))
	p := startProcess(t, configPath)
	_, create := configMaps(ns)
	if err := create(t.Context(), "cm", "1"); err != nil {
		t.Fatal(err)
	}
	first := rc.waitFor(t, 1, 20*time.Second)[0].at
	testbed.Eventually(t, 10*time.Second, func() error {
		if time.Since(first) < 2*time.Second {
			return fmt.Errorf("retrying for %s", time.Since(first))
		}
		return nil
	})
	writeFile(t, configPath, plainConfig(ns, sink("two")))
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var rec struct{ Time time.Time }
	testbed.Eventually(t, 20*time.Second, func() error {
		b, err := os.ReadFile(deadLetters)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, &rec)
	})
	if took := rec.Time.Sub(first); took > 5*time.Second {
		t.Errorf("dead-lettered %s after the first attempt with maxElapsed 4s: the reload at 2s reset the budget", took.Round(100*time.Millisecond))
	}
}

func TestShutdownFinishesWithinShutdownTimeout(t *testing.T) {
	t.Run("without a store, slow dead-letter posts are cut short", func(t *testing.T) {
		ns := namespace(t)
		hanging, deadSink := newReceiver(t, nil, true), newReceiver(t, nil, true)
		p, metrics := startWithWebhooks(t, plainResources(ns)+fmt.Sprintf("shutdownTimeout: 2s\nwebhooks: [{name: r, url: %s, workers: 1, deadLetter: {url: %s}}]", hanging.URL, deadSink.URL))
		if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 20, testbed.NumberedConfigMap(ns, "cm-%02d")); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 20*time.Second, func() error {
			if v := metricValue(t, metrics, `dynwatch_webhook_queue_length{sink="r"}`); v != 20 {
				return fmt.Errorf("queue length %v, want 20", v)
			}
			return nil
		})
		begin := time.Now()
		if err := p.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took > 4*time.Second {
			t.Errorf("shutdown took %s with shutdownTimeout 2s", took.Round(100*time.Millisecond))
		}
	})
	t.Run("with a store, what was cut short is dead-lettered after the restart", func(t *testing.T) {
		rejecting, slow := newReceiver(t, func(int) int { return http.StatusBadRequest }, false), newReceiver(t, nil, true)
		var mu sync.Mutex
		posted := map[string]bool{}
		fast := newJudge(t, func(r received, _ int, _ http.Header) int {
			var rec struct{ ID string }
			_ = json.Unmarshal(r.body, &rec)
			mu.Lock()
			posted[rec.ID] = true
			mu.Unlock()
			return http.StatusOK
		})
		webhooks := func(deadLetterURL string) func(string) string {
			return func(string) string {
				return fmt.Sprintf("shutdownTimeout: 2s\nwebhooks: [{name: r, url: %s, deadLetter: {url: %s}}]", rejecting.URL, deadLetterURL)
			}
		}
		f := newStoreFixture(t, webhooks(slow.URL))
		p := startProcess(t, f.config)
		if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 5, testbed.NumberedConfigMap(f.ns, "cm-%02d")); err != nil {
			t.Fatal(err)
		}
		rejecting.waitFor(t, 5, 20*time.Second)
		slow.waitFor(t, 1, 20*time.Second)
		begin := time.Now()
		if err := p.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took > 4*time.Second {
			t.Errorf("shutdown took %s with shutdownTimeout 2s", took.Round(100*time.Millisecond))
		}
		writeFile(t, f.config, plainConfig(f.ns, webhooks(fast.URL)("")+"\nstate: {path: "+f.state+"}"))
		startProcess(t, f.config)
		testbed.Eventually(t, 30*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			for id := range idSet(rejecting.got()) {
				if !posted[id] {
					return fmt.Errorf("dead letter of %s not posted after the restart", id)
				}
			}
			return nil
		})
	})
}

// tcpProxy stands between dynwatch and the apiserver, so a test can cut the network.
type tcpProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.down.Load() {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

// cut closes every connection through the proxy.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func TestAResourceThatCannotBeListedBecomesStale(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	user := "stale-" + ns
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	grantConfigMapReads(t, nil, ns, user)
	grantClusterID(t, user)
	target, _ := url.Parse(cluster.URL())
	proxy := startProxy(t, target.Host)
	kubeconfig, err := cluster.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + proxy.ln.Addr().String()
	}
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	p := start(t, kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s], staleAfter: 2s}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, metrics, _ := p.WaitListening(t.Context())
	stale := func(reason string) {
		t.Helper()
		testbed.Eventually(t, 60*time.Second, func() error {
			code, body, err := get(t.Context(), metrics+"/readyz")
			if err != nil {
				return err
			}
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "configmaps.v1: Stale") {
				return fmt.Errorf("/readyz = %d %q; want 503 naming configmaps.v1 Stale", code, body)
			}
			return nil
		})
		st, err := p.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if r := st.Resources[0]; r.State != "Stale" || !strings.Contains(strings.ToLower(r.Reason), reason) {
			t.Errorf("/status resource = %+v; want Stale with a reason saying %q", r, reason)
		}
		if v := metricValue(t, metrics, `dynwatch_informer_stale{resource="configmaps.v1"}`); v != 1 {
			t.Errorf("dynwatch_informer_stale = %v, want 1", v)
		}
		resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if w := resp.Header.Get("Warning"); resp.StatusCode != http.StatusOK || !strings.Contains(w, "stale") {
			t.Errorf("a query while stale = %d, Warning %q; want 200 with a Warning that the data is stale", resp.StatusCode, w)
		}
	}
	fresh := func() {
		t.Helper()
		testbed.Eventually(t, 90*time.Second, func() error {
			code, body, err := get(t.Context(), metrics+"/readyz")
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("/readyz = %d %q; want 200 once the apiserver answers again", code, body)
			}
			return nil
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		proxy.down.Store(true)
		proxy.cut()
		stale("failed")
		proxy.down.Store(false)
		fresh()
	})
	t.Run("forbidden", func(t *testing.T) {
		if err := cs.RbacV1().RoleBindings(ns).Delete(t.Context(), "dynwatch", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		proxy.cut() // a watch outlives the access that started it; a new list does not
		stale("forbidden")
		grantConfigMapReads(t, nil, ns, user)
		fresh()
	})
}

func TestRotatedSecretFilesAreUsedWithoutRestart(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	dir := t.TempDir()
	secret1, _ := signingSecret(t)
	secret2, _ := signingSecret(t)
	if err := kubeletSwap(dir, "1", map[string][]byte{"token": []byte("token-one"), "signing": []byte(secret1)}); err != nil {
		t.Fatal(err)
	}
	type creds struct {
		token    string
		verifier *standardwebhooks.Webhook
	}
	verifier := func(s string) *standardwebhooks.Webhook {
		v, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var current atomic.Pointer[creds]
	current.Store(&creds{"Bearer token-one", verifier(secret1)})
	rc := newJudge(t, func(r received, _ int, _ http.Header) int {
		c := current.Load()
		if r.header.Get("Authorization") != c.token {
			return http.StatusUnauthorized
		}
		if c.verifier.Verify(r.body, r.header) != nil {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	deadLetters := filepath.Join(t.TempDir(), "dead.jsonl")
	startWithWebhooks(t, plainResources(ns)+fmt.Sprintf("webhooks: [{name: r, url: %s, bearerTokenFile: %s, signingSecretFile: %s, deadLetter: {file: %s}}]",
		rc.URL, filepath.Join(dir, "token"), filepath.Join(dir, "signing"), deadLetters))
	_, create := configMaps(ns)
	delivered := func(name string) {
		t.Helper()
		testbed.Eventually(t, 20*time.Second, func() error {
			for _, r := range rc.got() {
				if r.name() == name && r.code == http.StatusOK {
					return nil
				}
			}
			return fmt.Errorf("%s not delivered with the current credentials", name)
		})
	}
	if err := create(t.Context(), "before", "1"); err != nil {
		t.Fatal(err)
	}
	delivered("before")
	current.Store(&creds{"Bearer token-two", verifier(secret2)})
	if err := kubeletSwap(dir, "2", map[string][]byte{"token": []byte("token-two"), "signing": []byte(secret2)}); err != nil {
		t.Fatal(err)
	}
	if err := create(t.Context(), "after", "1"); err != nil {
		t.Fatal(err)
	}
	delivered("after")
	if b, _ := os.ReadFile(deadLetters); len(b) > 0 {
		t.Errorf("dead letters after the rotation: %.300s", b)
	}
}
