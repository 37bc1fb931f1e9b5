package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// selectAll is a target, safe to hand entries from Run's goroutine, that selects every event
// and counts the entries handed to it.
type selectAll struct{ n atomic.Int64 }

func (*selectAll) Name() string                       { return "sink" }
func (*selectAll) InitialState() bool                 { return false }
func (*selectAll) Selects(object.Event) (bool, error) { return true, nil }
func (t *selectAll) Queue(Entry)                      { t.n.Add(1) }

// TestAStoreThatCannotCommitHoldsTheInformersBack: while the store's fdatasync is stalled, or
// its disk full, the events recorded and not committed pass maxPendingBytes and Room stays
// open (the informers stop reading); once the store recovers, every event is committed and
// handed on, and Room closes again once what is held is down to half the limit.
func TestAStoreThatCannotCommitHoldsTheInformersBack(t *testing.T) {
	for _, fault := range []struct {
		name string
		// sync is the store's fdatasync while the fault is on: it may block until released.
		sync func(f *os.File, released <-chan struct{}) error
	}{
		{"a stalled fdatasync", func(f *os.File, released <-chan struct{}) error { <-released; return f.Sync() }},
		{"a failing fdatasync", func(*os.File, <-chan struct{}) error { return errors.New("no space left on device") }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			var on atomic.Bool
			var mu sync.Mutex
			released := make(chan struct{})
			datasync := func(f *os.File) error {
				if !on.Load() {
					return f.Sync()
				}
				mu.Lock()
				r := released
				mu.Unlock()
				return fault.sync(f, r)
			}
			tg := &selectAll{}
			const limit = 1 << 20
			j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), MaxPendingBytes: limit,
				Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{tg} }, datasync: datasync})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Close() })
			done := make(chan struct{})
			go func() { j.Run(t.Context()); close(done) }()
			t.Cleanup(func() { <-done })
			release := sync.OnceFunc(func() { on.Store(false); close(released) })
			t.Cleanup(release)

			on.Store(true)
			const events, size = 400, 64 << 10 // 25 MB: past syncBytes unsynced, and then past the limit held
			for i := range events {
				j.OnEvent(addedWithData(fmt.Sprintf("cm-%03d", i), uint64(100+i), size))
			}
			testbed.Eventually(t, 10*time.Second, func() error {
				select {
				case <-j.Room():
					return fmt.Errorf("room for more events while the store cannot sync: %+v", j.Pressure())
				default:
				}
				if s := j.Pressure(); !s.Backpressure || s.PendingBytes <= limit || s.Since == nil {
					return fmt.Errorf("status %+v; want backpressure, since a time, with more than %d bytes held", s, limit)
				}
				return nil
			})
			release()
			testbed.Eventually(t, 30*time.Second, func() error {
				if n := tg.n.Load(); n != events {
					return fmt.Errorf("%d of %d events handed on once the store recovered", n, events)
				}
				select {
				case <-j.Room():
				default:
					return fmt.Errorf("no room once every event is committed: %+v", j.Pressure())
				}
				if s := j.Pressure(); s.Backpressure || s.PendingBytes != 0 {
					return fmt.Errorf("status %+v once every event is committed; want no backpressure and nothing held", s)
				}
				return nil
			})
			if v := counterValue(j.pressure.m.seconds); v <= 0 {
				t.Errorf("dynwatch_state_backpressure_seconds_total = %v; want the time held back", v)
			}
		})
	}
}
