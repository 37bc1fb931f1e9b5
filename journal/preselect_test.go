package journal

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// costly is a sink whose filter takes until released on object "big", and records the order
// in which its entries are queued.
type costly struct {
	release chan struct{}
	mu      sync.Mutex
	queued  []string
}

func (*costly) Name() string       { return "sink" }
func (*costly) InitialState() bool { return false }

func (c *costly) Selects(e object.Event) (bool, error) {
	if e.Object.GetName() == "big" {
		<-c.release
	}
	return true, nil
}

func (c *costly) Queue(e Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queued = append(c.queued, e.Event.Object.GetName()+"@"+e.Event.Object.GetResourceVersion())
}

func (c *costly) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.queued)
}

// TestACostlyObjectHoldsUpOnlyItsOwnEvents: while the filter takes its time on one object,
// other objects' events are committed and queued; that object's own events wait and keep their
// order; and the checkpoint stays below its held event until it is committed, so a follower
// never trims what the leader has not recorded.
func TestACostlyObjectHoldsUpOnlyItsOwnEvents(t *testing.T) {
	c := &costly{release: make(chan struct{})}
	j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Path: filepath.Join(t.TempDir(), "state.db"), Targets: func() []Target { return []Target{c} }, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { j.Run(t.Context()); close(done) }()
	t.Cleanup(func() { <-done; _ = j.Close() })
	j.ListStarted(configmaps, 1, []string{""})
	j.ListSynced(configmaps, 1, 10)
	watched := func(name string, rev uint64) object.Event {
		e := addedAt(name, rev)
		e.InOrder = true
		return e
	}
	j.OnEvent(watched("big", 11))
	j.OnEvent(watched("big", 12))
	j.OnEvent(watched("small", 13))
	testbed.Eventually(t, 10*time.Second, func() error {
		if got := c.got(); !slices.Equal(got, []string{"small@13"}) {
			return fmt.Errorf("queued %q while big is being filtered; want small@13", got)
		}
		return nil
	})
	if cp := j.Checkpoints()["sink"][configmaps]; cp > 10 {
		t.Errorf("checkpoint %d while big@11 is being filtered; want at most 10", cp)
	}
	close(c.release)
	testbed.Eventually(t, 10*time.Second, func() error {
		if got := c.got(); !slices.Equal(got, []string{"small@13", "big@11", "big@12"}) {
			return fmt.Errorf("queued %q; want small@13, then big@11 and big@12 in order", got)
		}
		return nil
	})
}
