package dynamicinformer

import (
	"context"

	"k8s.io/apimachinery/pkg/watch"
)

// Gate holds the informers back while what they handed their subscribers still waits to be
// taken (the journal's events not yet committed, while its disk is full or its fdatasync
// stalls): Room's channel is closed while there is room, and closes once there is again.
//
// While it is open, an informer reads no more of its watch and starts no list. The watch's
// events then wait in the apiserver, which ends a watcher that does not read once its
// buffer for it is full; the informer watches again from where it was once there is room,
// or lists again if that is too old, and the list's differences become the events (see
// object.Event.Since). So what the informers hold in memory meanwhile is bounded: an event per
// watch, and what the connection buffers.
type Gate interface {
	Room() <-chan struct{}
}

// waitRoom waits until the gate has room, or ctx ends.
func (m *Manager) waitRoom(ctx context.Context) error {
	if m.gate == nil {
		return nil
	}
	select {
	case <-m.gate.Room():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gated passes on the events of w, each once the gate has room; w itself without a gate.
func (m *Manager) gated(w watch.Interface) watch.Interface {
	if m.gate == nil {
		return w
	}
	o := newRelay(w)
	go func() {
		defer close(o.out)
		defer w.Stop()
		for {
			select {
			case <-m.gate.Room():
			case <-o.stop:
				return
			}
			select {
			case e, ok := <-w.ResultChan():
				if !ok || !o.send(e) {
					return
				}
			case <-o.stop:
				return
			}
		}
	}()
	return o
}
