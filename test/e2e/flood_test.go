package e2e

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The flood: this many requests at once, each with a fresh random bearer token, over this many
// HTTP/2 connections, for this long.
const (
	floodRequests    = 400
	floodConnections = 8
	floodFor         = 30 * time.Second
)

// The review client's default rate limit (client.rateLimits.reviews): no more TokenReviews than
// this may reach the apiserver, whatever arrives.
const (
	reviewsQPS   = 20
	reviewsBurst = 40
)

// TestARandomTokenFloodStallsNoOneElse floods the query API with requests that each carry a
// fresh random bearer token, as anyone who reaches the port can, while a valid caller queries,
// another tenant's webhook receives updates and the replica holds its Lease: the valid caller's
// requests all succeed with a p99 under 250 ms, the Lease is renewed every retry period (never
// more than a second late), the other tenant's updates arrive with a p99 under 250 ms, and the
// TokenReviews that reach the apiserver stay within the review client's rate.
//
// It runs alone (no t.Parallel), so that every TokenReview the apiserver counts is this test's.
func TestARandomTokenFloodStallsNoOneElse(t *testing.T) {
	testbed.Need(t)
	ns := namespace(t)
	const retryPeriod = 2 * time.Second
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	rc := newJudge(t, func(received, int, http.Header) int { return http.StatusOK })
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%[1]s]}]
webhooks: [{name: tenant, url: %[2]s, workers: 4, retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
state: {path: %[3]s}
leaderElection: {enabled: true, namespace: %[1]s, identity: flooded, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: %[4]s}
api:
  address: "127.0.0.1:0"
  tls: {selfSignedCAFile: %[5]s}
  auth: {tokenCacheTTL: 2s}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL, filepath.Join(t.TempDir(), "state.db"), retryPeriod, caFile))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	grantConfigMapReads(t, ns, "alice")
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	list := url + "/api/v1/namespaces/" + ns + "/configmaps"
	valid := floodClient(roots)
	// The caller is known before the flood, as a real one would be.
	if code := floodGet(valid, list, cluster.Token("alice")); code != http.StatusOK {
		t.Fatalf("alice's list before the flood: %d", code)
	}
	renewals := watchRenewals(t, cs, ns)
	reviewsBefore := tokenReviews(t, cs)

	start := time.Now()
	deadline := start.Add(floodFor)
	var wg sync.WaitGroup
	var flooded, busy atomic.Int64
	for range floodConnections {
		client := floodClient(roots)
		for range floodRequests / floodConnections {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					code := floodGet(client, list, randomToken())
					flooded.Add(1)
					if code == http.StatusTooManyRequests {
						busy.Add(1)
					}
				}
			})
		}
	}
	var answers []time.Duration
	var failures []string
	wg.Go(func() {
		for time.Now().Before(deadline) {
			began := time.Now()
			code := floodGet(valid, list, cluster.Token("alice"))
			answers = append(answers, time.Since(began))
			if code != http.StatusOK {
				failures = append(failures, fmt.Sprintf("%d at %s", code, began.Sub(start).Round(time.Millisecond)))
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	var updates int
	wg.Go(func() { updates = stamp(t, cs, ns, "tenant", 200*time.Millisecond, floodFor) })
	wg.Wait()
	elapsed := time.Since(start)
	reviews := tokenReviews(t, cs) - reviewsBefore
	t.Logf("%d flood requests in %s, %d answered 429; %d TokenReviews reached the apiserver", flooded.Load(), elapsed.Round(time.Millisecond), busy.Load(), int(reviews))

	if len(failures) > 0 {
		t.Errorf("%d of alice's %d requests failed during the flood: %s", len(failures), len(answers), strings.Join(failures, ", "))
	}
	if p := percentile(answers, 0.99); p > 250*time.Millisecond {
		t.Errorf("alice's requests: p99 %s over %d; want at most 250ms", p, len(answers))
	} else {
		t.Logf("alice's requests: p99 %s over %d", p, len(answers))
	}
	if limit := reviewsQPS*elapsed.Seconds() + reviewsBurst; reviews > limit {
		t.Errorf("%d TokenReviews reached the apiserver in %s; the review client allows at most %d", int(reviews), elapsed.Round(time.Second), int(limit))
	}

	gaps := renewals.gaps(start, deadline)
	if worst := slices.Max(gaps); worst > retryPeriod+time.Second {
		t.Errorf("Lease renewals %v apart at worst during the flood (all: %v); want at most the retry period %s + 1s", worst, gaps, retryPeriod)
	} else {
		t.Logf("Lease renewals at most %s apart (%d renewals)", worst, len(gaps))
	}

	checkStampLatency(t, rc, updates, "during the flood")
}

// floodClient is one HTTP/2 connection to the API: requests on it share the connection.
func floodClient(roots *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
		MaxConnsPerHost:   1,
	}}
}

// floodGet GETs url with token and returns the status code, 0 if there was no answer.
func floodGet(c *http.Client, url, token string) int {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tokenReviews is how many TokenReviews the apiserver has answered since it started.
func tokenReviews(t *testing.T, cs *kubernetes.Clientset) float64 {
	t.Helper()
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="tokenreviews"`) {
			continue
		}
		v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		n += v
	}
	return n
}

// renewals are the renew times the Lease in a namespace was seen with.
type renewals struct {
	mu    sync.Mutex
	times []time.Time
}

// watchRenewals records every renewal of the Lease "dynwatch" in ns until the test ends.
func watchRenewals(t *testing.T, cs *kubernetes.Clientset, ns string) *renewals {
	t.Helper()
	w, err := cs.CoordinationV1().Leases(ns).Watch(t.Context(), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "dynwatch").String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	r := &renewals{}
	go func() {
		for ev := range w.ResultChan() {
			if lease, ok := ev.Object.(*coordinationv1.Lease); ok && lease.Spec.RenewTime != nil {
				r.mu.Lock()
				r.times = append(r.times, lease.Spec.RenewTime.Time)
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// gaps are the times between successive renewals from the last one before from to the first
// one after to.
func (r *renewals) gaps(from, to time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(r.times); i++ {
		if r.times[i].Before(from) || r.times[i-1].After(to) {
			continue
		}
		gaps = append(gaps, r.times[i].Sub(r.times[i-1]))
	}
	if len(gaps) == 0 {
		gaps = append(gaps, to.Sub(from))
	}
	return gaps
}

// percentile is the q-quantile of ds (0 for none).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
