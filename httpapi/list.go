package httpapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// checkOptions checks the list options of a list or a watch as the apiserver does (422 Invalid):
// resourceVersionMatch with a resourceVersion, sendInitialEvents only on a watch and with
// resourceVersionMatch NotOlderThan.
func checkOptions(opts internalversion.ListOptions, watch bool) *apierrors.StatusError {
	opts.Watch = watch
	if errs := validation.ValidateListOptions(&opts, true); len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return nil
}

// list answers a list: a page of the objects the query selects from a snapshot of the cache, the
// objects written from the bytes the cache keeps (responder.list), with a continue token for
// the next.
func (a *api) list(c *gin.Context, res *dynamicinformer.Resource, t target, q *query, out responder) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.RequestTimeout)
	defer cancel()
	// Every page reads the first page's snapshot, at its resourceVersion: it holds every change
	// up to it and none after.
	gvr, _, _ := res.API()
	if serr := checkOptions(q.options, false); serr != nil {
		writeStatus(c.Writer, serr)
		return
	}
	if rev, past := a.pastRevision(res, t, q); past {
		a.past(ctx, c, res, t, q, out, rev)
		return
	}
	snap, rv, pinned, kept := a.listSnapshot(res, t.namespace, q)
	if !kept {
		writeStatus(c.Writer, expiredContinue(q.after))
		return
	}
	if q.after == "" {
		var serr *apierrors.StatusError
		if snap, rv, serr = a.atRevision(ctx, res, t.namespace, q, snap); serr != nil {
			writeStatus(c.Writer, serr)
			return
		}
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

// blockTimeout is how long a list waits for the cache to reach a resourceVersion it has not
// reached yet, as the apiserver's watch cache waits.
const blockTimeout = 3 * time.Second

// atRevision is the snapshot a first page reads for q's resourceVersion and
// resourceVersionMatch, and its resourceVersion, as the apiserver's watch cache answers them:
// none, or 0, the cache now (snap); a resourceVersion the cache has not reached yet, the cache
// once it has, waiting up to blockTimeout, and after that 504 Too large resource version; with
// resourceVersionMatch NotOlderThan (or none), the cache now; with Exact, the cache now if it is
// at exactly that resourceVersion, else 410 Expired, since the cache keeps no past state. Every
// namespace of a resource watched namespace by namespace is at the oldest of their revisions,
// while some are newer (see Snapshot.Revision): it is not waited for, since a quiet namespace
// moves only with its next bookmark.
func (a *api) atRevision(ctx context.Context, res *dynamicinformer.Resource, namespace string, q *query, snap dynamicinformer.Snapshot) (dynamicinformer.Snapshot, string, *apierrors.StatusError) {
	want, cur := q.resourceVersion, snap.Revision(namespace)
	if want > cur && snap.Exact(namespace) {
		wait, cancel := context.WithTimeout(ctx, blockTimeout)
		defer cancel()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for cur < want {
			select {
			case <-wait.Done():
				err := storage.NewTooLargeResourceVersionError(want, cur, 1)
				var serr *apierrors.StatusError
				errors.As(err, &serr)
				return snap, "", serr
			case <-tick.C:
				snap = res.Snapshot()
				cur = snap.Revision(namespace)
			}
		}
	}
	if q.options.ResourceVersionMatch == metav1.ResourceVersionMatchExact && want != cur {
		return snap, "", apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d", want))
	}
	return snap, strconv.FormatUint(cur, 10), nil
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
