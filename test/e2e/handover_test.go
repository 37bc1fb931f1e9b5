package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// Handover kinds: a replica stopped with SIGTERM and started again, or the leader killed with
// SIGKILL and started again on its stored state.
const (
	graceful = "graceful"
	sigkill  = "sigkill"
)

// handover is one step of a sequence of replacements, as the test made it.
type handover struct {
	n        int
	kind     string
	replaced string
	from, to string // the leader before the step, and once the group settled after it
	began    time.Time
	settled  time.Time
}

func (h handover) String() string {
	return fmt.Sprintf("step %d (%s of %s, leader %s→%s, %s–%s)", h.n, h.kind, h.replaced, h.from, h.to,
		h.began.Format(time.StampMilli), h.settled.Format(time.StampMilli))
}

// handoverAt is the last step begun at or before at, or nil before the first.
func handoverAt(steps []handover, at time.Time) *handover {
	var h *handover
	for i := range steps {
		if steps[i].began.After(at) {
			break
		}
		h = &steps[i]
	}
	return h
}

// TestOrderPerObjectHoldsThroughTwentyRollingReplacementsAndTwentyLeaderKills: three replicas,
// under about 200 changes/s to 40 configmaps, go through 40 steps, in turn a graceful rolling
// replacement (of the leader, or every fourth time of a follower) and a SIGKILL of the leader;
// each replica replaced starts again on its stored state, resuming its watch from the revision
// it recorded. No first arrival of a version comes after the first arrival of a newer one of
// the same object, every object's last version arrives, and no version is passed over (never
// arriving while a later one of its object did), as happened when a restarted replica knew what
// changed while it was down only by comparing a list (see docs/high-availability.md).
func TestOrderPerObjectHoldsThroughTwentyRollingReplacementsAndTwentyLeaderKills(t *testing.T) {
	testbed.Need(t)
	const (
		objects = 40
		rate    = 200 // changes per second, for the whole sequence
		steps   = 40  // every other one a leader killed; the rest graceful replacements
	)
	f := newHAFixture(t, objects)
	rc, rs, u := f.rc, f.rs, f.u

	// Changes run until every step is done; no change outlives the test, even a failed one.
	stop := make(chan struct{})
	updating := make(chan struct{})
	var changes int
	var updateErr error
	began := time.Now()
	go func() {
		defer close(updating)
		changes, updateErr = u.runUntil(t.Context(), rate, stop)
	}()
	stopUpdates := sync.OnceFunc(func() { close(stop); <-updating })
	defer stopUpdates()

	var done []handover
	rotation := 0 // the next replica a graceful step replaces when it replaces a follower
	for i := range steps {
		h := handover{n: i + 1, kind: graceful, began: time.Now()}
		if i%2 == 1 {
			h.kind = sigkill
		}
		l := leaderOf(t.Context(), rs)
		h.from = nameOf(l)
		r := l
		switch {
		case h.kind == sigkill && l == nil:
			t.Fatalf("step %d: no replica leads before the kill", h.n)
		case h.kind == graceful && (i/2)%4 == 3, l == nil:
			// Every fourth rolling replacement is of a follower, in turn: it hands nothing
			// over, but restarts on its stored state and may lead later.
			for r = rs[rotation%len(rs)]; r == l; r = rs[rotation%len(rs)] {
				rotation++
			}
			rotation++
		}
		h.replaced = r.name
		replace(t, rs, r, h.kind)

		// The group has settled when all three are ready, one leads, and the leader has
		// delivered since the step began.
		testbed.Eventually(t, 60*time.Second, func() error {
			lead, err := settled(t.Context(), rs, rc, h.began)
			h.to = nameOf(lead)
			return err
		})
		h.settled = time.Now()
		done = append(done, h)
		t.Logf("%s", h)

		// A pause of up to 250 ms: most steps fall within the new leader's first checkpoint
		// interval, a moment after the last restart, where a replica that knew what changed
		// while it was down only as one change per object broke order.
		select {
		case <-updating:
			t.Fatalf("changes stopped during step %d: %v", h.n, updateErr)
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(rand.N(250 * time.Millisecond)):
		}
	}
	stopUpdates()
	if updateErr != nil {
		t.Fatal(updateErr)
	}
	t.Logf("%d changes in %s (%.0f/s) through %d steps", changes, time.Since(began).Round(time.Second),
		float64(changes)/time.Since(began).Seconds(), len(done))

	// Every object's last version arrives; what has not after two minutes counts as lost below.
	u.mu.Lock()
	want := slices.Clone(u.want)
	u.mu.Unlock()
	if err := waitArrived(t.Context(), rc, u.lastVersions(), 2*time.Minute); err != nil {
		t.Error(err)
	}

	rep := checkOrder(t, want, rc.got())
	byKind := logViolations(t, rep.violations, done, 20)
	handovers := 0
	for _, h := range done {
		if h.from != h.to {
			handovers++
		}
	}
	t.Logf("%d changes (%d arrivals): %d order violations %v, %d lost, %d dropped as superseded, %d delivered more than once (%d extra arrivals); %d steps, %d changed the leader",
		len(want), rep.arrivals, len(rep.violations), byKind, len(rep.lost), len(rep.superseded), rep.duplicates, rep.extra, len(done), handovers)
	if len(rep.violations) > 0 {
		t.Errorf("%d first arrivals came after a newer version of the same object; want 0", len(rep.violations))
	}
	if len(rep.lost) > 0 {
		t.Errorf("%d changes never arrived, nor any later version of their object: %v", len(rep.lost), rep.lost[:min(len(rep.lost), 10)])
	}
	if len(rep.superseded) > 0 {
		t.Errorf("%d versions never arrived while a later one of their object did; want 0", len(rep.superseded))
	}
}

// lastVersions are the event ids of every object's last change, once changes have stopped.
func (u *updater) lastVersions() []string {
	var ids []string
	for _, cm := range u.objects {
		ids = append(ids, fmt.Sprintf("%s.%s.modified", cm.UID, cm.ResourceVersion))
	}
	return ids
}

// waitArrived polls until every id has arrived at rc, returning what has not at the timeout.
func waitArrived(ctx context.Context, rc *receiver, ids []string, timeout time.Duration) error {
	return poll(ctx, timeout, func() error {
		got := idSet(rc.got())
		var missing []string
		for _, id := range ids {
			if !got[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d of %d ids have not arrived: %v", len(missing), len(ids), missing[:min(len(missing), 5)])
		}
		return nil
	})
}

// logViolations logs the first limit violations, each with the replicas that delivered the two
// versions and the steps around them, then how many followed each step: those whose older
// version arrived after it began and before the next one did. It returns their counts by the
// kind of that step.
func logViolations(t *testing.T, vs []orderViolation, steps []handover, limit int) map[string]int {
	t.Helper()
	byKind, byStep := map[string]int{}, map[int]int{}
	for i, v := range vs {
		kind, n := "none", 0
		if h := handoverAt(steps, v.got.at); h != nil {
			kind, n = h.kind, h.n
		}
		byKind[kind]++
		byStep[n]++
		if i < limit {
			t.Logf("order violation: %s rv %d first arrived from %s at %s (%s), after rv %d from %s at %s (%s)",
				v.name, v.rv, replicaOf(v.got), v.got.at.Format(time.StampMilli), describeStep(steps, v.got.at),
				v.prevRV, replicaOf(v.prev), v.prev.at.Format(time.StampMilli), describeStep(steps, v.prev.at))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(byStep)) {
		if n == 0 {
			t.Logf("%d order violations before step 1", byStep[n])
			continue
		}
		t.Logf("%d order violations in %s; the step before: %s", byStep[n], steps[n-1], stepBefore(steps, n))
	}
	return byKind
}

// stepBefore describes the step before step n, if there is one.
func stepBefore(steps []handover, n int) string {
	if n < 2 {
		return "none"
	}
	return steps[n-2].String()
}

// replace stops r and starts it again on its stored state. A graceful replacement stops it with
// SIGTERM: a leader gives the Lease up on its way out. A kill stops it with SIGKILL, with
// whatever its outbox holds, and waits until another replica leads (once the Lease has expired)
// before starting it again.
func replace(t *testing.T, rs []*replica, r *replica, kind string) {
	t.Helper()
	switch kind {
	case sigkill:
		if err := r.proc().Kill(); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, rs, r)
	case graceful:
		// dynwatch may take its shutdownTimeout (25 s by default) to stop gracefully; on a
		// loaded machine a stop has taken over 10 s.
		if err := r.proc().Stop(config.DefaultShutdownTimeout + 5*time.Second); err != nil {
			t.Errorf("stop %s: %v", r.name, err)
		}
	}
	r.start(t)
}

// runUntil changes the objects round-robin at rate per second until stop is closed, recording
// each change's event id as run does. It returns how many changes it made, and the error that
// ended it early, if one did.
func (u *updater) runUntil(ctx context.Context, rate int, stop <-chan struct{}) (int, error) {
	cs, _ := configMaps(u.ns)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return i, nil
		case <-tick.C:
		}
		if err := u.change(ctx, cs, i); err != nil {
			return i, err
		}
	}
}

// settled reports whether every replica is ready and exactly one leads, and that one has
// delivered something since since; it returns the leader it found.
func settled(ctx context.Context, rs []*replica, rc *receiver, since time.Time) (*replica, error) {
	var leaders []*replica
	for _, r := range rs {
		st, err := r.proc().Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		if !st.Ready {
			return nil, fmt.Errorf("%s is not ready: %v", r.name, st.NotReady)
		}
		if le, ok := st.LeaderElection.(map[string]any); ok && le["leading"] == true {
			leaders = append(leaders, r)
		}
	}
	if len(leaders) != 1 {
		return nil, fmt.Errorf("%d replicas lead", len(leaders))
	}
	if !rc.deliveredBy(leaders[0].name, since) {
		return leaders[0], fmt.Errorf("%s leads but has delivered nothing since %s", leaders[0].name, since.Format(time.StampMilli))
	}
	return leaders[0], nil
}

// deliveredBy reports whether the replica named has delivered a request since since.
func (rc *receiver) deliveredBy(name string, since time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, r := range slices.Backward(rc.requests) {
		if r.at.Before(since) {
			return false
		}
		if r.header.Get("X-Replica") == name {
			return true
		}
	}
	return false
}

// poll is testbed.Eventually that returns cond's last error at the timeout instead of failing
// the test, so that the test can still report what it found.
func poll(ctx context.Context, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-tick.C:
		}
	}
}

// orderReport is what a receiver's arrivals say about the changes a test made.
type orderReport struct {
	arrivals   int
	violations []orderViolation
	lost       []string // ids that never arrived, nor any later version of their object
	superseded []string // ids that never arrived, though a later version of their object did
	duplicates int      // ids that arrived more than once
	extra      int      // their arrivals after the first
}

// orderViolation is a first arrival of an object's version after the first arrival of a
// newer one (prev, the newest of those before it).
type orderViolation struct {
	name       string
	rv, prevRV uint64
	got, prev  received
}

// checkOrder goes through the arrivals in the order they arrived. An id's first arrival is an
// order violation when an earlier first arrival carried a newer version of the same object.
// want is every change's event id, uid.resourceVersion.type.
func checkOrder(t *testing.T, want []string, arrivals []received) orderReport {
	t.Helper()
	arrivals = slices.Clone(arrivals)
	slices.SortStableFunc(arrivals, func(a, b received) int { return a.at.Compare(b.at) })
	rep := orderReport{arrivals: len(arrivals)}
	seen := map[string]int{}
	newest := map[string]received{} // per object (uid), the newest version among first arrivals
	newestRV := map[string]uint64{}
	for _, r := range arrivals {
		if r.parseErr != nil {
			t.Errorf("an arrival from %s at %s does not parse: %v", replicaOf(r), r.at.Format(time.StampMilli), r.parseErr)
			continue
		}
		if seen[r.ceID]++; seen[r.ceID] > 1 {
			rep.extra++
			if seen[r.ceID] == 2 {
				rep.duplicates++
			}
			continue
		}
		uid, rv, err := parseEventID(r.ceID)
		if err != nil {
			t.Error(err)
			continue
		}
		if prev, ok := newest[uid]; ok && rv < newestRV[uid] {
			rep.violations = append(rep.violations, orderViolation{name: subjectName(r), rv: rv, prevRV: newestRV[uid], got: r, prev: prev})
			continue
		}
		newest[uid], newestRV[uid] = r, rv
	}
	for _, id := range want {
		if seen[id] > 0 {
			continue
		}
		uid, rv, err := parseEventID(id)
		if err != nil {
			t.Error(err)
			continue
		}
		if newestRV[uid] > rv {
			rep.superseded = append(rep.superseded, id)
		} else {
			rep.lost = append(rep.lost, id)
		}
	}
	return rep
}

// parseEventID splits an event id, uid.resourceVersion.type, into its object's uid and its
// resourceVersion.
func parseEventID(id string) (uid string, rv uint64, err error) {
	parts := strings.Split(id, ".")
	if len(parts) != 3 {
		return "", 0, fmt.Errorf("event id %q: want uid.resourceVersion.type", id)
	}
	rv, err = strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("event id %q: %w", id, err)
	}
	return parts[0], rv, nil
}

func replicaOf(r received) string { return r.header.Get("X-Replica") }

func nameOf(r *replica) string {
	if r == nil {
		return "none"
	}
	return r.name
}

// describeStep names the step in progress or last done at at.
func describeStep(steps []handover, at time.Time) string {
	h := handoverAt(steps, at)
	switch {
	case h == nil:
		return "before step 1"
	case h.settled.IsZero() || at.Before(h.settled):
		return fmt.Sprintf("during step %d, %s of %s, leader %s→%s", h.n, h.kind, h.replaced, h.from, h.to)
	default:
		return fmt.Sprintf("after step %d, %s of %s, leader %s→%s", h.n, h.kind, h.replaced, h.from, h.to)
	}
}
