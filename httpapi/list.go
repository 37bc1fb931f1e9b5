package httpapi

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gin-gonic/gin"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// list answers a list: a page of the objects the query selects from a snapshot of the cache, the
// objects written from the bytes the cache keeps (responder.list), with a continue token for
// the next.
func (a *api) list(c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.RequestTimeout)
	defer cancel()
	// Every page reads the first page's snapshot, at its resourceVersion: it holds every change
	// up to it and none after.
	gvr, _, _ := res.API()
	snap, rv, pinned, kept := a.listSnapshot(res, t.namespace, q)
	if !kept {
		writeStatus(c.Writer, expiredContinue(q.after))
		return
	}
	l, serr := q.candidates(res, snap)
	if serr != nil {
		writeStatus(c.Writer, serr)
		return
	}
	p, err := q.paginate(ctx, l, t.namespace)
	if err != nil {
		a.interrupted(c)
		return
	}
	if p.last != "" {
		if pinned == 0 {
			pinned = a.pins.pin(gvr, snap)
		}
		p.next = encodeContinue(rv, p.last, pinned)
	}
	c.Header("X-Dynwatch-Lookup", l.strategy)
	out.list(c.Writer, p, rv)
}

// expiredContinue is the 410 Gone of a later page whose first page's snapshot is no longer kept.
// As the apiserver's once etcd has compacted the first page's revision, its status carries a
// continue token that lists on after the last key the client was sent, from the cache as it is
// then: the rest of the list, though not consistent with the pages before.
func expiredContinue(after string) *apierrors.StatusError {
	err := apierrors.NewResourceExpired("the provided continue parameter is too old to display a consistent list result. " +
		"You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. " +
		"Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
	err.ErrStatus.Continue = encodeContinue("", after, 0)
	return err
}

// listSnapshot is the snapshot a list's page reads, with the list's resourceVersion and the
// id it is pinned under: for a first page, or a page from an expired list's token (see
// expiredContinue), the cache now (not pinned yet, id 0); for a later one, its first page's,
// and false once that is no longer kept.
func (a *api) listSnapshot(res *dynamicinformer.Resource, namespace string, q *query) (dynamicinformer.Snapshot, string, uint64, bool) {
	if q.after == "" || q.pinned == 0 {
		snap := res.Snapshot()
		return snap, strconv.FormatUint(snap.Revision(namespace), 10), 0, true
	}
	// A later page read from the cache as it is now, not from its first page's snapshot, for
	// the test that shows validate.Paged failing on a broken build (a failpoint: see
	// test/runner.BuildWithFailpoints).
	// gofail: var pageFromCacheNow struct{}
	// { now := res.Snapshot(); return now, strconv.FormatUint(now.Revision(namespace), 10), q.pinned, true }
	gvr, _, _ := res.API()
	snap, ok := a.pins.get(q.pinned, gvr)
	return snap, q.listRV, q.pinned, ok
}

// interrupted ends a request whose work was cut short: by its client going away (nobody to
// answer) or by api.requestTimeout (504, as the apiserver answers).
func (a *api) interrupted(c *gin.Context) {
	if c.Request.Context().Err() != nil {
		c.Abort()
		return
	}
	a.reject(c, rejectRequestTimeout, apierrors.NewTimeoutError(fmt.Sprintf("request did not complete within %s", a.RequestTimeout), 0))
}
