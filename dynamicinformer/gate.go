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

// gated passes on the events of w, each once the gate has room, until x expires the watch
// (see expiry): it then ends with a 410 Expired error. w itself without a gate or an expiry.
func (m *Manager) gated(w watch.Interface, x *expiry) watch.Interface {
	if m.gate == nil && x == nil {
		return w
	}
	room := m.roomOrAlways()
	expired := x.expired()
	o := newRelay(w)
	expire := func() {
		x.ended()
		o.send(watch.Event{Type: watch.Error, Object: errCheckFailed()})
	}
	go func() {
		defer close(o.out)
		defer w.Stop()
		for {
			select {
			case <-room():
			case <-o.stop:
				return
			case <-expired:
				expire()
				return
			}
			select {
			case e, ok := <-w.ResultChan():
				if !ok || !o.send(e) {
					return
				}
			case <-o.stop:
				return
			case <-expired:
				expire()
				return
			}
		}
	}()
	return o
}

// roomOrAlways is the gate's Room, or without a gate a channel that is always ready.
func (m *Manager) roomOrAlways() func() <-chan struct{} {
	if m.gate != nil {
		return m.gate.Room
	}
	open := make(chan struct{})
	close(open)
	return func() <-chan struct{} { return open }
}
