package delivery

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// replayPageSize is how many objects an initialState replay reads from the cache, and records,
// at a time: the resource's handlers wait while a page is read, and the journal's writer
// while it is recorded, so a page must be short next to a delivery; 20,000 objects are 200
// pages.
const replayPageSize = 100

// replayPoll is how often a replay looks again at a resource whose initial lists have not
// been recorded yet, or at a queue still busy with the last page.
const replayPoll = 50 * time.Millisecond

// Cache is the informers' cache as an initialState replay reads it (app gives the informers').
type Cache interface {
	// Lookup reports whether gvr's informers run and whether they have synced (or, once
	// synced, fell stale), and whether a resource discovery has yet to place may still turn
	// out to be gvr.
	Lookup(gvr schema.GroupVersionResource) (running, synced, pending bool)
	// Page calls fn once with up to size of gvr's objects whose keys follow after, in key
	// order, and whether more follow; false, without calling fn, if gvr's informers do not run.
	Page(gvr schema.GroupVersionResource, after string, size int, fn func(objs []*object.Object, more bool)) bool
}

// startReplay starts handing s the current objects, if the journal says it is to have them
// (see journal.ReplayPage), until that is done, ctx ends or stopReplay is called on s. The
// caller holds d.life.
func (d *Dispatcher) startReplay(ctx context.Context, s *Sink) {
	if d.cache == nil {
		return
	}
	ctx, s.stopReplay = context.WithCancel(ctx)
	d.replays.Go(func() {
		defer s.stopReplay()
		if err := d.replay(ctx, s); err != nil && ctx.Err() == nil {
			s.log.Error("initialState: replay stopped", "err", err)
		}
	})
}

// replay pages every resource the journal has s replay, in the journal's order, from where it
// stands, waiting for each page to be recorded before it reads the next.
func (d *Dispatcher) replay(ctx context.Context, s *Sink) error {
	replaying := false
	defer func() {
		if replaying {
			s.m.replaying.Set(0)
		}
	}()
	for {
		st, err := d.journal.ReplayStatus(ctx, s)
		if err != nil || st.Done {
			return err
		}
		if !replaying {
			replaying = true
			s.m.replaying.Set(1)
		}
		if err := d.replayResource(ctx, s, st); err != nil {
			return err
		}
	}
}

// replayResource pages one resource to its end. A resource whose informers do not run is
// replayed empty: when they start, its objects come as its initial list brings them.
func (d *Dispatcher) replayResource(ctx context.Context, s *Sink, st journal.ReplayStatus) error {
	running, err := d.synced(ctx, st.Resource)
	if err != nil {
		return err
	}
	after := st.After
	for {
		size, err := d.pageSize(ctx, s)
		if err != nil {
			return err
		}
		var recorded <-chan int
		more := false
		read := running && d.cache.Page(st.Resource, after, size, func(objs []*object.Object, m bool) {
			more = m
			if len(objs) > 0 {
				after = object.KeyOf(objs[len(objs)-1])
			}
			recorded = d.journal.ReplayPage(s, st.Resource, objs, !m)
		})
		if !read {
			recorded = d.journal.ReplayPage(s, st.Resource, nil, true)
		}
		select {
		case n := <-recorded:
			s.m.initialState.Add(float64(n))
		case <-ctx.Done():
			return ctx.Err()
		}
		if !more {
			return nil
		}
	}
}

// synced waits until the resource gvr's informers have synced and the journal has recorded
// their initial lists, and returns true; false if, once discovery has placed every resource,
// no running resource is gvr.
func (d *Dispatcher) synced(ctx context.Context, gvr schema.GroupVersionResource) (bool, error) {
	tick := time.NewTicker(replayPoll)
	defer tick.Stop()
	for {
		running, synced, pending := d.cache.Lookup(gvr)
		if !running && !pending {
			return false, nil
		}
		if running && synced && d.journal.Synced(gvr) {
			return true, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// pageSize is how many objects to read next, once the sink's queue holds less than a page:
// the replay goes at the pace of the sink's deliveries, holding about a page in memory, and
// its recording and sending are spread over the time the sink takes rather than heaped up in
// front of the other sinks' events. (Without a state store, a full queue would also
// dead-letter what it cannot take.)
func (d *Dispatcher) pageSize(ctx context.Context, s *Sink) (int, error) {
	size := max(1, min(replayPageSize, s.cfg().QueueSize))
	tick := time.NewTicker(replayPoll)
	defer tick.Stop()
	for s.queue.Len() >= size || s.queue.Room() < size {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return size, nil
}
