package dynamicinformer

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dynwatch/dynwatch/config"
)

// Resumer is implemented by a subscriber that records every event of a stream in the order
// the watch sent it, and so holds the stream's objects as of a revision: that of the last
// event it recorded. An informer of whole objects (not metadata only, without a
// namespaceSelector) starts its stream from there rather than from a list: its initial events
// are those objects, and its watch starts at that revision, so that every change made while
// dynwatch was not running reaches the subscribers in order, each version of it, rather than
// as one change per object found by comparing a list with what was recorded.
type Resumer interface {
	// Resume is the JSON of the objects recorded of gvr's stream (a namespace, "" for all) and
	// the revision through which they hold every change, if they were recorded under selection
	// (see selectionOf); ok is false when there is nothing to resume from. From then on the
	// stream's events are recorded under selection.
	Resume(ctx context.Context, gvr schema.GroupVersionResource, stream, selection string) (objects [][]byte, revision uint64, ok bool, err error)
}

// selectionOf is what decides which objects of a resource's stream are cached, and as what:
// its selectors and transforms. A stream recorded under another selection is not resumed.
func selectionOf(r *config.Resource) string {
	t := r.Transform
	return fmt.Sprintf("labels=%s;fields=%s;stripManagedFields=%t;stripLastApplied=%t;keepSecretData=%t;removeFields=%q",
		r.Labels.String(), r.Exclusions().String(), *t.StripManagedFields, *t.StripLastAppliedConfiguration, t.KeepSecretData, t.RemoveFields)
}

// resume is how a stream's informer resumes: once, at its first list or watch-list.
type resume struct {
	from      Resumer
	stream    string
	selection string
	tried     atomic.Bool
}

// take asks the Resumer, the first time only, for what it recorded of the stream.
func (r *resume) take(ctx context.Context, gvr schema.GroupVersionResource) ([][]byte, uint64, bool, error) {
	if r == nil || r.from == nil || r.tried.Swap(true) {
		return nil, 0, false, nil
	}
	return r.from.Resume(ctx, gvr, r.stream, r.selection)
}

// resumeList is a list of the recorded objects, which it keeps, at the recorded revision.
func (l jsonLister) resumeList(objs [][]byte, rev uint64) (*wireList, error) {
	list := &wireList{Items: make([]*wire, 0, len(objs))}
	list.ResourceVersion = strconv.FormatUint(rev, 10)
	for _, b := range objs {
		// Kept as it is: it was recorded as the cache kept it, under the same transforms (see
		// selectionOf); a resource whose objects are decoded strips them again.
		w, err := newWire(b, false)
		if err != nil {
			return nil, fmt.Errorf("a recorded object: %w", err)
		}
		w.cut = l.read.cuts != nil
		list.Items = append(list.Items, w)
	}
	return list, nil
}

// resumeWatch is a watch-list stream made of what was recorded: an ADDED of each object, the
// bookmark that ends the initial events at the recorded revision, then the apiserver's watch
// from that revision, with o's selectors. A revision the apiserver no longer holds ends it with
// the apiserver's error, as a watch-list's would.
func (l jsonLister) resumeWatch(ctx context.Context, o metav1.ListOptions, list *wireList) watch.Interface {
	w := newRelay(nil) // the apiserver's watch is opened, and stopped, by the goroutine
	go func() {
		defer close(w.out)
		for _, obj := range list.Items {
			if !w.send(watch.Event{Type: watch.Added, Object: obj}) {
				return
			}
		}
		end := &wire{}
		end.ResourceVersion = list.ResourceVersion
		end.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		if !w.send(watch.Event{Type: watch.Bookmark, Object: end}) {
			return
		}
		o.ResourceVersion, o.ResourceVersionMatch, o.SendInitialEvents, o.AllowWatchBookmarks = list.ResourceVersion, "", nil, true
		in, err := l.watch(ctx, o)
		if err != nil {
			w.send(watch.Event{Type: watch.Error, Object: statusOf(err)})
			return
		}
		defer in.Stop()
		for {
			select {
			case e, ok := <-in.ResultChan():
				if !ok || !w.send(e) {
					return
				}
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

// statusOf is err as the apiserver's Status.
func statusOf(err error) *metav1.Status {
	if s, ok := err.(apierrors.APIStatus); ok {
		st := s.Status()
		return &st
	}
	return &apierrors.NewInternalError(err).ErrStatus
}
