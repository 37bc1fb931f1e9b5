package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// received is one request a receiver got, as a consumer would see it.
type received struct {
	header  http.Header
	body    []byte
	ceID    string
	ceType  string
	subject string
	source  string
	payload struct {
		Type      string            `json:"type"`
		Resource  map[string]string `json:"resource"`
		Object    map[string]any    `json:"object"`
		OldObject map[string]any    `json:"oldObject"`
	}
	parseErr error
	at       time.Time // arrival
	code     int       // the answer
}

func (r received) name() string {
	return r.payload.Object["metadata"].(map[string]any)["name"].(string)
}

func (r received) data(key string, old bool) string {
	obj := r.payload.Object
	if old {
		obj = r.payload.OldObject
	}
	v, _, _ := unstructured.NestedString(obj, "data", key)
	return v
}

// receiver is a real HTTP server on 127.0.0.1 that records requests. answer chooses the
// status for the n-th request (from 1) of an event id; hang makes it block until the test ends.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	requests []received
	perID    map[string]int
	answer   func(n int) int
	judge    func(r received, n int, h http.Header) int // when set, answers instead of answer
	hang     chan struct{}
}

// newJudge starts a receiver whose answer to each request is judge's, given the request and
// how many times its event id has been received (from 1); it may set response headers in h, and
// may take its time.
func newJudge(t *testing.T, judge func(r received, n int, h http.Header) int) *receiver {
	rc := newReceiver(t, nil, false)
	rc.judge = judge
	return rc
}

// newDiscard is a receiver that reads each request and answers 200, keeping and parsing
// nothing: for sinks whose deliveries a test does not check, where a receiver parsing large
// bodies in the test's own process (under the race detector) would take the CPU whose share
// to others the test measures.
func newDiscard(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // what a receiver does with it is not under test
	}))
	t.Cleanup(s.Close)
	return s
}

func newReceiver(t *testing.T, answer func(n int) int, hang bool) *receiver {
	rc := &receiver{perID: map[string]int{}, answer: answer}
	if hang {
		rc.hang = make(chan struct{})
	}
	rc.Server = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(func() {
		if rc.hang != nil {
			close(rc.hang)
		}
		rc.Close()
	})
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The sender went away mid-body (a kill): it never saw an answer, so this is not a
		// delivery, and it sends the event again.
		return
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	rec := received{header: r.Header.Clone(), body: body, at: time.Now()}
	if ev, err := cehttp.NewEventFromHTTPRequest(r); err != nil {
		rec.parseErr = fmt.Errorf("CloudEvents SDK: %w", err)
	} else {
		rec.ceID, rec.ceType, rec.subject, rec.source = ev.ID(), ev.Type(), ev.Subject(), ev.Source()
		if err := ev.DataAs(&rec.payload); err != nil {
			rec.parseErr = fmt.Errorf("CloudEvents data: %w", err)
		}
	}
	rc.mu.Lock()
	rc.perID[rec.ceID]++
	n := rc.perID[rec.ceID]
	if rc.judge == nil {
		rc.requests = append(rc.requests, rec)
	}
	rc.mu.Unlock()
	if rc.judge != nil {
		rec.code = rc.judge(rec, n, w.Header())
		rc.mu.Lock()
		rc.requests = append(rc.requests, rec)
		rc.mu.Unlock()
		w.WriteHeader(rec.code)
		return
	}
	if rc.hang != nil {
		select {
		case <-rc.hang:
		case <-r.Context().Done():
		}
		return
	}
	code := http.StatusOK
	if rc.answer != nil {
		code = rc.answer(n)
	}
	w.WriteHeader(code)
}

func (rc *receiver) got() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.requests...)
}

// waitFor waits until the receiver holds n requests and returns them.
func (rc *receiver) waitFor(t *testing.T, n int, timeout time.Duration) []received {
	t.Helper()
	testbed.Eventually(t, timeout, func() error {
		if got := len(rc.got()); got < n {
			return fmt.Errorf("receiver has %d requests, want %d", got, n)
		}
		return nil
	})
	return rc.got()
}

func signingSecret(t *testing.T) (secret, path string) {
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	secret = "whsec_" + base64.StdEncoding.EncodeToString(key)
	path = filepath.Join(t.TempDir(), "signing-secret")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secret, path
}

// countDeadLetters counts the records of a dead-letter file with the reason.
func countDeadLetters(path, reason string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read only: closing can lose nothing
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if strings.Contains(sc.Text(), `"reason":"`+reason+`"`) {
			n++
		}
	}
	return n, nil
}

// metricValue reads one sample from /metrics; series is the name with its labels, in the
// exposition's (alphabetical) label order.
func metricValue(t *testing.T, metricsURL, series string) float64 {
	t.Helper()
	_, body, err := get(t.Context(), metricsURL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	t.Fatalf("no series %s in /metrics", series)
	return 0
}

func TestWebhookDeliversSignedCloudEventsInOrder(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	secret, secretPath := signingSecret(t)
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("s3cr3t-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil, false)
	_, _ = startWithWebhooks(t, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
webhooks:
  - name: audit
    url: %s/events
    namespaces: [%s]
    signingSecretFile: %s
    bearerTokenFile: %s
    headers: [{name: X-Env, value: e2e}]
`, ns, rc.URL, ns, secretPath, tokenPath))

	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"2", "3"} {
		cm.Data["v"] = v
		if cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(t.Context(), "cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got := rc.waitFor(t, 4, 15*time.Second)
	verifier, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ typ, v, old string }{{"ADDED", "1", ""}, {"MODIFIED", "2", "1"}, {"MODIFIED", "3", "2"}, {"DELETED", "3", ""}}
	for i, w := range want {
		r := got[i]
		if r.parseErr != nil {
			t.Fatalf("request %d: %v", i, r.parseErr)
		}
		if err := verifier.Verify(r.body, r.header); err != nil {
			t.Errorf("request %d: signature does not verify: %v", i, err)
		}
		if r.payload.Type != w.typ || r.data("v", false) != w.v || r.data("v", true) != w.old || r.name() != "cm" {
			t.Errorf("request %d: %s v=%s old=%s, want %s v=%s old=%s", i, r.payload.Type, r.data("v", false), r.data("v", true), w.typ, w.v, w.old)
		}
		uid := r.payload.Object["metadata"].(map[string]any)["uid"]
		rv := r.payload.Object["metadata"].(map[string]any)["resourceVersion"]
		if wantID := fmt.Sprintf("%s.%s.%s", uid, rv, strings.ToLower(w.typ)); r.ceID != wantID || r.header.Get("webhook-id") != wantID {
			t.Errorf("request %d: ce-id %q webhook-id %q, want %q", i, r.ceID, r.header.Get("webhook-id"), wantID)
		}
		if r.ceType != "io.dynwatch.resource."+strings.ToLower(w.typ) || r.subject != ns+"/cm" || r.source != "/api/v1/configmaps" {
			t.Errorf("request %d: type %q subject %q source %q", i, r.ceType, r.subject, r.source)
		}
		if r.header.Get("Authorization") != "Bearer s3cr3t-token" || r.header.Get("X-Env") != "e2e" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("request %d: headers %v", i, r.header)
		}
		if r.payload.Resource["resource"] != "configmaps" || r.payload.Resource["version"] != "v1" {
			t.Errorf("request %d: resource %v", i, r.payload.Resource)
		}
		if _, ok := r.payload.Object["metadata"].(map[string]any)["managedFields"]; ok {
			t.Errorf("request %d carries managedFields: webhooks must get the transformed object", i)
		}
	}
}

func TestTwoSinksReceiveExactlyWhatTheirFiltersSelect(t *testing.T) {
	t.Parallel()
	ns1, ns2 := namespace(t), namespace(t)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	a, b := newReceiver(t, nil, false), newReceiver(t, nil, false)
	_, _ = startWithWebhooks(t, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%[1]s, %[2]s]}
  - {version: v1, resource: pods, namespaces: [%[1]s]}
webhooks:
  - {name: a, url: %[3]s, workers: 1, resources: [configmaps], eventTypes: [ADDED, DELETED], namespaces: [%[1]s]}
  - name: b
    url: %[4]s
    workers: 1
    labelSelector: app=web
    filter: 'type == "MODIFIED" && object.data.v != oldObject.data.v'
`, ns1, ns2, a.URL, b.URL))
	create := func(ns, name string, labels map[string]string, v string) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"v": v}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch := func(ns, name, p string) {
		if _, err := cs.CoreV1().ConfigMaps(ns).Patch(t.Context(), name, "application/merge-patch+json", []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	web := map[string]string{"app": "web"}
	create(ns1, "web", web, "1")                           // a: ADDED
	patch(ns1, "web", `{"data":{"v":"2"}}`)                // b: MODIFIED
	patch(ns1, "web", `{"metadata":{"labels":{"x":"y"}}}`) // neither: v unchanged
	create(ns1, "db", nil, "1")                            // a: ADDED
	patch(ns1, "db", `{"data":{"v":"2"}}`)                 // neither: no app=web
	create(ns2, "web2", web, "1")                          // neither: a is ns1 only, b is MODIFIED only
	patch(ns2, "web2", `{"data":{"v":"2"}}`)               // b: MODIFIED
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: web}, Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if _, err := cs.CoreV1().Pods(ns1).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil { // neither
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps(ns1).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil { // a: DELETED
		t.Fatal(err)
	}
	// Sentinels last: with one worker a sink delivers in arrival order, so once a sentinel is
	// in, everything before it is too.
	create(ns1, "zz-end", nil, "1")              // a: ADDED
	create(ns2, "zz-end", web, "1")              // neither
	patch(ns2, "zz-end", `{"data":{"v":"end"}}`) // b: MODIFIED
	summary := func(rs []received) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.payload.Type+" "+strings.TrimPrefix(r.subject, ns1+"/"))
		}
		return strings.Join(out, ", ")
	}
	wantA := "ADDED web, ADDED db, DELETED web, ADDED zz-end"
	wantB := "MODIFIED web, MODIFIED " + ns2 + "/web2, MODIFIED " + ns2 + "/zz-end"
	testbed.Eventually(t, 20*time.Second, func() error {
		if got := summary(a.got()); !strings.HasSuffix(got, "zz-end") {
			return fmt.Errorf("sink a so far: %s", got)
		}
		if got := summary(b.got()); !strings.HasSuffix(got, "zz-end") {
			return fmt.Errorf("sink b so far: %s", got)
		}
		return nil
	})
	if got := summary(a.got()); got != wantA {
		t.Errorf("sink a received %s\nwant %s", got, wantA)
	}
	if got := summary(b.got()); got != wantB {
		t.Errorf("sink b received %s\nwant %s", got, wantB)
	}
}

func TestFailedDeliveriesAreRetriedOrDeadLettered(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	deadLetters := filepath.Join(t.TempDir(), "dead-letters.jsonl")
	flaky := newReceiver(t, func(n int) int {
		if n <= 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}, false)
	rejecting := newReceiver(t, func(int) int { return http.StatusBadRequest }, false)
	_, metrics := startWithWebhooks(t, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%[1]s]}
webhooks:
  - {name: flaky, url: %[2]s, namespaces: [%[1]s], retry: {initialBackoff: 50ms, maxBackoff: 200ms}}
  - {name: rejecting, url: %[3]s, namespaces: [%[1]s], deadLetter: {file: %[4]s}}
`, ns, flaky.URL, rejecting.URL, deadLetters))
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("503 three times then 200 is delivered, always with the same id", func(t *testing.T) {
		got := flaky.waitFor(t, 4, 15*time.Second)
		for i, r := range got {
			if r.ceID != got[0].ceID || r.header.Get("webhook-id") != got[0].ceID {
				t.Errorf("attempt %d has ce-id %q, webhook-id %q; want %q on every attempt", i+1, r.ceID, r.header.Get("webhook-id"), got[0].ceID)
			}
		}
		testbed.Eventually(t, 5*time.Second, func() error {
			if v := metricValue(t, metrics, `dynwatch_webhook_deliveries_total{result="delivered",sink="flaky"}`); v != 1 {
				return fmt.Errorf("delivered = %v", v)
			}
			return nil
		})
		if v := metricValue(t, metrics, `dynwatch_webhook_retries_total{sink="flaky"}`); v != 3 {
			t.Errorf("retries = %v, want 3", v)
		}
		if n := len(flaky.got()); n != 4 {
			t.Errorf("%d requests, want 4: nothing after the 200", n)
		}
	})
	t.Run("400 is not retried and goes to the dead letters", func(t *testing.T) {
		var rec struct {
			Sink, Reason, ID, Error, Type string
			Attempts                      int
			Event                         json.RawMessage
		}
		testbed.Eventually(t, 10*time.Second, func() error {
			b, err := os.ReadFile(deadLetters)
			if err != nil {
				return err
			}
			return json.Unmarshal(b, &rec)
		})
		if rec.Sink != "rejecting" || rec.Reason != "rejected" || rec.Attempts != 1 || rec.Type != "ADDED" || !strings.Contains(rec.Error, "400") || rec.Event != nil {
			t.Errorf("dead letter = %+v", rec)
		}
		if n := len(rejecting.got()); n != 1 {
			t.Errorf("the rejecting receiver got %d requests, want 1", n)
		}
		if v := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="rejected",sink="rejecting"}`); v != 1 {
			t.Errorf("dead_letters_total{reason=rejected} = %v, want 1", v)
		}
	})
}

func TestAHangingSinkDelaysNoOtherAndAFullQueueDeadLetters(t *testing.T) {
	ns := namespace(t)
	deadLetters := filepath.Join(t.TempDir(), "dead-letters.jsonl")
	hanging, fast := newReceiver(t, nil, true), newReceiver(t, nil, false)
	p, metrics := startWithWebhooks(t, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%[1]s]}
webhooks:
  - {name: hanging, url: %[2]s, namespaces: [%[1]s], workers: 1, queueSize: 2, timeout: 1m, deadLetter: {file: %[4]s}}
  - {name: fast, url: %[3]s, namespaces: [%[1]s]}
shutdownTimeout: 4s
`, ns, hanging.URL, fast.URL, deadLetters))
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for i := range 6 {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	fast.waitFor(t, 6, 5*time.Second)
	if n := len(hanging.got()); n != 1 {
		t.Errorf("the hanging receiver got %d requests, want the 1 it holds", n)
	}
	// One delivery hangs, one waits in the queue (capacity 2): the other 4 are dead-lettered.
	testbed.Eventually(t, 10*time.Second, func() error {
		n, err := countDeadLetters(deadLetters, "queue_full")
		if err != nil {
			return err
		}
		if n != 4 {
			return fmt.Errorf("%d queue_full dead letters, want 4", n)
		}
		return nil
	})
	if v := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="queue_full",sink="hanging"}`); v != 4 {
		t.Errorf("dead_letters_total{reason=queue_full} = %v, want 4", v)
	}
	if v := metricValue(t, metrics, `dynwatch_webhook_queue_length{sink="hanging"}`); v != 2 {
		t.Errorf("queue_length = %v, want 2", v)
	}
	// Stopping: the delivery in progress, cut half way to the shutdown deadline, and the queued
	// one are dead-lettered, not lost.
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := countDeadLetters(deadLetters, "shutdown"); err != nil || n != 2 {
		t.Errorf("%d shutdown dead letters (%v), want 2", n, err)
	}
}
