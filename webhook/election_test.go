package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
