package delivery

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
)

// TestALapsedFenceWritesNothing: a worker paused after it checked the fence, and resumed
// after the fence lapsed, reaches its write before the fence's timer cuts it; the connection
// itself must then send nothing, on a new connection or on one kept alive while leading.
func TestALapsedFenceWritesNothing(t *testing.T) {
	var received atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { received.Add(1) }))
	defer srv.Close()
	f := &testFence{}
	client := newClient(nil, 1, 5*time.Second, f)
	post := func() error {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader("{}"))
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	if err := post(); err != nil || received.Load() != 1 {
		t.Fatalf("while the fence holds: err %v, %d received; want the request through", err, received.Load())
	}
	f.lapsed.Store(true) // the last renewal is too old
	if err := post(); err == nil || !strings.Contains(err.Error(), errFenceLapsed.Error()) {
		t.Fatalf("on the kept-alive connection after the fence lapsed: err %v; want %v", err, errFenceLapsed)
	}
	client.CloseIdleConnections()
	if err := post(); err == nil {
		t.Fatal("on a new connection after the fence lapsed: the request went out")
	}
	if n := received.Load(); n != 1 {
		t.Fatalf("the receiver got %d requests; want only the one made while the fence held", n)
	}
}

// testFence is a fence whose lapse the test decides; package leader's holds while its Lease
// renewals are fresh.
type testFence struct{ lapsed atomic.Bool }

func (f *testFence) Bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	return ctx, func() {}, !f.lapsed.Load()
}

func (f *testFence) Lapsed() bool { return f.lapsed.Load() }

func (f *testFence) Wait(ctx context.Context) { <-ctx.Done() }

// TestWorkersStopWhenLeadershipEndsWithTheFenceLapsedAndEventsQueued: on losing the Lease the
// fence is revoked, then the leadership's context ends and the workers are stopped. A worker
// that took an event just then found the fence lapsed and put it back; waiting for the fence
// returned at once (the context had ended) and the queue handed the same event again: it spun
// until killed, and the graceful stop that lost the Lease never ended.
func TestWorkersStopWhenLeadershipEndsWithTheFenceLapsedAndEventsQueued(t *testing.T) {
	cfg := config.Webhook{Sink: config.Sink{Name: "hook", Labels: labels.Everything()}, Endpoint: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}}
	cfg.Timeout, cfg.Workers, cfg.QueueSize = time.Second, 2, 10
	reg := prometheus.NewRegistry()
	j, err := journal.New(journal.Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg}) // in memory, never run
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Transports: testTransports, Sinks: []config.SinkConfig{&cfg}, Journal: j})
	if err != nil {
		t.Fatal(err)
	}
	s := d.current()[0]
	f := &testFence{}
	f.lapsed.Store(true)
	s.fence = f
	for _, key := range []string{"a", "b", "c"} {
		if err := s.queue.Push(delivery(key, key)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the leadership is over: the workers are started only to be stopped
	s.startWorkers(ctx, ctx)
	stopped := make(chan struct{})
	go func() { s.stopWorkers(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the workers did not stop within 10 s: they spin, taking and returning a queued event")
	}
	if n := s.queue.Len(); n != 3 {
		t.Errorf("%d events queued after the workers stopped; want the 3 queued before", n)
	}
}
