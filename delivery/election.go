package delivery

import (
	"context"
	"errors"
	"net"
)

// Leadership is leader election as delivery needs it (package leader's Elector provides it,
// and app runs it, calling Lead and Follow): each request is made under the Fence.
type Leadership interface {
	// Leading reports whether this replica has been elected and not yet stopped leading.
	Leading() bool
	Fence
}

// Fence holds while this replica is certainly the leader.
type Fence interface {
	// Bound returns a context that ends with ctx or when the fence lapses, and whether the
	// fence holds now.
	Bound(ctx context.Context) (context.Context, context.CancelFunc, bool)
	// Lapsed reports whether the fence does not hold now.
	Lapsed() bool
	// Wait returns once the fence is granted again, or ctx ends.
	Wait(ctx context.Context)
}

// Always is the fence of a replica without leader election: it always holds.
type Always struct{}

// Bound implements Fence: ctx as it is, always held.
func (Always) Bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	return ctx, func() {}, true
}

// Lapsed implements Fence: never.
func (Always) Lapsed() bool { return false }

// Wait implements Fence: it returns when ctx ends.
func (Always) Wait(ctx context.Context) { <-ctx.Done() }

// errFenceLapsed is what a fenced connection's Write returns once the fence has lapsed.
var errFenceLapsed = errors.New("the leader election fence has lapsed: not sending")

// DialFunc dials a connection, as net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// FencedDialer wraps dial so that its connections refuse to write once f has lapsed. It is the
// last check before a request's bytes reach the network: a worker paused between its own check
// and its write (before the fence's timer cuts its context) sends nothing on resuming.
func FencedDialer(f Fence, dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return FencedConn(c, f), nil
	}
}

// FencedConn is c refusing to write once f has lapsed (see FencedDialer), for a client that
// dials for itself.
func FencedConn(c net.Conn, f Fence) net.Conn { return fencedConn{Conn: c, fence: f} }

type fencedConn struct {
	net.Conn
	fence Fence
}

func (c fencedConn) Write(b []byte) (int, error) {
	if c.fence.Lapsed() {
		return 0, errFenceLapsed
	}
	return c.Conn.Write(b)
}
