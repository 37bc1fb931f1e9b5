package httpapi

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// pinTTL is how long the later pages of a paged list can be read after its first: as long as
// the apiserver's continue tokens last, until etcd compacts their revision (5 minutes).
const pinTTL = 5 * time.Minute

// maxPins bounds the snapshots kept for paged lists. A kept snapshot costs nothing while the
// cache does not change, and the nodes of the cache's trees that changed since it was taken
// once they do; past the bound, the oldest goes, and its list's next page is 410 Gone.
const maxPins = 1024

// pins keeps the snapshot each paged list reads its later pages from, so that every page of a
// list shows the cache at the first page's resourceVersion, as the apiserver's pages do: a list
// followed by a watch from its resourceVersion misses nothing and repeats nothing, however many
// pages it took.
type pins struct {
	mu    sync.Mutex
	last  uint64
	kept  map[uint64]pin
	order []uint64 // ids in the order they were pinned, which is the order they expire in
	now   func() time.Time
}

type pin struct {
	gvr     schema.GroupVersionResource
	snap    dynamicinformer.Snapshot
	expires time.Time
}

func newPins(now func() time.Time) *pins { return &pins{kept: map[uint64]pin{}, now: now} }

// pin keeps snap, of resource gvr, for pinTTL, and returns its id.
func (p *pins) pin(gvr schema.GroupVersionResource, snap dynamicinformer.Snapshot) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(maxPins - 1)
	p.last++
	p.kept[p.last] = pin{gvr: gvr, snap: snap, expires: p.now().Add(pinTTL)}
	p.order = append(p.order, p.last)
	return p.last
}

// get is the snapshot of gvr pinned as id, false once it has expired (or was never pinned).
func (p *pins) get(id uint64, gvr schema.GroupVersionResource) (dynamicinformer.Snapshot, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(maxPins)
	k, ok := p.kept[id]
	if !ok || k.gvr != gvr {
		return dynamicinformer.Snapshot{}, false
	}
	return k.snap, true
}

// expire drops the expired snapshots, and the oldest while more than n are kept.
func (p *pins) expire(n int) {
	now := p.now()
	for len(p.order) > 0 {
		id := p.order[0]
		if len(p.order) <= n && now.Before(p.kept[id].expires) {
			return
		}
		delete(p.kept, id)
		p.order[0] = 0
		p.order = p.order[1:]
	}
}
