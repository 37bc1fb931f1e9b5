package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
