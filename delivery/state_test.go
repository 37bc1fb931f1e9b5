package delivery

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/config"
)

// TestARestartKeepsTheRetryDeadline: an event retried against a failing receiver is still in
// the outbox after a stop, and the next run honours the deadline its first attempt set rather
// than starting a new retry budget: past it, the event is dead-lettered without a request.
func TestARestartKeepsTheRetryDeadline(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	dir := t.TempDir()
	deadFile := filepath.Join(dir, "dead.jsonl")
	cfgPath := filepath.Join(dir, "config.yaml")
	yaml := fmt.Sprintf("resources: [{version: v1, resource: configmaps}]\nwebhooks: [{name: s, url: %s, retry: {initialBackoff: 10ms, maxBackoff: 20ms, maxElapsed: 1m}, deadLetter: {file: %s}}]\n", srv.URL, deadFile)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	start := func(now func() time.Time) *Pipeline {
		return StartPipeline(t, Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Transports: testTransports, Sinks: cfg.Sinks(), Now: now}, filepath.Join(dir, "state.db"))
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	d := start(nil)
	d.Journal.OnEvent(event("a"))
	waitUntil("retries", func() bool { return requests.Load() >= 3 })
	d.Stop()
	if dead, _ := os.ReadFile(deadFile); len(dead) != 0 {
		t.Fatalf("stopping with a state store dead-lettered %s", dead)
	}

	tried := requests.Load()
	d = start(func() time.Time { return time.Now().Add(time.Hour) }) // past the 1m deadline
	waitUntil("a dead letter", func() bool { b, _ := os.ReadFile(deadFile); return len(b) > 0 })
	b, _ := os.ReadFile(deadFile)
	var rec DeadLetter
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID != "uid-a.1.added" || rec.Reason != reasonRetriesExhausted || rec.Attempts != 0 || !strings.Contains(rec.Error, "deadline") {
		t.Errorf("dead letter = %+v; want the same id, retries_exhausted, no attempt, the deadline named", rec)
	}
	if n := requests.Load(); n != tried {
		t.Errorf("the receiver got %d more requests after the deadline had passed", n-tried)
	}
	waitUntil("an empty outbox", func() bool { return d.journal.OutboxLen(d.current()[0].name) == 0 })
}

// TestAGracefulStopLetsTheDeliveryUnderWayFinish: a stop that begins while a request is under
// way waits for its answer (within the shutdown timeout) and records it, so the next start
// does not send the receiver what it has already acknowledged. Cutting the request at once
// made a plain SIGTERM repeat the last delivery of every sink.
func TestAGracefulStopLetsTheDeliveryUnderWayFinish(t *testing.T) {
	var (
		mu      sync.Mutex
		ids     []string
		first   = true
		arrived = make(chan struct{})
		release = make(chan struct{})
		cut     = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ids = append(ids, r.Header.Get("Webhook-Id"))
		hold := first
		first = false
		mu.Unlock()
		if hold {
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done():
				close(cut)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, "resources: [{version: v1, resource: configmaps}]\nwebhooks: [{name: s, url: %s, workers: 1}]\n", srv.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	start := func() *Pipeline {
		return StartPipeline(t, Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Transports: testTransports, Sinks: cfg.Sinks(), ShutdownTimeout: time.Minute}, filepath.Join(dir, "state.db"))
	}

	d := start()
	d.Journal.OnEvent(event("a"))
	<-arrived
	d.Cancel()
	select { // a request cut by the stop shows at once; give it a second to show
	case <-cut:
	case <-time.After(time.Second):
	}
	close(release)
	<-d.Done()

	d = start()
	d.Journal.OnEvent(event("b"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got := slices.Clone(ids)
		mu.Unlock()
		if slices.Contains(got, "uid-b.1.added") {
			if !slices.Equal(got, []string{"uid-a.1.added", "uid-b.1.added"}) {
				t.Errorf("the receiver got %q; want a once (its request finished before the stop), then b", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b did not arrive within 10 s; the receiver got %q", got)
		}
	}
}
