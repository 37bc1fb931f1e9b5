package leader

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// fence lets a replica deliver only while the lease is certainly its own: until its last
// successful renewal's start plus the renew deadline (see the package comment).
type fence struct {
	mu      sync.Mutex
	until   time.Time // carries a monotonic reading; zero: not held
	term    term      // the leadership the last grant was for
	renewed chan struct{}
}

func newFence() *fence { return &fence{renewed: make(chan struct{})} }

func (f *fence) grant(until time.Time, t term) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.until, f.term = until, t
	close(f.renewed)
	f.renewed = make(chan struct{})
}

func (f *fence) revoke() {
	f.mu.Lock()
	f.until = time.Time{}
	f.mu.Unlock()
}

func (f *fence) held() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until, !f.until.IsZero() && time.Now().Before(f.until)
}

// heldFor returns the leadership the fence holds for, and whether it holds now.
func (f *fence) heldFor() (term, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term, !f.until.IsZero() && time.Now().Before(f.until)
}

// bound returns a context that ends with ctx or when the fence lapses, and whether it holds
// now.
func (f *fence) bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	until, ok := f.held()
	if !ok {
		return ctx, func() {}, false
	}
	c, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var t *time.Timer
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if u, ok := f.held(); ok {
			t.Reset(time.Until(u)) // renewed meanwhile
			return
		}
		cancel()
	}
	mu.Lock()
	t = time.AfterFunc(time.Until(until), check)
	mu.Unlock()
	return c, func() { t.Stop(); cancel() }, true
}

// wait returns once the fence is granted again, or ctx ends.
func (f *fence) wait(ctx context.Context) {
	f.mu.Lock()
	ch := f.renewed
	f.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// fencedLock is the Lease lock, granting the fence on every write that makes this replica the
// holder and revoking it before any write that does not (the release at shutdown).
type fencedLock struct {
	resourcelock.Interface
	fence *fence
	hold  time.Duration
}

func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.Interface.Create(ctx, r) })
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.Interface.Update(ctx, r) })
}

func (l *fencedLock) write(r resourcelock.LeaderElectionRecord, do func() error) error {
	if r.HolderIdentity != l.Identity() {
		l.fence.revoke()
		return do()
	}
	start := time.Now()
	err := do()
	if err == nil {
		l.fence.grant(start.Add(l.hold), term{holder: r.HolderIdentity, transitions: r.LeaderTransitions})
	}
	return err
}
