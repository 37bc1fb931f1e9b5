package journal

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// Resuming a stream. An informer starting a stream of a resource asks the journal what it
// recorded of it (Resume). Since every event of a stream is recorded in the order the watch
// sent it, the objects' states are, after each commit, the stream's objects as of the revision
// of its last event: the journal writes that revision with the commit (recRevision), under the
// stream's selection (its selectors and transforms: a state recorded under another selection
// is not resumed from). The informer then takes those objects for its first list and watches
// from that revision: every change made while dynwatch was not running arrives in order, each
// version recorded and delivered, rather than compared with the state as one change per object.
// An event older than an object's recorded state (a relist passed the revision without an event
// after it to record) is stale and passed over. A revision the apiserver no longer holds ends
// the watch with "too old"; the informer lists again, as before, and compares.

// resumption is what Resume answers.
type resumption struct {
	objects  [][]byte
	revision uint64
	ok       bool
}

// Resume implements dynamicinformer.Resumer: the JSON of the objects of gvr's stream (a
// namespace, "" for all) as recorded, and the revision through which they hold every change,
// if they were recorded under selection; from then on the stream's events are recorded under
// selection. Without a store there is nothing to resume from.
func (j *Journal) Resume(ctx context.Context, gvr schema.GroupVersionResource, stream, selection string) ([][]byte, uint64, bool, error) {
	if j.store == nil {
		return nil, 0, false, nil
	}
	if j.pre != nil {
		j.pre.drain()
	}
	reply := make(chan resumption, 1)
	j.submit(op{kind: opResume, control: &control{gvr: gvr, stream: stream, sel: selection, resumed: reply}})
	select {
	case r := <-reply:
		return r.objects, r.revision, r.ok, nil
	case <-ctx.Done():
		return nil, 0, false, ctx.Err()
	}
}

// resumption reads what is recorded of gvr's stream under selection; called by the journal's
// goroutine between commits.
func (j *Journal) resumption(gvr schema.GroupVersionResource, stream, selection string) resumption {
	res := object.ResourceName(gvr)
	r, ok := j.store.revisions[res][stream]
	if !ok || r.selection != selection || r.rev == 0 {
		return resumption{}
	}
	var objs [][]byte
	for key, st := range j.store.objects[res] {
		if ns, _, namespaced := strings.Cut(key, "/"); stream != "" && (!namespaced || ns != stream) {
			continue
		}
		b, err := j.store.json(st)
		if err != nil {
			j.log.Warn("state store: a stream is listed again rather than resumed", "resource", res, "stream", stream, "err", err)
			return resumption{}
		}
		objs = append(objs, b)
	}
	return resumption{objects: objs, revision: r.rev, ok: true}
}
