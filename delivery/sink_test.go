package delivery

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// run starts a Dispatcher for the webhooks YAML (the resources are fixed), with a journal in
// memory, until the test ends.
func run(t testing.TB, webhooksYAML string) *Pipeline {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("resources: [{version: v1, resource: configmaps}]\nwebhooks:\n"+webhooksYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return StartPipeline(t, Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Transports: testTransports, Sinks: cfg.Sinks()}, "")
}

func event(name string) object.Event {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")
	obj.SetNamespace("ns")
	obj.SetName(name)
	obj.SetUID(types.UID("uid-" + name))
	obj.SetResourceVersion("1")
	return object.Event{Type: object.Added, Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Object: object.New(obj), Observed: time.Now()}
}

// arrivals records when each request arrived, and answers with answer(n) for the n-th.
type arrivals struct {
	mu    sync.Mutex
	times []time.Time
	ch    chan []byte
}

// count is how many requests have arrived.
func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times)
}

func (a *arrivals) handler(answer func(n int, w http.ResponseWriter)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.times = append(a.times, time.Now())
		n := len(a.times)
		a.mu.Unlock()
		answer(n, w)
		if a.ch != nil {
			a.ch <- body
		}
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	a := &arrivals{ch: make(chan []byte, 4)}
	srv := httptest.NewServer(a.handler(func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	d := run(t, fmt.Sprintf("  - {name: limited, url: %s, retry: {initialBackoff: 10ms, maxBackoff: 20ms}}\n", srv.URL))
	d.Journal.OnEvent(event("a"))
	for range 2 {
		select {
		case <-a.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the event was not delivered after a 429")
		}
	}
	if gap := a.times[1].Sub(a.times[0]); gap < 900*time.Millisecond {
		t.Fatalf("retried %s after a 429 with Retry-After: 1; the backoff alone would be 10-20ms", gap)
	}
}

func TestDeadLettersArePostedToTheDeadLetterURL(t *testing.T) {
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	defer rejecting.Close()
	dl := &arrivals{ch: make(chan []byte, 1)}
	deadSrv := httptest.NewServer(dl.handler(func(int, http.ResponseWriter) {}))
	defer deadSrv.Close()
	d := run(t, fmt.Sprintf("  - {name: strict, url: %s, deadLetter: {url: %s}}\n", rejecting.URL, deadSrv.URL))
	d.Journal.OnEvent(event("b"))
	select {
	case body := <-dl.ch:
		var rec DeadLetter
		if err := json.Unmarshal(body, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Sink != "strict" || rec.Reason != reasonRejected || rec.ID != "uid-b.1.added" || rec.Attempts != 1 {
			t.Fatalf("dead letter = %+v", rec)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no dead letter posted")
	}
}

// TestEveryAttemptIsCountedByItsAnswersClass: a 503, a 429, a request that outlives the
// sink's timeout and a 200 are four answers of four classes in dynwatch_webhook_answers_total;
// then a 410 disables the sink: the next event is dead-lettered as gone without an attempt.
func TestEveryAttemptIsCountedByItsAnswersClass(t *testing.T) {
	a := &arrivals{ch: make(chan []byte, 8)}
	srv := httptest.NewServer(a.handler(func(n int, w http.ResponseWriter) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusTooManyRequests)
		case 3:
			time.Sleep(300 * time.Millisecond) // past the sink's timeout
		case 5:
			w.WriteHeader(http.StatusGone)
		}
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf("resources: [{version: v1, resource: configmaps}]\nwebhooks:\n  - {name: h, url: %s, workers: 1, timeout: 100ms, retry: {initialBackoff: 10ms, maxBackoff: 20ms}}\n", srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p := StartPipeline(t, Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Transports: testTransports, Sinks: cfg.Sinks()}, "")
	// byLabel is the counter name's values by the label's.
	byLabel := func(name, label string) map[string]float64 {
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label {
						out[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
		return out
	}
	answers := func() map[string]float64 { return byLabel("dynwatch_webhook_answers_total", "class") }
	p.Journal.OnEvent(event("a"))
	deadline := time.Now().Add(10 * time.Second)
	for got := answers(); got["2xx"] < 1; got = answers() {
		if time.Now().After(deadline) {
			t.Fatalf("answers %v; want a 2xx at last", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := answers(); got["5xx"] != 1 || got["429"] != 1 || got["timeout"] != 1 || got["2xx"] != 1 || got["error"] != 0 || len(got) != 8 {
		t.Fatalf("answers %v; want one 5xx, 429, timeout and 2xx each, every class there from the start", got)
	}
	p.Journal.OnEvent(event("b"))
	p.Journal.OnEvent(event("c"))
	for got := answers(); got["410"] < 1; got = answers() {
		if time.Now().After(deadline) {
			t.Fatalf("answers %v; want a 410", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(10 * time.Second)
	for byLabel("dynwatch_webhook_dead_letters_total", "reason")[reasonGone] < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("dead letters %v; want b and c as gone", byLabel("dynwatch_webhook_dead_letters_total", "reason"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, st := a.count(), p.Status(); n != 5 || st[0].Disabled == nil {
		t.Fatalf("after a 410: %d requests, status %+v; want the 410 the last, and the sink disabled", n, st)
	}
}
