package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of the JetStream sink: a real nats-server cluster (testbed.NATSServerVersion) on
// 127.0.0.1, a stream the test creates, and dynwatch publishing to it while servers and
// dynwatch processes are killed.

// startNATS runs a cluster of n servers until the test ends.
func startNATS(t *testing.T, n int) *testbed.NATS {
	t.Helper()
	c, err := testbed.StartNATS(t.Context(), cluster.Binaries, t.TempDir(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nats-server n1 log:\n%s", c.Log(0))
		}
		c.Stop()
	})
	return c
}

// createStream connects to urls and creates a stream; the connection lasts until the test ends.
func createStream(t *testing.T, urls []string, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	// A server just started may take its time to accept on a loaded machine (a CI run's 2 s
	// dial timed out): connect, with a longer timeout, until it does.
	var nc *nats.Conn
	testbed.Eventually(t, time.Minute, func() error {
		var err error
		nc, err = nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.Timeout(10*time.Second))
		return err
	})
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var s jetstream.Stream
	testbed.Eventually(t, 30*time.Second, func() error { // the cluster elects its meta leader first
		s, err = js.CreateStream(t.Context(), cfg)
		return err
	})
	return s
}

// jsReplicas writes the configurations of n dynwatch processes publishing the configmaps of ns
// to stream DYNWATCH under subjects dw.>; with n above 1 they elect a leader.
func jsReplicas(t *testing.T, ns string, urls []string, n int) []*replica {
	dir := t.TempDir()
	var rs []*replica
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		r := &replica{name: name, config: filepath.Join(dir, name+".yaml")}
		election := ""
		if n > 1 {
			election = fmt.Sprintf("leaderElection: {enabled: true, namespace: %s, identity: %s, leaseDuration: %s, renewDeadline: 3s, retryPeriod: 500ms, checkpointInterval: 1s}\n",
				ns, name, haLease)
		}
		writeFile(t, r.config, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
jetstream: [{name: stream, servers: [%s], subjectPrefix: dw, stream: DYNWATCH, workers: 8, timeout: 2s, retry: {initialBackoff: 100ms, maxBackoff: 1s}}]
state: {path: %s}
%sapi: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, strings.Join(urls, ", "), filepath.Join(dir, name+".db"), election))
		rs = append(rs, r)
	}
	return startAll(t, rs)
}

// storedMessage is one message of the stream, as the test reads it back.
type storedMessage struct {
	seq                       uint64
	subject, id, ceID, ceType string
	rv                        uint64
}

// readStream reads every message of s in sequence order.
func readStream(t *testing.T, s jetstream.Stream) []storedMessage {
	t.Helper()
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []storedMessage
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("read message %d: %v", seq, err)
		}
		out = append(out, storedMessage{seq: seq, subject: m.Subject, id: m.Header.Get(jetstream.MsgIDHeader), ceID: m.Header.Get("ce-id"), ceType: m.Header.Get("ce-type"),
			rv: object.Revision(m.Header.Get("ce-resourceversion"))})
	}
	return out
}

// checkStream waits until the last message of every object's subject carries its current
// resourceVersion, then reads the stream and checks that on each subject resourceVersions
// only go up, and that no event id is stored twice. It returns the stream's messages.
func checkStream(t *testing.T, s jetstream.Stream, u *updater) []storedMessage {
	t.Helper()
	id := clusterID(t, cluster.Config)
	subject := func(cm *corev1.ConfigMap) string { return "dw." + id + ".configmaps._." + cm.Namespace + "." + cm.Name }
	testbed.Eventually(t, 90*time.Second, func() error {
		var behind []string
		for _, cm := range u.objects {
			m, err := s.GetLastMsgForSubject(t.Context(), subject(cm))
			if err != nil {
				return fmt.Errorf("%s: %w", subject(cm), err)
			}
			if got := m.Header.Get("ce-resourceversion"); got != cm.ResourceVersion {
				behind = append(behind, fmt.Sprintf("%s at %s, not %s", cm.Name, got, cm.ResourceVersion))
			}
		}
		if len(behind) > 0 {
			return fmt.Errorf("%d of %d objects' last messages are not their last version: %v", len(behind), len(u.objects), behind[:min(5, len(behind))])
		}
		return nil
	})
	msgs := readStream(t, s)
	last := map[string]storedMessage{}
	ids := map[string]uint64{}
	for _, m := range msgs {
		if m.id == "" || m.id != "dw/"+id+"/"+m.ceID {
			t.Errorf("message %d: Nats-Msg-Id %q, ce-id %q: want the event id in both, after the subject prefix dw and the cluster's id %s in Nats-Msg-Id", m.seq, m.id, m.ceID, id)
		}
		if first, dup := ids[m.ceID]; dup {
			t.Errorf("event %s is stored twice, at %d and %d: the stream's duplicate window should have dropped the second", m.ceID, first, m.seq)
		}
		ids[m.ceID] = m.seq
		if prev, ok := last[m.subject]; ok && m.rv <= prev.rv {
			t.Errorf("%s: resourceVersion %d (message %d) after %d (message %d)", m.subject, m.rv, m.seq, prev.rv, prev.seq)
		}
		last[m.subject] = m
	}
	wanted := 0
	for _, id := range u.want {
		if _, ok := ids[id]; ok {
			wanted++
		}
	}
	t.Logf("%d changes made; the stream holds %d messages on %d subjects, %d of them changes made (the rest a restart's differences)",
		len(u.want), len(msgs), len(last), wanted)
	return msgs
}

// restart starts r again in the background, reporting a failure to start on errs.
func restart(t *testing.T, r *replica, wg *sync.WaitGroup, errs chan<- error) {
	wg.Go(func() {
		p, err := launch(t, runner.Options{Config: r.config})
		if err == nil {
			err = p.WaitReady(t.Context())
		}
		if err != nil {
			errs <- fmt.Errorf("restart %s: %w", r.name, err)
			return
		}
		r.mu.Lock()
		r.p = p
		r.mu.Unlock()
	})
}

// jetStreamStorm runs n dynwatch processes publishing to a stream of three replicas on a
// cluster of three servers while 2,000 changes are made to 200 configmaps at 200/s, and kills
// in turn what each failure path needs killed: after 300 changes, the server dynwatch's
// connection is on (found from the servers' /connz), started again after 600; after 1,000,
// the dynwatch process that delivers (the leader, with n above 1), started again at once;
// after 1,200, once the first server is back, the server that leads the stream (from the
// stream's info), started again after 1,500. It then checks the stream: every object's last
// version, resourceVersions only going up per subject, no id stored twice, and every change
// made stored: none dropped as superseded, as the webhook handover test demands.
func jetStreamStorm(t *testing.T, n int) {
	ns := namespace(t)
	nc := startNATS(t, 3)
	s := createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "DYNWATCH", Subjects: []string{"dw.>"}, Replicas: 3, Duplicates: 10 * time.Minute})
	rs := jsReplicas(t, ns, nc.URLs(), n)
	delivering := func() *replica { return rs[0] }
	if n > 1 {
		waitLeader(t, rs)
		delivering = func() *replica { return leaderOf(t.Context(), rs) }
	}
	u := newUpdater(t, ns, 200)

	var restarts sync.WaitGroup
	errs := make(chan error, 8)
	restartServer := func(i int) {
		restarts.Go(func() {
			if err := nc.Restart(context.WithoutCancel(t.Context()), i); err != nil {
				errs <- err
			}
		})
	}
	var connected, leader int
	u.run(t, 2000, 200, func(i int) {
		var err error
		switch i {
		case 300:
			if connected, err = nc.Connected(t.Context(), "dynwatch/stream"); err != nil {
				t.Fatal(err)
			}
			nc.Kill(connected)
		case 600:
			restartServer(connected)
		case 1000:
			r := delivering()
			if r == nil {
				t.Fatal("no replica leads")
			}
			if err := r.proc().Kill(); err != nil {
				t.Fatal(err)
			}
			restart(t, r, &restarts, errs)
		case 1200:
			restarts.Wait() // the first server back: a second kill leaves the stream its quorum
			// The cluster may still be electing its meta or the stream's leader after the
			// restart: the stream answers who leads once it has one.
			testbed.Eventually(t, time.Minute, func() error {
				info, err := s.Info(t.Context())
				if err != nil {
					return err
				}
				if leader = nc.Index(info.Cluster.Leader); leader < 0 {
					return fmt.Errorf("the stream's leader %q is none of the servers", info.Cluster.Leader)
				}
				return nil
			})
			nc.Kill(leader)
		case 1500:
			restartServer(leader)
		}
	})
	restarts.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("killed n%d (dynwatch's connection), then n%d (the stream's leader)", connected+1, leader+1)
	msgs := checkStream(t, s, u)
	if superseded := supersededIn(msgs, u.want); len(superseded) > 0 {
		t.Errorf("%d changes never stored while a later version of their object was: %v; want 0", len(superseded), superseded[:min(10, len(superseded))])
	}
}

// supersededIn are the ids of want not among msgs while a later version of their object is.
// An id is <uid>.<resourceVersion>.<type> (with .<revision> after it for an object that came
// or went with its namespace, which this test has none of).
func supersededIn(msgs []storedMessage, want []string) []string {
	stored := map[string]bool{}
	latest := map[string]uint64{} // uid → the newest resourceVersion stored
	for _, m := range msgs {
		stored[m.ceID] = true
		uid, _, _ := strings.Cut(m.ceID, ".")
		latest[uid] = max(latest[uid], m.rv)
	}
	var out []string
	for _, id := range want {
		parts := strings.Split(id, ".")
		if !stored[id] && len(parts) == 3 && latest[parts[0]] > object.Revision(parts[1]) {
			out = append(out, id)
		}
	}
	return out
}

func TestJetStreamStoresEveryChangeInOrderThroughKillsOfItsServerItsLeaderAndDynwatch(t *testing.T) {
	jetStreamStorm(t, 1)
}

func TestJetStreamStoresEveryChangeInOrderWhenTheLeaderOfThreeReplicasIsKilledBesideItsServers(t *testing.T) {
	jetStreamStorm(t, haReplicas)
}

func TestAMessageTooLargeForTheStreamIsDeadLetteredAndAMissingStreamIsNamed(t *testing.T) {
	ns := namespace(t)
	nc := startNATS(t, 1)
	createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 4096})
	dir := t.TempDir()
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
jetstream:
- {name: small, servers: [%[2]s], subjectPrefix: small, stream: SMALL, deadLetter: {file: %[3]s/small.jsonl}, retry: {initialBackoff: 100ms, maxBackoff: 200ms, maxElapsed: 1s}}
- {name: missing, servers: [%[2]s], subjectPrefix: gone, stream: MISSING, deadLetter: {file: %[3]s/missing.jsonl}, retry: {initialBackoff: 100ms, maxBackoff: 200ms, maxElapsed: 1s}}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, nc.URLs()[0], dir))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	createSmallAndLarge(t, ns)
	onlyLargeDeadLettered(t, filepath.Join(dir, "small.jsonl"))
	waitDeadLetters(t, filepath.Join(dir, "missing.jsonl"), 30*time.Second, `"reason":"retries_exhausted"`, "stream MISSING does not exist")
}

// TestTwoSinksPublishingIntoOneStreamUnderTwoPrefixesEachStoreEveryEvent: two JetStream sinks
// of one dynwatch publish the same events into one stream, each under its own subject prefix.
// The stream deduplicates by Nats-Msg-Id across all its subjects, and the two sinks' events
// carry the same ids: with the event id (and the cluster's) alone as Nats-Msg-Id, whichever
// sink published an event second had it acknowledged as a duplicate and never stored.
func TestTwoSinksPublishingIntoOneStreamUnderTwoPrefixesEachStoreEveryEvent(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	nc := startNATS(t, 1)
	s := createStream(t, nc.URLs(), jetstream.StreamConfig{Name: "BOTH", Subjects: []string{"one.>", "two.>"}})
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
jetstream:
- {name: one, servers: [%[2]s], subjectPrefix: one, stream: BOTH}
- {name: two, servers: [%[2]s], subjectPrefix: two, stream: BOTH}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, nc.URLs()[0]))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	const n = 10
	createConfigMaps(t, ns, n)
	stored := func() map[string]int {
		out := map[string]int{}
		for _, m := range readStream(t, s) {
			if strings.Contains(m.subject, ".c-") {
				prefix, _, _ := strings.Cut(m.subject, ".")
				out[prefix]++
			}
		}
		return out
	}
	testbed.Eventually(t, time.Minute, func() error {
		if got := stored(); got["one"] != n || got["two"] != n {
			return fmt.Errorf("stored %v of the %d configmaps' ADDED under each prefix", got, n)
		}
		return nil
	})
}
