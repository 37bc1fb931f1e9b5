package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of high availability: three dynwatch processes with their own state stores, one
// Lease in the test's namespace, one receiver. Each replica's sink sends an X-Replica header
// naming it, so the receiver knows who delivered what.

const (
	haLease    = 4 * time.Second
	haReplicas = 3
)

// replica is one dynwatch process of an HA group, with what it needs to be started again.
type replica struct {
	name, config string
	mu           sync.Mutex
	p            *runner.Process
}

func (r *replica) proc() *runner.Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p
}

// start runs the replica's process (again), waiting until it is ready.
func (r *replica) start(t *testing.T) {
	t.Helper()
	if err := r.tryStart(t); err != nil {
		t.Fatal(err)
	}
}

// tryStart is start for a goroutine other than the test's: it returns its error.
func (r *replica) tryStart(t *testing.T) error {
	p, err := launch(t, runner.Options{Config: r.config})
	if err != nil {
		return err
	}
	if err := p.WaitReady(t.Context()); err != nil {
		return fmt.Errorf("%s: %w", r.name, err)
	}
	r.mu.Lock()
	r.p = p
	r.mu.Unlock()
	return nil
}

// haFixture is an HA group of haReplicas in a new namespace delivering to a receiver that
// answers 200, its leader once elected, and an updater over objects configmaps.
type haFixture struct {
	ns     string
	rc     *receiver
	rs     []*replica
	leader *replica
	u      *updater
}

func newHAFixture(t *testing.T, objects int) haFixture {
	f := haFixture{ns: namespace(t)}
	f.rc = newJudge(t, func(received, int, http.Header) int { return http.StatusOK })
	f.rs = haGroup(t, f.ns, f.rc.URL, haReplicas)
	f.leader = waitLeader(t, f.rs)
	f.u = newUpdater(t, f.ns, objects)
	return f
}

// haGroup starts n replicas watching configmaps in ns and delivering to url.
func haGroup(t *testing.T, ns, url string, n int) []*replica {
	return haGroupOf(t, fmt.Sprintf("[{version: v1, resource: configmaps, namespaces: [%s]}]", ns), ns, url, n)
}

// haGroupOf starts n replicas watching resources, with their Lease in ns, delivering to url.
func haGroupOf(t *testing.T, resources, ns, url string, n int) []*replica {
	dir := t.TempDir()
	var rs []*replica
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		r := &replica{name: name, config: filepath.Join(dir, name+".yaml")}
		writeFile(t, r.config, fmt.Sprintf(`resources: %s
webhooks: [{name: sink, url: %s, workers: 4, headers: [{name: X-Replica, value: %s}], retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
state: {path: %s}
leaderElection: {enabled: true, namespace: %s, identity: %s, leaseDuration: %s, renewDeadline: 3s, retryPeriod: 500ms, checkpointInterval: 1s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, resources, url, name, filepath.Join(dir, name+".db"), ns, name, haLease))
		rs = append(rs, r)
	}
	return startAll(t, rs)
}

// startAll starts rs side by side and returns them once every one is ready.
func startAll(t *testing.T, rs []*replica) []*replica {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() { errs[i] = r.tryStart(t) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return rs
}

// leaderOf asks every running replica who leads, and returns the replica that says it does.
func leaderOf(ctx context.Context, rs []*replica, skip ...*replica) *replica {
	for _, r := range rs {
		if slices.Contains(skip, r) {
			continue
		}
		st, err := r.proc().Status(ctx)
		if err != nil {
			continue
		}
		if le, ok := st.LeaderElection.(map[string]any); ok && le["leading"] == true {
			return r
		}
	}
	return nil
}

func waitLeader(t *testing.T, rs []*replica, skip ...*replica) *replica {
	t.Helper()
	var l *replica
	testbed.Eventually(t, 3*haLease, func() error {
		if l = leaderOf(t.Context(), rs, skip...); l == nil {
			return fmt.Errorf("no replica leads")
		}
		return nil
	})
	return l
}

// updater changes a fixed set of configmaps round-robin at a steady rate, recording the event
// id every change must arrive under.
type updater struct {
	ns      string
	objects []*corev1.ConfigMap
	mu      sync.Mutex
	want    []string // event ids, in the order of the changes
}

func newUpdater(t *testing.T, ns string, objects int) *updater {
	cs, _ := configMaps(ns)
	u := &updater{ns: ns}
	for i := range objects {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ha-%02d", i)}, Data: map[string]string{"v": "created"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.objects = append(u.objects, cm)
		u.want = append(u.want, fmt.Sprintf("%s.%s.added", cm.UID, cm.ResourceVersion))
	}
	return u
}

// run makes n changes at rate per second, calling at(i) before the i-th, on the test's
// goroutine: it fails the test if a change fails.
func (u *updater) run(t *testing.T, n, rate int, at func(i int)) {
	t.Helper()
	ctx := t.Context()
	cs, _ := configMaps(u.ns)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		if at != nil {
			at(i)
		}
		if err := u.change(ctx, cs, i); err != nil {
			t.Fatal(err)
		}
	}
}

// change makes the i-th change, to the objects round-robin, recording its event id.
func (u *updater) change(ctx context.Context, cs kubernetes.Interface, i int) error {
	k := i % len(u.objects)
	cm := u.objects[k].DeepCopy()
	cm.Data["v"] = strconv.Itoa(i)
	next, err := cs.CoreV1().ConfigMaps(u.ns).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update %d: %w", i, err)
	}
	u.objects[k] = next
	u.mu.Lock()
	u.want = append(u.want, fmt.Sprintf("%s.%s.modified", next.UID, next.ResourceVersion))
	u.mu.Unlock()
	return nil
}

// goOn waits until the updater, running from runUntil and reporting its end on ended, has made
// n more changes; it fails the test if the changes end first.
func (u *updater) goOn(t *testing.T, ended <-chan error, n int) {
	t.Helper()
	u.mu.Lock()
	from := len(u.want)
	u.mu.Unlock()
	testbed.Eventually(t, time.Minute, func() error {
		select {
		case err := <-ended:
			t.Fatalf("the changes ended early: %v", err)
		default:
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		if made := len(u.want) - from; made < n {
			return fmt.Errorf("%d of %d more changes made", made, n)
		}
		return nil
	})
}

// checkNothingLost waits until every change has arrived and checks the order per object of
// first arrivals. It returns the ids that arrived more than once, with their first arrival.
func (u *updater) checkNothingLost(t *testing.T, rc *receiver, timeout time.Duration) map[string]received {
	t.Helper()
	testbed.Eventually(t, timeout, func() error {
		got := idSet(rc.got())
		var missing []string
		for _, id := range u.want {
			if !got[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d of %d changes have not arrived: %v", len(missing), len(u.want), missing[:min(len(missing), 5)])
		}
		return nil
	})
	first := map[string]received{}
	dups := map[string]received{}
	lastRV := map[string]int{}
	for _, r := range rc.got() {
		if _, seen := first[r.ceID]; seen {
			dups[r.ceID] = first[r.ceID]
			continue
		}
		first[r.ceID] = r
		rv, _ := strconv.Atoi(r.payload.Object["metadata"].(map[string]any)["resourceVersion"].(string))
		if name := r.name(); rv < lastRV[name] {
			t.Errorf("%s: resourceVersion %d arrived after %d", name, rv, lastRV[name])
		} else {
			lastRV[name] = rv
		}
	}
	return dups
}

func TestAKilledLeaderLosesNothingAndItsSuccessorTakesOverWithinTheLease(t *testing.T) {
	f := newHAFixture(t, 20)
	rc, old, u := f.rc, f.leader, f.u

	var killed time.Time
	u.run(t, 2000, 200, func(i int) {
		if i == 1000 {
			if err := old.proc().Kill(); err != nil {
				t.Fatal(err)
			}
			killed = time.Now()
		}
	})
	dups := u.checkNothingLost(t, rc, 60*time.Second)

	// Failover: from the kill to the first delivery by another replica.
	var next time.Time
	for _, r := range rc.got() {
		if r.header.Get("X-Replica") != old.name && r.at.After(killed) && (next.IsZero() || r.at.Before(next)) {
			next = r.at
		}
	}
	failover := next.Sub(killed)
	t.Logf("failover (SIGKILL to the next delivery) with a %s lease: %s", haLease, failover.Round(time.Millisecond))
	if failover > haLease+2*time.Second {
		t.Errorf("failover took %s; want at most the lease duration plus 2s (%s)", failover, haLease+2*time.Second)
	}
	// Duplicates are what the killed leader delivered after its last checkpoint (a request it
	// had written before the kill may be read just after it).
	for id, r := range dups {
		if r.header.Get("X-Replica") != old.name || r.at.After(killed.Add(500*time.Millisecond)) {
			t.Errorf("%s arrived twice, first from %s at %s (kill at %s): only the killed leader's last deliveries may repeat",
				id, r.header.Get("X-Replica"), r.at.Format(time.StampMilli), killed.Format(time.StampMilli))
		}
	}
	t.Logf("%d changes, %d delivered twice", len(u.want), len(dups))
	// The checkpoint ConfigMap is in the watched namespace; its writes are not events.
	for _, r := range rc.got() {
		if subjectName(r) == "dynwatch-checkpoints" {
			t.Fatalf("the checkpoint ConfigMap was delivered (%s): every checkpoint would make another", r.ceID)
		}
	}
	if len(dups) > 400 { // 2 s of changes at 200/s: a checkpoint interval and the time to act on it
		t.Errorf("%d duplicates; want no more than the last 2 s of changes before the kill", len(dups))
	}
}

func TestAPausedLeaderDeliversNothingAfterItResumes(t *testing.T) {
	f := newHAFixture(t, 10)
	rc, rs, paused, u := f.rc, f.rs, f.leader, f.u

	updates, stopUpdates := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := u.runUntil(t.Context(), 100, stopUpdates)
		updates <- err
	}()
	u.goOn(t, updates, 200)
	if err := paused.proc().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Resumed as soon as another replica leads: its lease has just run out, the closest call.
	testbed.Eventually(t, 2*haLease+time.Second, func() error {
		if leaderOf(t.Context(), rs, paused) == nil {
			return errors.New("no other replica has taken over from the paused leader")
		}
		return nil
	})
	if err := paused.proc().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	u.goOn(t, updates, 200)
	close(stopUpdates)
	if err := <-updates; err != nil {
		t.Fatal(err)
	}
	u.checkNothingLost(t, rc, 60*time.Second)
	for _, r := range rc.got() {
		// It may have written requests before the pause that arrive during it; nothing after.
		if r.header.Get("X-Replica") == paused.name && r.at.After(resumed) {
			t.Errorf("%s delivered %s at %s, after it resumed at %s without being elected again",
				paused.name, r.ceID, r.at.Format(time.StampMilli), resumed.Format(time.StampMilli))
		}
	}
	if l := leaderOf(t.Context(), rs); l == paused {
		t.Logf("%s was elected again after resuming", paused.name)
	}
}

func TestARollingReplacementLosesNothingAndQueriesAreAnsweredThroughout(t *testing.T) {
	f := newHAFixture(t, 10)
	ns, rc, rs, u := f.ns, f.rc, f.rs, f.u

	// Every 100 ms, some replica must answer a list.
	stop := make(chan struct{})
	var probes sync.WaitGroup
	var unanswered []time.Time
	probes.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			answered := false
			for _, r := range rs {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				api, _, err := r.proc().WaitListening(ctx)
				code := 0
				if err == nil {
					code, _, err = get(ctx, api+"/api/v1/namespaces/"+ns+"/configmaps")
				}
				cancel()
				if err == nil && code == http.StatusOK {
					answered = true
					break
				}
			}
			if !answered {
				unanswered = append(unanswered, time.Now())
			}
		}
	})

	updates, stopUpdates := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := u.runUntil(t.Context(), 100, stopUpdates)
		updates <- err
	}()
	for _, r := range rs {
		if err := r.proc().Stop(10 * time.Second); err != nil {
			t.Errorf("stop %s: %v", r.name, err)
		}
		r.start(t)
	}
	u.goOn(t, updates, 100) // a second of changes after the last replica is back
	close(stopUpdates)
	if err := <-updates; err != nil {
		t.Fatal(err)
	}
	close(stop)
	probes.Wait()
	dups := u.checkNothingLost(t, rc, 60*time.Second)
	t.Logf("rolling replacement of %d replicas: %d changes, %d delivered twice", haReplicas, len(u.want), len(dups))
	if len(unanswered) > 0 {
		t.Errorf("no replica answered a list at %d moments, the first at %s", len(unanswered), unanswered[0].Format(time.StampMilli))
	}
}
