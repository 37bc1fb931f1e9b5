package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestEveryVersionMadeWhileDynwatchWasStoppedArrivesInOrder stops dynwatch, changes an object
// three times, deletes one and creates another, and starts dynwatch again on its state: the
// stream resumes from the revision it recorded, so the receiver gets every version, each
// object's in the order they were made, each with the one before as its old object, and
// nothing else.
func TestEveryVersionMadeWhileDynwatchWasStoppedArrivesInOrder(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	cs, create := configMaps(ns)
	for _, name := range []string{"a", "b", "c"} {
		if err := create(t.Context(), name, "1"); err != nil {
			t.Fatal(err)
		}
	}
	rc := newReceiver(t, nil, false)
	p, configPath := startWithState(t, ns, rc)
	rc.waitFor(t, 3, 90*time.Second)
	waitListRecorded(t, p)
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	first := len(rc.got())

	cms := cs.CoreV1().ConfigMaps(ns)
	patch := func(name, v string) {
		t.Helper()
		if _, err := cms.Patch(t.Context(), name, "application/merge-patch+json", []byte(`{"data":{"v":"`+v+`"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"2", "3", "4"} {
		patch("a", v)
	}
	if err := cms.Delete(t.Context(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := create(t.Context(), "d", "1"); err != nil {
		t.Fatal(err)
	}

	p = startProcess(t, configPath)
	want := []string{"MODIFIED a v=2 old=1", "MODIFIED a v=3 old=2", "MODIFIED a v=4 old=3", "DELETED b v=1", "ADDED d v=1"}
	waitSummary(t, rc, want...)
	_, metrics, _ := p.WaitListening(t.Context())
	// Deliveries keep each object's order; different objects' may pass each other.
	got := summary(rc)[first:]
	if a := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return !strings.Contains(s, " a ") }); len(got) != len(want) || !slices.Equal(a, want[:3]) {
		t.Errorf("after the restart the receiver got:\n%s\nwant exactly, a's in this order:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v := metricValue(t, metrics, "dynwatch_state_full_replays_total"); v != 0 {
		t.Errorf("full replays = %v after a restart on the same state, want 0", v)
	}
}

// TestAResumeFromACompactedRevisionComparesAListInstead: with dynwatch stopped, an object is
// changed twice and etcd's history compacted past the revision dynwatch recorded (the test's
// apiserver has no watch cache, which would otherwise still hold it): the watch from it fails
// with "too old", and dynwatch lists and compares, as without a recorded revision: the last
// version arrives once, with the one it recorded as the old object.
func TestAResumeFromACompactedRevisionComparesAListInstead(t *testing.T) {
	t.Parallel()
	f := startGapFixture(t)
	f.create(t, "x", "1")
	f.waitEvents(t, []string{"ADDED x v=1"})
	waitListRecorded(t, f.p)
	if err := f.p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	f.patch(t, "x", "2")
	f.patch(t, "x", "3")
	if err := f.cluster.CompactEtcd(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.start(t)
	f.waitEvents(t, []string{"MODIFIED x v=3 old=1"})
	if got := f.events(); !slices.Equal(got, []string{"ADDED x v=1", "MODIFIED x v=3 old=1"}) {
		t.Errorf("the receiver got:\n%s\nwant the ADDED and one MODIFIED to v=3", strings.Join(got, "\n"))
	}
}

// waitListRecorded waits until a first start's initial list is recorded, with the revision a
// restart resumes from: the journal logs it, as a full replay when the list had objects (and
// nothing was stored), as a comparison when it had none (the objects came after it, by the
// watch). The full replays' metric alone missed the second: the list may be made before a
// test's first object is.
func waitListRecorded(t *testing.T, p *runner.Process) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() error {
		log := p.Log()
		if strings.Contains(log, "no stored state for this resource") || strings.Contains(log, "initial list compared with the stored state") {
			return nil
		}
		return errors.New("the initial list is not recorded yet")
	})
}

// startWithState starts dynwatch on namespace ns's configmaps with a state store and one
// webhook of one worker to rc; it returns the process and its configuration file.
func startWithState(t *testing.T, ns string, rc *receiver) (*runner.Process, string) {
	t.Helper()
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	writeFile(t, configPath, plainConfig(ns, fmt.Sprintf("webhooks: [{name: r, url: %s, workers: 1}]\nstate: {path: %s}", rc.URL, filepath.Join(dir, "state"))))
	return startProcess(t, configPath), configPath
}
