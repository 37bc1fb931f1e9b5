package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of the checkpoint ConfigMap as something anyone allowed to edit dynwatch's
// namespace may write: two replicas with their own state stores, one receiver.

// checkpointLease is long enough for three checkpoint reads by the follower while the leader
// is paused and still holds the Lease.
const checkpointLease = 15 * time.Second

// checkpointGroup starts two replicas watching configmaps in ns and delivering to url.
func checkpointGroup(t *testing.T, ns, url string) []*replica {
	dir := t.TempDir()
	var rs []*replica
	for i := range 2 {
		name := fmt.Sprintf("r%d", i)
		r := &replica{name: name, config: filepath.Join(dir, name+".yaml")}
		writeFile(t, r.config, plainConfig(ns, fmt.Sprintf(`
webhooks: [{name: sink, url: %s, workers: 4, headers: [{name: X-Replica, value: %s}], retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
state: {path: %s}
leaderElection: {enabled: true, namespace: %s, identity: %s, leaseDuration: %s, renewDeadline: 10s, retryPeriod: 500ms, checkpointInterval: 1s}
`, url, name, filepath.Join(dir, name+".db"), ns, name, checkpointLease)))
		rs = append(rs, r)
	}
	return startAll(t, rs)
}

// checkpointReads is how many times a replica has read the checkpoint ConfigMap, whatever
// came of it.
func checkpointReads(ctx context.Context, r *replica) (float64, error) {
	_, metrics, err := r.proc().WaitListening(ctx)
	if err != nil {
		return 0, err
	}
	_, body, err := get(ctx, metrics+"/metrics")
	if err != nil {
		return 0, err
	}
	n := 0.0
	for line := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(line, `dynwatch_leader_election_checkpoints_total{operation="read",`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += v
		}
	}
	return n, nil
}

// waitReads waits until r has read the checkpoints twice more: the second read began after
// whatever was written before the call.
func waitReads(t *testing.T, r *replica) {
	t.Helper()
	from, err := checkpointReads(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, func() error {
		n, err := checkpointReads(t.Context(), r)
		if err != nil {
			return err
		}
		if n < from+2 {
			return fmt.Errorf("%s has read the checkpoints %v times since the write", r.name, n-from)
		}
		return nil
	})
}

// seen is what a replica reported after a write of the checkpoint ConfigMap.
type seen struct {
	refused   map[string]float64 // reason → dynwatch_leader_election_checkpoints_refused_total
	condition map[string]any     // the CheckpointsAccepted condition in /status, if any
}

func (s seen) String() string {
	return fmt.Sprintf("refused %v, condition %v", s.refused, s.condition)
}

// observe reads what r reports of the checkpoints, without failing: main reports nothing.
func observe(ctx context.Context, r *replica) seen {
	s := seen{refused: map[string]float64{}}
	if _, metrics, err := r.proc().WaitListening(ctx); err == nil {
		if _, body, err := get(ctx, metrics+"/metrics"); err == nil {
			for line := range strings.SplitSeq(body, "\n") {
				if rest, ok := strings.CutPrefix(line, `dynwatch_leader_election_checkpoints_refused_total{reason="`); ok {
					reason, value, _ := strings.Cut(rest, `"} `)
					s.refused[reason], _ = strconv.ParseFloat(value, 64)
				}
			}
		}
	}
	if st, err := r.proc().Status(ctx); err == nil {
		le, _ := st.LeaderElection.(map[string]any)
		conditions, _ := le["conditions"].([]any)
		for _, c := range conditions {
			if c, ok := c.(map[string]any); ok && c["type"] == "CheckpointsAccepted" {
				s.condition = c
			}
		}
	}
	return s
}

// forge writes the checkpoint ConfigMap: its data and annotations become those given.
func forge(t *testing.T, cs *kubernetes.Clientset, ns string, data, annotations map[string]string) {
	t.Helper()
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "dynwatch-checkpoints", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data, cm.Annotations = data, annotations
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAForgedCheckpointIsRefusedAndReportedAndAFailoverLosesNothing: while the leader is
// paused (so that it cannot write the checkpoints again), the checkpoint ConfigMap is written
// with another holder's name, then with the holder's name and a revision far beyond the
// cluster's; the follower refuses both and says so, and takes the hand-restored ConfigMap at
// once. The forgery is written again and left in place: the follower, restarted on it,
// refuses it from its first read, takes over from the paused leader with it in place, and
// every change made throughout arrives. (A follower that took the forgery would resume its
// delivery a billion revisions ahead of the cluster, and the changes after the pause would
// never arrive.)
func TestAForgedCheckpointIsRefusedAndReportedAndAFailoverLosesNothing(t *testing.T) {
	ns := namespace(t)
	cs, _ := configMaps(ns)
	rc := newJudge(t, func(received, int, http.Header) int { return http.StatusOK })
	rs := checkpointGroup(t, ns, rc.URL)
	leader := waitLeader(t, rs)
	follower := rs[0]
	if follower == leader {
		follower = rs[1]
	}
	u := newUpdater(t, ns, 10)
	updates, stopUpdates := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := u.runUntil(t.Context(), 40, stopUpdates)
		updates <- err
	}()

	// The leader has written checkpoints for the sink, and the follower has read them.
	var good *corev1.ConfigMap
	testbed.Eventually(t, 20*time.Second, func() error {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "dynwatch-checkpoints", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.Contains(cm.Data["checkpoints.json"], `"sink"`) {
			return fmt.Errorf("no checkpoints for the sink yet: %v", cm.Data)
		}
		good = cm
		return nil
	})
	waitReads(t, follower)

	if err := leader.proc().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = leader.proc().Signal(syscall.SIGCONT)
		}
	}()

	// Another holder's checkpoints, at revisions that are true: not the Lease holder's.
	stranger := map[string]string{}
	for k, v := range good.Annotations {
		stranger[k] = v
	}
	stranger["dynwatch.io/lease-holder"] = "intruder"
	forge(t, cs, ns, good.Data, stranger)
	waitReads(t, follower)
	afterStranger := observe(t.Context(), follower)

	// The holder's name and transitions, and revisions far beyond the cluster's.
	list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	clusterRV, _ := strconv.ParseUint(list.ResourceVersion, 10, 64)
	var cp map[string]map[string]string
	if err := json.Unmarshal([]byte(good.Data["checkpoints.json"]), &cp); err != nil {
		t.Fatal(err)
	}
	for _, byResource := range cp {
		for name := range byResource {
			byResource[name] = strconv.FormatUint(clusterRV+1_000_000_000, 10)
		}
	}
	forged, _ := json.Marshal(cp)
	forge(t, cs, ns, map[string]string{"checkpoints.json": string(forged)}, good.Annotations)
	waitReads(t, follower)
	afterForgery := observe(t.Context(), follower)

	// Restored by hand: the follower takes it without a restart.
	forge(t, cs, ns, good.Data, good.Annotations)
	waitReads(t, follower)
	afterRestore := observe(t.Context(), follower)

	// The forgery again, left in place: the follower restarted on it refuses it from the start.
	forge(t, cs, ns, map[string]string{"checkpoints.json": string(forged)}, good.Annotations)
	if err := follower.proc().Stop(stopTimeout); err != nil {
		t.Fatalf("stop %s: %v", follower.name, err)
	}
	follower.start(t)
	waitReads(t, follower)
	afterRestart := observe(t.Context(), follower)

	// Failover with the forgery in place: the follower takes the Lease over from the paused
	// leader, which then resumes. Restarted, it waits a whole lease from when it first saw the
	// Lease before it may take it (client-go's leader election counts from its own observation).
	var next *replica
	testbed.Eventually(t, 2*checkpointLease, func() error {
		if next = leaderOf(t.Context(), rs, leader); next == nil {
			return fmt.Errorf("no replica but the paused one leads")
		}
		return nil
	})
	if err := leader.proc().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused = false
	// The changes go on through the failover and the old leader's resumption, for 120 more
	// (3 s at 40 a second), then stop.
	u.goOn(t, updates, 120)
	close(stopUpdates)
	if err := <-updates; err != nil {
		t.Fatal(err)
	}
	dups := u.checkNothingLost(t, rc, 60*time.Second)
	t.Logf("%d changes, %d delivered twice; %s took over", len(u.want), len(dups), next.name)

	t.Logf("after another holder's write: %s", afterStranger)
	t.Logf("after the forgery: %s", afterForgery)
	t.Logf("after the restore: %s", afterRestore)
	t.Logf("restarted on the forgery: %s", afterRestart)
	if afterRestart.refused["aheadOfCluster"] < 1 || afterRestart.condition["status"] != "False" || afterRestart.condition["reason"] != "AheadOfCluster" {
		t.Errorf("the follower restarted on the forgery: %s; want it refused as aheadOfCluster and the condition False", afterRestart)
	}
	if afterStranger.refused["notLeaseHolder"] < 1 || afterStranger.condition["status"] != "False" || afterStranger.condition["reason"] != "NotLeaseHolder" {
		t.Errorf("after a write naming another holder: %s; want it refused as notLeaseHolder and the condition False", afterStranger)
	}
	if afterForgery.refused["aheadOfCluster"] < 1 || afterForgery.condition["status"] != "False" || afterForgery.condition["reason"] != "AheadOfCluster" {
		t.Errorf("after a write beyond the cluster's resourceVersion: %s; want it refused as aheadOfCluster and the condition False", afterForgery)
	}
	if afterRestore.condition["status"] != "True" || afterRestore.refused["aheadOfCluster"] != afterForgery.refused["aheadOfCluster"] {
		t.Errorf("after the restore: %s; want the condition True and no more refusals", afterRestore)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := follower.proc().WaitLog(ctx, "checkpoints refused"); err != nil { // the restarted process's log
		t.Error(err)
	}
}
