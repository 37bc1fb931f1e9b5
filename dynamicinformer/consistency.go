package dynamicinformer

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dynwatch/dynwatch/object"
)

// The outcomes of a consistency check, as dynwatch_informer_consistency_checks_total counts
// them: the cache equals the apiserver's list at its resourceVersion, differs from it, or could
// not be compared (the list failed: that resourceVersion compacted away, or the apiserver out
// of reach).
const (
	CheckSuccess = "success"
	CheckFailure = "failure"
	CheckError   = "error"
)

var checkResults = []string{CheckSuccess, CheckFailure, CheckError}

// checkPageSize is how many objects each page of a check's list holds, unless a benchmark
// says otherwise (Manager.checkPage). At 100,000 objects, pages of 5,000 cost the apiserver a
// quarter of the CPU pages of 500 do, and take a third of the time (BenchmarkConsistencyCheck);
// a page decoded holds about 10 MB.
const checkPageSize = 5000

// shownDifferences is how many differing objects a failed check names in its log and status.
const shownDifferences = 10

// Consistency is the outcome of a resource's last consistency check, as /status reports it.
type Consistency struct {
	LastCheckTime time.Time `json:"lastCheckTime"`
	// Result is success, failure or error; with several namespaces, the worst of their checks.
	Result string `json:"result"`
	// Objects is how many objects the cache held where it was compared.
	Objects int `json:"objects"`
	// Differences counts the objects the cache and the apiserver disagree on: missing from
	// one, or at another resourceVersion.
	Differences int    `json:"differences,omitempty"`
	Message     string `json:"message,omitempty"`
	// LastFailureTime is when a check last found the cache differing, if one ever did.
	LastFailureTime *time.Time `json:"lastFailureTime,omitempty"`
}

// checkConsistency compares the caches of the informers with the apiserver every period,
// jittered by up to a tenth, until ctx ends; the first check is a period after the start.
func (r *Resource) checkConsistency(ctx context.Context, gvr schema.GroupVersionResource, st *store, informers []namespaceInformer) {
	period := r.m.checkPeriod()
	t := time.NewTimer(wait.Jitter(period, 0.1))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.checkRound(ctx, gvr, st, informers)
		t.Reset(wait.Jitter(period, 0.1))
	}
}

// checkRound checks every informer's cache once they have all synced, counts and keeps the
// outcome, and makes an informer whose cache differs list again.
func (r *Resource) checkRound(ctx context.Context, gvr schema.GroupVersionResource, st *store, informers []namespaceInformer) {
	for _, ni := range informers {
		if !ni.controller.HasSynced() {
			return
		}
	}
	c := Consistency{LastCheckTime: r.m.clock().UTC(), Result: CheckSuccess}
	var messages []string
	for _, ni := range informers {
		got := r.checkStream(ctx, gvr, st, ni.namespace)
		if ctx.Err() != nil {
			return // stopped: no outcome
		}
		c.Objects += got.objects
		c.Differences += len(got.differences)
		if got.result == CheckSuccess {
			continue
		}
		messages = append(messages, got.message)
		if got.result == CheckFailure {
			c.Result = CheckFailure
			ni.expiry.expire()
		} else if c.Result == CheckSuccess {
			c.Result = CheckError
		}
	}
	c.Message = strings.Join(messages, "; ")
	r.checks[c.Result].Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	if last := r.consistency; last != nil {
		c.LastFailureTime = last.LastFailureTime
	}
	if c.Result == CheckFailure {
		c.LastFailureTime = &c.LastCheckTime
	}
	r.consistency = &c
}

// streamCheck is the outcome of one informer's check.
type streamCheck struct {
	result      string
	objects     int
	differences []difference
	message     string
}

// checkStream compares what the cache holds of stream (a namespace, "" for all) with a list from
// the apiserver at the revision the cache holds it at: first their digests, then, if those
// differ, object by object, which it logs.
func (r *Resource) checkStream(ctx context.Context, gvr schema.GroupVersionResource, st *store, stream string) streamCheck {
	snap := st.snapshot()
	rev, ok := snap.revs[stream]
	if !ok {
		return streamCheck{result: CheckSuccess} // nothing applied yet
	}
	seed := maphash.MakeSeed()
	cached := digest{seed: seed}
	snap.Scan(stream, Key{}, func(u *object.Object) bool {
		cached.add(u.GetNamespace(), u.GetName(), u.GetResourceVersion())
		return true
	})
	listed := digest{seed: seed}
	err := r.listAt(ctx, gvr, stream, rev, func(namespace, name, rv string) { listed.add(namespace, name, rv) })
	if err != nil {
		return r.checkError(stream, rev, err)
	}
	if listed == cached {
		return streamCheck{result: CheckSuccess, objects: cached.count}
	}
	diffs, err := r.differences(ctx, gvr, snap, stream, rev)
	if err != nil {
		return r.checkError(stream, rev, err)
	}
	shown := diffs[:min(len(diffs), shownDifferences)]
	r.m.logger().Warn("the cache differs from the apiserver: listing again", "resource", r.name, "namespace", stream,
		"resourceVersion", rev, "cached", cached.count, "listed", listed.count, "differences", len(diffs), "objects", shown)
	return streamCheck{result: CheckFailure, objects: cached.count, differences: diffs,
		message: fmt.Sprintf("%s at resourceVersion %d: %d objects differ from the apiserver's (%s), listed again", streamName(stream), rev, len(diffs), strings.Join(shown, ", "))}
}

func (r *Resource) checkError(stream string, rev uint64, err error) streamCheck {
	r.m.logger().Warn("consistency check failed to list", "resource", r.name, "namespace", stream, "resourceVersion", rev, "err", err)
	return streamCheck{result: CheckError, message: fmt.Sprintf("%s at resourceVersion %d: %v", streamName(stream), rev, err)}
}

// streamName names a stream in a message.
func streamName(stream string) string {
	if stream == "" {
		return "all namespaces"
	}
	return "namespace " + stream
}

// listAt lists, page by page, what the resource's stream selects as the apiserver had it at
// revision rev, and calls fn with each object's namespace, name and resourceVersion. It lists
// metadata only.
func (r *Resource) listAt(ctx context.Context, gvr schema.GroupVersionResource, stream string, rev uint64, fn func(namespace, name, rv string)) error {
	opts := metav1.ListOptions{
		LabelSelector:        r.cfg.Labels.String(),
		FieldSelector:        r.cfg.Exclusions().String(),
		ResourceVersion:      strconv.FormatUint(rev, 10),
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		Limit:                r.m.checkPageSize(),
	}
	client := r.m.metadataClient().Resource(gvr).Namespace(stream)
	for {
		list, err := client.List(ctx, opts)
		if err != nil {
			return fmt.Errorf("list %s at resourceVersion %d: %w", r.name, rev, err)
		}
		for i := range list.Items {
			m := &list.Items[i].ObjectMeta
			if !r.cfg.Excludes(m.Namespace) {
				fn(m.Namespace, m.Name, m.ResourceVersion)
			}
		}
		if list.Continue == "" {
			return nil
		}
		// The next pages are at the first's resourceVersion, which a continue token carries.
		opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = list.Continue, "", ""
	}
}

// difference names an object the cache and the apiserver disagree on: "namespace/name: cache
// 12, apiserver 15", where "none" stands for a side that does not have it.
type difference = string

// differences lists the stream again at rev and names every object the snapshot holds otherwise
// than the list does, in key order.
func (r *Resource) differences(ctx context.Context, gvr schema.GroupVersionResource, snap Snapshot, stream string, rev uint64) ([]difference, error) {
	listed := map[string]string{}
	if err := r.listAt(ctx, gvr, stream, rev, func(namespace, name, rv string) { listed[object.Key(namespace, name)] = rv }); err != nil {
		return nil, err
	}
	var diffs []difference
	note := func(key, cached, apiserver string) {
		diffs = append(diffs, fmt.Sprintf("%s: cache %s, apiserver %s", key, cached, apiserver))
	}
	snap.Scan(stream, Key{}, func(u *object.Object) bool {
		key, rv := object.KeyOf(u), u.GetResourceVersion()
		switch at, ok := listed[key]; {
		case !ok:
			note(key, rv, "none")
		case at != rv:
			note(key, rv, at)
		}
		delete(listed, key)
		return true
	})
	for key, rv := range listed {
		note(key, "none", rv)
	}
	slices.Sort(diffs)
	return diffs, nil
}

// digest stands for a set of objects' (namespace, name, resourceVersion) whatever their order:
// how many there are and the sum of their hashes. Two digests compare equal only with the
// same seed.
type digest struct {
	seed  maphash.Seed
	count int
	sum   uint64
}

func (d *digest) add(namespace, name, rv string) {
	var h maphash.Hash
	h.SetSeed(d.seed)
	for _, s := range []string{namespace, name, rv} {
		h.WriteString(s)
		h.WriteByte(0) // none of the three holds a NUL
	}
	d.count++
	d.sum += h.Sum64()
}

// expiry lets the consistency check make an informer list again: expire asks its watch, the
// one running or else the next, to end with a 410 Expired error, on which the reflector lists
// again, as it does when its resourceVersion has been compacted; the list's differences with
// the cache become the events (see Resource.replace).
type expiry struct {
	mu sync.Mutex
	ch chan struct{} // closed when a watch is to end
}

func newExpiry() *expiry { return &expiry{ch: make(chan struct{})} }

func (x *expiry) expire() {
	x.mu.Lock()
	defer x.mu.Unlock()
	select {
	case <-x.ch:
	default:
		close(x.ch)
	}
}

// expired is closed once a watch is to end; nil for no expiry.
func (x *expiry) expired() <-chan struct{} {
	if x == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ch
}

// ended notes that a watch has ended as asked: the next watches run on.
func (x *expiry) ended() {
	x.mu.Lock()
	defer x.mu.Unlock()
	select {
	case <-x.ch:
		x.ch = make(chan struct{})
	default:
	}
}

// errCheckFailed is the 410 that ends a watch whose cache the consistency check found differing.
func errCheckFailed() *metav1.Status {
	return &apierrors.NewResourceExpired("dynwatch's consistency check found the cache differing from the apiserver: listing again").ErrStatus
}
