package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/history"
	"github.com/dynwatch/dynwatch/object"
)

// History is the histories of the resources that keep one (package history).
type History interface {
	// Of is gvr's history; false when it keeps none.
	Of(gvr schema.GroupVersionResource) (*history.Log, bool)
	// Stats are what each history holds, for /status.
	Stats() []history.Stats
	// Barrier marks what the histories were handed so far, and Sync waits until they hold it
	// (see history.Recorder.Barrier).
	Barrier() uint64
	Sync(ctx context.Context, mark uint64) error
}

// The kind a revisions subresource answers.
const (
	revisionsAPIVersion = "history.dynwatch.io/v1alpha1"
	revisionsKind       = "RevisionList"
)

// revisionsSubresource is the subresource of an object that lists its revisions.
const revisionsSubresource = "revisions"

// Revision is one version of an object in a RevisionList.
type Revision struct {
	ResourceVersion string    `json:"resourceVersion"`
	Time            time.Time `json:"time"`
	Type            string    `json:"type"`
	// Listed is set for a version a list found rather than a watch: it may stand for several
	// changes made while dynwatch was not watching.
	Listed   bool            `json:"listed,omitempty"`
	Managers json.RawMessage `json:"managers,omitempty"`
	Object   json.RawMessage `json:"object"`
}

// historyOf is res's history, or the 404 of a resource that keeps none.
func (a *api) historyOf(res *dynamicinformer.Resource) (*history.Log, *apierrors.StatusError) {
	gvr, _, _ := res.API()
	if a.History != nil {
		if l, ok := a.History.Of(gvr); ok {
			return l, nil
		}
	}
	return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
		Details: &metav1.StatusDetails{Group: gvr.Group, Kind: gvr.Resource},
		Message: res.Name() + " keeps no history: its configuration sets no history.retain"}}
}

// revisions answers GET …/{name}/revisions: every retained version of the object, newest first,
// as a RevisionList; with from and to (two of its resourceVersions), the JSON Patch from the
// one to the other.
func (a *api) revisions(c *gin.Context, res *dynamicinformer.Resource, t target) {
	w := c.Writer
	l, serr := a.historyOf(res)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.RequestTimeout)
	defer cancel()
	v := c.Request.URL.Query()
	limit := 0
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeStatus(w, badParameter("limit", "must be a non-negative integer, got %q", s))
			return
		}
		limit = n
	}
	if v.Has("from") || v.Has("to") {
		a.revisionPatch(ctx, c, res, l, t, v.Get("from"), v.Get("to"))
		return
	}
	key := object.Key(t.namespace, t.name)
	var items []Revision
	err := l.Revisions(ctx, key, func(ver history.Version) bool {
		items = append(items, asRevision(ver))
		return limit == 0 || len(items) < limit
	})
	if err != nil {
		a.historyFailed(c, err)
		return
	}
	if len(items) == 0 {
		gvr, _, _ := res.API()
		writeStatus(w, apierrors.NewNotFound(schema.GroupResource{Group: gvr.Group, Resource: gvr.Resource + "/" + revisionsSubresource}, t.name))
		return
	}
	snap := res.Snapshot()
	writeJSON(w, http.StatusOK, struct {
		Kind       string            `json:"kind"`
		APIVersion string            `json:"apiVersion"`
		Metadata   map[string]string `json:"metadata"`
		Items      []Revision        `json:"items"`
	}{revisionsKind, revisionsAPIVersion, map[string]string{"resourceVersion": strconv.FormatUint(snap.Revision(t.namespace), 10)}, items})
}

func asRevision(v history.Version) Revision {
	r := Revision{ResourceVersion: strconv.FormatUint(v.Revision, 10), Time: v.Time.UTC(), Type: string(v.Type), Listed: v.Listed, Object: v.Object.JSON()}
	if len(v.Managers) > 0 {
		r.Managers = v.Managers
	}
	return r
}

// revisionPatch answers the JSON Patch between the object's versions at resourceVersions from
// and to.
func (a *api) revisionPatch(ctx context.Context, c *gin.Context, res *dynamicinformer.Resource, l *history.Log, t target, from, to string) {
	w := c.Writer
	want := map[string][]byte{}
	for param, rv := range map[string]string{"from": from, "to": to} {
		if _, err := strconv.ParseUint(rv, 10, 64); err != nil {
			writeStatus(w, badParameter(param, "must be a resourceVersion of one of the object's revisions, got %q", rv))
			return
		}
		want[rv] = nil
	}
	err := l.Revisions(ctx, object.Key(t.namespace, t.name), func(ver history.Version) bool {
		rv := strconv.FormatUint(ver.Revision, 10)
		if b, asked := want[rv]; asked && b == nil {
			want[rv] = ver.Object.JSON()
		}
		return slices.ContainsFunc([]string{from, to}, func(rv string) bool { return want[rv] == nil })
	})
	if err != nil {
		a.historyFailed(c, err)
		return
	}
	gvr, _, _ := res.API()
	for param, rv := range map[string]string{"from": from, "to": to} {
		if want[rv] == nil {
			writeStatus(w, apierrors.NewNotFound(schema.GroupResource{Group: gvr.Group, Resource: gvr.Resource + "/" + revisionsSubresource},
				t.name+"@"+rv+" (the "+param+" revision)"))
			return
		}
	}
	patch, err := object.JSONPatch(want[from], want[to])
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", "application/json-patch+json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(bytes.TrimSpace(patch), '\n'))
}

// deleted answers a list with deleted=true: the objects deleted within the history's reach
// that the query selects, each as it was last, at its delete's resourceVersion, in key order.
func (a *api) deleted(c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder) {
	l, serr := a.historyOf(res)
	if serr != nil {
		writeStatus(c.Writer, serr)
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.RequestTimeout)
	defer cancel()
	var objs []*object.Object
	err := l.Deleted(ctx, func(v history.Version) bool {
		if t.namespace == "" || v.Object.GetNamespace() == t.namespace {
			objs = append(objs, v.Object)
		}
		return true
	})
	if err != nil {
		a.historyFailed(c, err)
		return
	}
	p, err := q.paginate(ctx, lookup{strategy: "history", objs: objs}, t.namespace)
	if err != nil {
		a.interrupted(c)
		return
	}
	if p.last != "" {
		p.next = encodeContinue("", p.last, 0)
	}
	c.Header("X-Dynwatch-Lookup", "history")
	out.list(c.Writer, p, strconv.FormatUint(res.Snapshot().Revision(t.namespace), 10))
}

// errHistoryRead is what a caller is told of a read of a history that failed: the cause is
// the operator's, in the log.
var errHistoryRead = errors.New("the history could not be read; the log says why")

// historyFailed answers a read of a history that failed: one cut short as a request is (see
// interrupted), one that found a segment dropped as a revision too old (410), anything else
// as a 500 that names nothing internal, logged.
func (a *api) historyFailed(c *gin.Context, err error) {
	switch {
	case c.Request.Context().Err() != nil || errors.Is(err, context.DeadlineExceeded):
		a.interrupted(c)
	case errors.Is(err, history.ErrMovedOn):
		writeStatus(c.Writer, apierrors.NewResourceExpired("the history moved on while it was read: ask again"))
	default:
		a.Logger.Error("history: a read failed", "err", err)
		writeStatus(c.Writer, apierrors.NewInternalError(errHistoryRead))
	}
}

// timeTravel is res's history when it answers lists at past resourceVersions and watches from
// them: a resource watched in one stream (the history's changes are then in resourceVersion
// order), without a namespaceSelector (whose comings and goings the history does not keep).
func (a *api) timeTravel(res *dynamicinformer.Resource, snap dynamicinformer.Snapshot) (*history.Log, bool) {
	if a.History == nil || !snap.OneStream() || res.Config().Namespaced != nil {
		return nil, false
	}
	gvr, _, _ := res.API()
	return a.History.Of(gvr)
}

// pastRevision is the past resourceVersion a list asks for, when the history answers it: a first
// page with resourceVersionMatch=Exact at a resourceVersion the cache has passed, or a later
// page of such a list.
func (a *api) pastRevision(res *dynamicinformer.Resource, t target, q *query) (uint64, bool) {
	if q.past {
		rev, err := strconv.ParseUint(q.listRV, 10, 64)
		return rev, err == nil
	}
	if q.after != "" || q.options.ResourceVersionMatch != metav1.ResourceVersionMatchExact || q.resourceVersion == 0 {
		return 0, false
	}
	snap := res.Snapshot()
	if _, ok := a.timeTravel(res, snap); !ok || q.resourceVersion >= snap.Revision(t.namespace) {
		return 0, false
	}
	return q.resourceVersion, true
}

// past answers a page of a list at the past resourceVersion rev from the history: the objects
// that existed then, as they were then, that the query selects, in key order. The cache now,
// with each object changed since as the history says it was at rev: the same items at the same
// resourceVersions the apiserver answers from etcd while etcd holds rev. A resourceVersion before
// the history's floor is 410 Expired, as the apiserver's for a compacted revision.
func (a *api) past(ctx context.Context, c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder, rev uint64) {
	w := c.Writer
	if q.index != "" {
		writeStatus(w, badParameter("index", "not with a list at a past resourceVersion"))
		return
	}
	snap, l, serr := a.settled(ctx, c, res)
	if serr != nil || l == nil {
		if serr != nil {
			writeStatus(w, serr)
		}
		return
	}
	if rev > snap.Revision(t.namespace) {
		writeStatus(w, badParameter("continue", "invalid continue token")) // no list of the history was ever at it
		return
	}
	if floor, _ := l.Floor(); rev < floor {
		if q.past {
			writeStatus(w, expiredContinue(q.after))
		} else {
			writeStatus(w, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rev, floor)))
		}
		return
	}
	pg, done, err := pastPage(ctx, l, snap, t.namespace, q, rev)
	if err != nil {
		a.historyFailed(c, err)
		return
	}
	defer done() // the page's objects lie in the history's buffers until written
	listRV := strconv.FormatUint(rev, 10)
	if pg.last != "" {
		b, _ := json.Marshal(continueToken{RV: listRV, After: pg.last, Past: true})
		pg.next = base64.RawURLEncoding.EncodeToString(b)
	}
	c.Header("X-Dynwatch-Lookup", "history")
	out.list(w, pg, listRV)
}

// pastPage is the page of q after its cursor, in key order, of the objects in namespace as they
// were at rev: what snap holds from the cursor on, each object changed since read from the
// history as it was then, merged with what existed then and is deleted since. It reads the cache
// only as far as the page reaches, as a list now does, and from disk only the objects of the
// page changed since and those deleted since. It says no more than whether more follow (no
// remainingItemCount: that would read every object changed since). The page's objects are valid
// until done is called.
func pastPage(ctx context.Context, l *history.Log, snap dynamicinformer.Snapshot, namespace string, q *query, rev uint64) (pg page, done func(), err error) {
	p, err := l.Past(ctx, rev, snap.Revision(namespace))
	if err != nil {
		return page{}, nil, err
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	type gone struct {
		namespace, name string
		obj             *object.Object
	}
	var deleted []gone
	afterNS, afterName := object.SplitKey(q.after)
	if err := p.Gone(ctx, func(o *object.Object) bool {
		ns, name := o.GetNamespace(), o.GetName()
		if (namespace == "" || ns == namespace) && (q.after == "" || object.Compare(ns, name, afterNS, afterName) > 0) {
			deleted = append(deleted, gone{namespace: ns, name: name, obj: o})
		}
		return true
	}); err != nil {
		return page{}, nil, err
	}
	slices.SortFunc(deleted, func(a, b gone) int { return object.Compare(a.namespace, a.name, b.namespace, b.name) })
	var failed error
	// take adds obj, namespace/name, to the page as it was at rev; false once the page is full.
	// The key is not built: a page takes hundreds.
	take := func(ns, name string, obj *object.Object, held bool) bool {
		if held && p.Changed(ns, name) {
			then, changed, err := p.At(ns, name)
			if err != nil {
				failed = err
				return false
			}
			if changed {
				obj = then
			}
		}
		if obj == nil || !q.matches(obj, namespace) {
			return true
		}
		if len(pg.items) == q.limit {
			pg.last = object.KeyOf(pg.items[len(pg.items)-1])
			return false
		}
		pg.items = append(pg.items, obj)
		return true
	}
	var after dynamicinformer.Key
	if q.after != "" {
		after.Namespace, after.Name = afterNS, afterName
	}
	seen, full := 0, false
	snap.Scan(namespace, after, func(o *object.Object) bool {
		if seen++; seen%checkEvery == 0 && ctx.Err() != nil {
			failed = ctx.Err()
			return false
		}
		ns, name := o.GetNamespace(), o.GetName()
		for len(deleted) > 0 && object.Compare(deleted[0].namespace, deleted[0].name, ns, name) < 0 {
			if !take(deleted[0].namespace, deleted[0].name, deleted[0].obj, false) {
				full = true
				return false
			}
			deleted = deleted[1:]
		}
		if !take(ns, name, o, true) {
			full = true
			return false
		}
		return true
	})
	for !full && failed == nil && len(deleted) > 0 {
		full, deleted = !take(deleted[0].namespace, deleted[0].name, deleted[0].obj, false), deleted[1:]
	}
	if failed != nil {
		return page{}, nil, failed
	}
	return pg, p.Close, nil
}

// settled is a snapshot of res's cache and its history holding the same changes: every change
// the snapshot holds is in the history. A nil history with no error: the request was answered
// (interrupted).
func (a *api) settled(ctx context.Context, c *gin.Context, res *dynamicinformer.Resource) (dynamicinformer.Snapshot, *history.Log, *apierrors.StatusError) {
	var snap dynamicinformer.Snapshot
	var mark uint64
	if a.History == nil {
		return snap, nil, apierrors.NewResourceExpired(res.Name() + " keeps no history")
	}
	if !res.Read(func(sn dynamicinformer.Snapshot) { snap, mark = sn, a.History.Barrier() }) {
		return snap, nil, apierrors.NewServiceUnavailable(res.Name() + " is not watched now")
	}
	l, ok := a.timeTravel(res, snap)
	if !ok {
		return snap, nil, apierrors.NewResourceExpired("the history of " + res.Name() + " no longer answers this resourceVersion")
	}
	if err := a.History.Sync(ctx, mark); err != nil {
		a.interrupted(c)
		return snap, nil, nil
	}
	return snap, l, nil
}

// fromHistory opens a watch from rv, a resourceVersion older than the hub keeps events from, with
// the history: a watcher that follows the cache from a snapshot of it, and replay, which sends
// the history's changes after rv up to that snapshot. The 410 of a resource whose history does
// not reach rv.
func (a *api) fromHistory(ctx context.Context, res *dynamicinformer.Resource, s *stream, rv uint64, q *query) (*watcher, func(func(object.Event) bool) error, *apierrors.StatusError) {
	var snap dynamicinformer.Snapshot
	var w *watcher
	var mark uint64
	if !res.Read(func(sn dynamicinformer.Snapshot) { snap, w, mark = sn, s.follow(), a.History.Barrier() }) {
		return nil, nil, apierrors.NewServiceUnavailable(res.Name() + " is not watched now")
	}
	fail := func(serr *apierrors.StatusError) (*watcher, func(func(object.Event) bool) error, *apierrors.StatusError) {
		s.unsubscribe(w)
		return nil, nil, serr
	}
	l, ok := a.timeTravel(res, snap)
	if !ok {
		return fail(nil)
	}
	wait, cancel := context.WithTimeout(ctx, a.RequestTimeout)
	defer cancel()
	if err := a.History.Sync(wait, mark); err != nil {
		return fail(apierrors.NewTimeoutError("the history did not catch up with the cache in time", 1))
	}
	floor, _ := l.Floor()
	if rv < floor {
		return fail(apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, floor)))
	}
	until := snap.Revision("")
	gvr, _, _ := res.API()
	before := !q.labels.Empty() || !q.fields.Empty() // a change's type depends on the object before it
	replay := func(send func(object.Event) bool) error {
		return l.Changes(ctx, rv, before, func(c history.Change) bool {
			if c.Revision > until {
				return false // the watcher has it
			}
			e := object.Event{Type: c.Type, Resource: gvr, Object: c.Object, Managers: c.Managers, Revision: c.Revision, InOrder: true}
			if c.Type == object.Modified {
				e.OldObject = c.Before
				if e.OldObject == nil {
					e.OldObject = c.Object // no selector tells them apart
				}
			}
			return send(e)
		})
	}
	return w, replay, nil
}
