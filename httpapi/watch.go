package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
)

// watcherBuffer is how many events a watcher may fall behind before it is disconnected; the
// client then resumes from its last resourceVersion, as with the apiserver.
const watcherBuffer = 1024

// Hub fans informer events out to the API's watchers and keeps, per resource, the last
// History events, so that a watch can resume from a recent resourceVersion. It is a
// dynamicinformer.Subscriber: OnEvent never blocks, and a watcher that cannot keep up is
// disconnected rather than slowing the informer.
type Hub struct {
	history int
	mu      sync.Mutex
	streams map[schema.GroupVersionResource]*stream
}

// NewHub returns a Hub that keeps history events per resource.
func NewHub(history int) *Hub {
	return &Hub{history: history, streams: map[schema.GroupVersionResource]*stream{}}
}

// OnEvent implements dynamicinformer.Subscriber.
func (h *Hub) OnEvent(e object.Event) { h.stream(e.Resource).publish(e) }

func (h *Hub) stream(gvr schema.GroupVersionResource) *stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.streams[gvr]
	if !ok {
		s = &stream{ring: make([]object.Event, h.history), watchers: map[*watcher]struct{}{}}
		h.streams[gvr] = s
	}
	return s
}

// stream is one resource's recent history and watchers.
type stream struct {
	mu       sync.Mutex
	ring     []object.Event // circular: the last n events end at next-1
	next, n  int
	floor    uint64 // watches from a resourceVersion below this cannot be served (410)
	watchers map[*watcher]struct{}
}

// watcher is one watch's queue. An idle watcher holds no buffer: pending grows only while
// events wait to be written, up to watcherBuffer.
type watcher struct {
	// pending and done are guarded by the stream's mu. done is set when the watcher fell
	// behind or was unsubscribed: what is pending is still written, then the watch ends.
	pending []object.Event
	done    bool
	wake    chan struct{} // capacity 1: a value means pending or done changed
	minRV   uint64        // events at or below this are already known to the client
}

func rvOf(o *object.Object) uint64 { return object.Revision(o.GetResourceVersion()) }

// revisionOf is the revision at which e happened: its Revision, which for an object brought in
// by its namespace joining a namespaceSelector is when it joined, not its resourceVersion.
func revisionOf(e object.Event) uint64 {
	if e.Revision != 0 {
		return e.Revision
	}
	return rvOf(e.Object)
}

// after reports whether a watch from resourceVersion rv is to get e: e happened after rv, or
// e is one of the objects a selection's change brought in or took out at rv. Those share the
// selection's revision (see served), and a client that resumes from it may have been sent only
// some of them: it gets them all again, a repeat rather than a loss.
func after(e object.Event, rv uint64) bool {
	r := revisionOf(e)
	return r > rv || r == rv && e.Moved
}

// served is the object a watch event carries: e's, or for an object that came in or went out
// with its namespace (Event.Moved) a copy at the selection's revision. The object's own
// resourceVersion is older than the events the watch has sent before it, and a client resumes
// from the last one it was sent: so a watch's resourceVersions never go back, and a client
// that resumes from the transition gets what followed it (see after). A list or get still
// gives the object's own.
func served(e object.Event) *object.Object {
	if !e.Moved || e.Revision == 0 || e.Revision == rvOf(e.Object) {
		return e.Object
	}
	u, err := e.Object.Decode()
	if err != nil {
		return e.Object // no copy to be had: the object as it is, as before the transition's revision was served
	}
	u.SetResourceVersion(strconv.FormatUint(e.Revision, 10))
	return object.New(u)
}

// servedAs is the object a watch event of type typ carries for e: for an update that takes the
// object out of the watch's selection, the object as it was, the last state the watch selected,
// at the update's resourceVersion, as the apiserver sends it (its watch cache's
// convertToWatchEvent); otherwise served(e).
func servedAs(typ string, e object.Event) *object.Object {
	if typ != string(object.Deleted) || e.Type != object.Modified || e.OldObject == nil {
		return served(e)
	}
	u, err := e.OldObject.Decode()
	if err != nil {
		return e.Object // no copy to be had: the object as it is now, which the watch no longer selects
	}
	u.SetResourceVersion(strconv.FormatUint(revisionOf(e), 10))
	return object.New(u)
}

func (s *stream) publish(e object.Event) {
	rv := revisionOf(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if relisted(e) {
		// The informer listed again after its watch broke: the changes its list found are not
		// in resourceVersion order, and what happened between them is not known. As the
		// apiserver does when its watch cache lists again, every watch ends, and one resumed from
		// before the list is refused (410): its client lists again.
		s.floor = max(s.floor, rv)
		for w := range s.watchers {
			w.done = true
			delete(s.watchers, w)
			w.signal()
		}
		return
	}
	if e.InitialList {
		// The informer (re)listed: history before its list cannot be replayed.
		s.floor = max(s.floor, rv)
	} else if len(s.ring) > 0 {
		if s.n == len(s.ring) {
			s.floor = max(s.floor, revisionOf(s.ring[s.next]))
		} else {
			s.n++
		}
		s.ring[s.next] = e
		s.next = (s.next + 1) % len(s.ring)
	}
	for w := range s.watchers {
		if !after(e, w.minRV) {
			continue
		}
		if len(w.pending) >= watcherBuffer { // too slow: disconnect it
			w.done = true
			delete(s.watchers, w)
		} else {
			w.pending = append(w.pending, e)
		}
		w.signal()
	}
}

// relisted reports whether e is a change a relist found (see dynamicinformer's Resource.replace):
// neither in a watch's order, nor from an initial list or a namespace's coming or going.
func relisted(e object.Event) bool { return !e.InOrder && !e.InitialList && !e.Moved }

func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns the pending events, and whether the watch must end once they are written.
func (s *stream) take(w *watcher) ([]object.Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := w.pending
	w.pending = nil
	return batch, w.done
}

// follow registers a watcher that gets every event published from now on. Called within
// Resource.Read, it gets exactly the changes to the snapshot Read gives.
func (s *stream) follow() *watcher {
	w := &watcher{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers[w] = struct{}{}
	return w
}

// resume registers a watcher that gets every change after resourceVersion rv: those in the
// history first, then every later one; it fails with 410 Gone when the history no longer
// reaches back that far.
func (s *stream) resume(rv uint64) (*watcher, *apierrors.StatusError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv < s.floor {
		return nil, apierrors.NewResourceExpired("too old resource version: " + strconv.FormatUint(rv, 10) + " (" + strconv.FormatUint(s.floor, 10) + ")")
	}
	var replay []object.Event
	for i := range s.n {
		e := s.ring[(s.next-s.n+i+len(s.ring))%len(s.ring)]
		if after(e, rv) {
			replay = append(replay, e)
		}
	}
	w := &watcher{wake: make(chan struct{}, 1), minRV: rv, pending: replay}
	w.signal()
	s.watchers[w] = struct{}{}
	return w, nil
}

func (s *stream) unsubscribe(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers, w)
	w.done = true
}

// transition is the watch event type a change is for this query, "" if none: an object that
// starts or stops matching the selectors is ADDED or DELETED, as with the apiserver.
func (q *query) transition(e object.Event, namespace string) string {
	now := q.matches(e.Object, namespace)
	switch e.Type {
	case object.Modified:
		was := q.matches(e.OldObject, namespace)
		switch {
		case now && was:
			return string(object.Modified)
		case now:
			return string(object.Added)
		case was:
			return string(object.Deleted)
		}
		return ""
	default:
		if now {
			return string(e.Type)
		}
		return ""
	}
}

// watch streams watch events, one JSON object per line: with no resourceVersion (or
// sendInitialEvents), the current matching objects as ADDED first, read in key order from a
// snapshot of the cache, then every change to that snapshot; from a resourceVersion, every
// change after it.
func (a *api) watch(c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder) {
	q.name = t.name
	gvr, _, _ := res.API()
	s := a.Watches.stream(gvr)
	var w *watcher
	var snap dynamicinformer.Snapshot
	var serr *apierrors.StatusError
	var fromPast func(func(object.Event) bool) error
	initial := q.resourceVersion == 0 || q.sendInitialEvents
	if initial {
		if !res.Read(func(sn dynamicinformer.Snapshot) { snap, w = sn, s.follow() }) {
			serr = apierrors.NewServiceUnavailable(res.Name() + " is not watched now")
		}
	} else if w, serr = s.resume(q.resourceVersion); serr != nil && a.History != nil {
		// Older than the hub's events: from the history, where it reaches that far.
		ww, replay, herr := a.fromHistory(c.Request.Context(), res, s, q.resourceVersion, q)
		if ww != nil {
			w, serr, fromPast = ww, nil, replay
		} else if herr != nil {
			serr = herr
		}
	}
	timeout := a.MaxWatchTimeout
	if q.timeoutSeconds > 0 {
		timeout = min(timeout, time.Duration(q.timeoutSeconds)*time.Second)
	}
	streaming(c.Writer, timeout+a.RequestTimeout)
	c.Header("Content-Type", "application/json")
	c.Status(http.StatusOK)
	if serr != nil {
		// As the apiserver does: the watch starts, and its one event is the error (410 Expired
		// for a resourceVersion older than the history), which clients answer with a relist.
		_, _ = c.Writer.Write(errorEvent(serr))
		return
	}
	defer s.unsubscribe(w)
	c.Writer.Flush()

	first := true
	send := func(typ string, obj *object.Object) bool {
		_, err := c.Writer.Write(out.event(typ, obj, first))
		first = false
		c.Writer.Flush()
		return err == nil
	}
	if initial && !a.sendInitial(c.Request.Context(), res, snap, t, q, send) {
		return
	}
	if fromPast != nil {
		ok := true
		err := fromPast(func(e object.Event) bool {
			if typ := q.transition(e, t.namespace); typ != "" {
				ok = send(typ, servedAs(typ, e))
			}
			return ok
		})
		if err != nil || !ok {
			return // the client resumes from the last resourceVersion it was sent
		}
	}
	if q.sendInitialEvents && q.allowWatchBookmarks {
		bookmark := &unstructured.Unstructured{}
		bookmark.SetGroupVersionKind(out.gvk)
		bookmark.SetResourceVersion(strconv.FormatUint(snap.Revision(t.namespace), 10))
		bookmark.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		if !send("BOOKMARK", object.New(bookmark)) {
			return
		}
	}
	sendChanges(c.Request.Context(), s, w, t, q, timeout, send)
}

// sendInitial sends what of snap the watch sees as ADDED, in key order, and reports whether
// the watch goes on: false once the client is gone or a write failed.
func (a *api) sendInitial(ctx context.Context, res *dynamicinformer.Resource, snap dynamicinformer.Snapshot, t target, q *query, send func(string, *object.Object) bool) bool {
	sent, ok := 0, true
	visible(res, snap, t.namespace, q, func(o *object.Object) bool {
		if sent%checkEvery == 0 && ctx.Err() != nil {
			ok = false
			return false
		}
		if q.matches(o, t.namespace) {
			sent++
			// The first initial object lost, for the test that shows validate.InitialState
			// failing on a broken build (a failpoint: see test/runner.BuildWithFailpoints).
			// gofail: var loseFirstInitialObject struct{}
			// if sent == 1 { return true }
			ok = send(string(object.Added), o)
		}
		return ok
	})
	a.watchInitial.Add(float64(sent))
	return ok
}

// sendChanges sends what the watcher w of s is handed, as the watch sees it, until the stream
// ends it, timeout passes, the client goes away (ctx) or a write fails.
func sendChanges(ctx context.Context, s *stream, w *watcher, t target, q *query, timeout time.Duration, send func(string, *object.Object) bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-w.wake:
			batch, done := s.take(w)
			for _, e := range batch {
				typ := q.transition(e, t.namespace)
				if typ == "" {
					continue
				}
				// Broken builds, for the test that shows validate.Bookmarkable and
				// validate.Atomic failing on them (failpoints: see
				// test/runner.BuildWithFailpoints): a bookmark at each change's
				// resourceVersion before it, and each change served at the next one.
				// gofail: var bookmarkAtChange struct{}
				// if !send("BOOKMARK", servedAs(typ, e)) { return }
				obj := servedAs(typ, e)
				// gofail: var serveAtNextRevision struct{}
				// if u, err := obj.Decode(); err == nil { u.SetResourceVersion(strconv.FormatUint(rvOf(obj)+1, 10)); obj = object.New(u) }
				if !send(typ, obj) {
					return
				}
			}
			if done {
				return
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// visible calls fn, in key order until it returns false, with what a watch in namespace (""
// for all) with query q may see of snap: the one object a metadata.name field selector names,
// or the candidates a list would read (an index's objects, the namespace's, or every object).
// So opening a watch costs what its caller may see, not the whole cache.
func visible(res *dynamicinformer.Resource, snap dynamicinformer.Snapshot, namespace string, q *query, fn func(*object.Object) bool) {
	_, api, _ := res.API()
	if name, ok := nameSelected(q); ok && (namespace != "" || !api.Namespaced) {
		if o, found := snap.Get(namespace, name); found {
			fn(o)
		}
		return
	}
	l, serr := q.candidates(res, snap)
	if serr != nil || l.inOrder {
		if serr != nil {
			l.ordered = snap
		}
		l.ordered.Scan(namespace, dynamicinformer.Key{}, fn)
		return
	}
	for _, o := range l.objs {
		if !fn(o) {
			return
		}
	}
}

// nameSelected is the name a metadata.name=... field selector names, if q has one.
func nameSelected(q *query) (string, bool) {
	for _, req := range q.fields.Requirements() {
		if req.Field == "metadata.name" && (req.Operator == selection.Equals || req.Operator == selection.DoubleEquals) {
			return req.Value, true
		}
	}
	return "", false
}

// errorEvent is a watch stream's ERROR event carrying err's Status.
func errorEvent(err *apierrors.StatusError) []byte {
	st := statusOf(err)
	b, _ := json.Marshal(struct {
		Type   string         `json:"type"`
		Object *metav1.Status `json:"object"`
	}{"ERROR", &st})
	return append(b, '\n')
}
