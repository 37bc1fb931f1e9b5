package e2e

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The tests of the state store under faults: a damaged file, an orphaned outbox, a corrupt
// entry, a full disk.

// storeFixture is a namespace, a receiver, and a configuration with a state store in dir.
type storeFixture struct {
	ns, dir, config, state string
}

func newStoreFixture(t *testing.T, webhooks func(state string) string) storeFixture {
	f := storeFixture{ns: namespace(t), dir: t.TempDir()}
	f.config, f.state = filepath.Join(f.dir, "config.yaml"), filepath.Join(f.dir, "state.db")
	writeFile(t, f.config, plainConfig(f.ns, webhooks(f.state)+"\nstate: {path: "+f.state+"}"))
	return f
}

func idSet(rs []received) map[string]bool {
	out := map[string]bool{}
	for _, r := range rs {
		out[r.ceID] = true
	}
	return out
}

// storeFiles are the state store's log files, oldest first: its snapshot, then its segments.
func storeFiles(t *testing.T, state string) []string {
	t.Helper()
	snaps, _ := filepath.Glob(filepath.Join(state, "snap-*.wal"))
	segs, _ := filepath.Glob(filepath.Join(state, "seg-*.wal"))
	files := append(snaps, segs...)
	if len(files) == 0 {
		t.Fatalf("no log files in %s", state)
	}
	return files
}

func TestADamagedStoreIsSetAsideAndReplayed(t *testing.T) {
	t.Parallel()
	for _, damage := range []struct {
		name string
		do   func(files []string) error
		// damaged: the store is set aside from its first file on, and every object replayed
		// under its id; otherwise a torn tail is dropped, and what it held is repeated.
		damaged bool
	}{
		{"overwritten with random bytes", func(files []string) error {
			b := make([]byte, 64<<10)
			_, _ = rand.Read(b)
			return os.WriteFile(files[0], b, 0o600)
		}, true},
		{"a byte of its first commit flipped", func(files []string) error {
			f, err := os.OpenFile(files[0], os.O_RDWR, 0)
			if err != nil {
				return err
			}
			b := []byte{0}
			if _, err := f.ReadAt(b, 14); err != nil {
				return errors.Join(err, f.Close())
			}
			_, err = f.WriteAt([]byte{^b[0]}, 14)
			return errors.Join(err, f.Close())
		}, true},
		{"its last commit cut short by a crash", func(files []string) error {
			last := files[len(files)-1]
			st, err := os.Stat(last)
			if err != nil {
				return err
			}
			return os.Truncate(last, st.Size()-3)
		}, false},
	} {
		t.Run(damage.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, nil, false)
			f := newStoreFixture(t, func(string) string { return fmt.Sprintf("webhooks: [{name: r, url: %s}]", rc.URL) })
			if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 20, testbed.NumberedConfigMap(f.ns, "cm-%02d")); err != nil {
				t.Fatal(err)
			}
			p := startProcess(t, f.config)
			first := idSet(rc.waitFor(t, 20, 30*time.Second))
			if err := p.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			if err := damage.do(storeFiles(t, f.state)); err != nil {
				t.Fatal(err)
			}
			p = startProcess(t, f.config)
			_, metrics, _ := p.WaitListening(t.Context())
			aside, _ := filepath.Glob(f.state + ".damaged-*")
			if !damage.damaged {
				// Wait for the lists to be compared, then for whatever the lost commit held.
				testbed.Eventually(t, 30*time.Second, func() error {
					if !strings.Contains(p.Log(), "initial list compared with the stored state") {
						return errors.New("the initial list has not been compared with the stored state")
					}
					if v := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="r"}`); v != 0 {
						return fmt.Errorf("outbox length %v", v)
					}
					return nil
				})
				for _, r := range rc.got()[20:] {
					if !first[r.ceID] {
						t.Errorf("after a torn tail, %s was delivered: not an event of the first run", r.ceID)
					}
				}
				if len(aside) != 0 || !strings.Contains(p.Log(), "a commit cut short by a crash was dropped") {
					t.Errorf("a torn tail: set aside %v, log without its warning; want it dropped, and said", aside)
				}
				return
			}
			second := idSet(rc.waitFor(t, 40, 30*time.Second)[20:])
			for id := range first {
				if !second[id] {
					t.Errorf("%s was not replayed under the same id", id)
				}
			}
			if len(aside) != 1 {
				t.Errorf("set-aside files %v, want one %s.damaged-<time>", aside, f.state)
			}
			if v := metricValue(t, metrics, "dynwatch_state_damaged_total"); v != 1 {
				t.Errorf("dynwatch_state_damaged_total = %v, want 1", v)
			}
			if !strings.Contains(p.Log(), "state store damaged") {
				t.Errorf("the log does not say the store was damaged and set aside")
			}
		})
	}
}

func TestAnOutboxWhoseSinkIsGoneIsDeadLettered(t *testing.T) {
	t.Parallel()
	t.Run("renamed while stopped", func(t *testing.T) {
		hanging, fast := newReceiver(t, nil, true), newReceiver(t, nil, false)
		// The request to the hanging sink is cut half way to the shutdown timeout: 2 s.
		f := newStoreFixture(t, func(string) string {
			return fmt.Sprintf("webhooks: [{name: old, url: %s, workers: 1}]\nshutdownTimeout: 4s", hanging.URL)
		})
		p := startProcess(t, f.config)
		if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 3, testbed.NumberedConfigMap(f.ns, "cm-%02d")); err != nil {
			t.Fatal(err)
		}
		_, metrics, _ := p.WaitListening(t.Context())
		waitOutbox(t, metrics, "old", 3)
		if err := p.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		writeFile(t, f.config, plainConfig(f.ns, fmt.Sprintf("webhooks: [{name: new, url: %s}]\nstate: {path: %s}", fast.URL, f.state)))
		p = startProcess(t, f.config)
		_, metrics, _ = p.WaitListening(t.Context())
		testbed.Eventually(t, 20*time.Second, func() error {
			if v := metricValue(t, metrics, `dynwatch_webhook_dead_letters_total{reason="sink_removed",sink="old"}`); v != 3 {
				return fmt.Errorf("sink_removed dead letters of old = %v, want 3", v)
			}
			return nil
		})
		for id := range idSet(hanging.got()) {
			if !strings.Contains(p.Log(), id) {
				t.Errorf("the log does not name dead-lettered event %s", id)
			}
		}
	})
	t.Run("removed by a reload with more in the outbox than in the queue", func(t *testing.T) {
		hanging := newReceiver(t, nil, true)
		deadLetters := filepath.Join(t.TempDir(), "dead.jsonl")
		f := newStoreFixture(t, func(string) string {
			return fmt.Sprintf("webhooks: [{name: old, url: %s, workers: 1, queueSize: 2, deadLetter: {file: %s}}]", hanging.URL, deadLetters)
		})
		p := startProcess(t, f.config)
		if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 8, testbed.NumberedConfigMap(f.ns, "cm-%02d")); err != nil {
			t.Fatal(err)
		}
		_, metrics, _ := p.WaitListening(t.Context())
		waitOutbox(t, metrics, "old", 8)
		writeFile(t, f.config, plainConfig(f.ns, "webhooks: []\nstate: {path: "+f.state+"}"))
		testbed.Eventually(t, 20*time.Second, func() error {
			n, err := countDeadLetters(deadLetters, "sink_removed")
			if err != nil {
				return err
			}
			if n != 8 {
				return fmt.Errorf("%d sink_removed dead letters, want 8", n)
			}
			return nil
		})
		if n, _ := countDeadLetters(deadLetters, "queue_full"); n != 0 {
			t.Errorf("%d queue_full dead letters with a state store", n)
		}
	})
}

// setFileSizeLimit sets the process's RLIMIT_FSIZE: a write past it fails with EFBIG, the way
// a full disk fails one with ENOSPC (Go ignores SIGXFSZ). No root, no mount.
func setFileSizeLimit(t *testing.T, pid int, limit uint64) {
	t.Helper()
	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: unix.RLIM_INFINITY}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
}

func TestAFullDiskStopsDeliveryAndRecovers(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil, false)
	f := newStoreFixture(t, func(string) string { return fmt.Sprintf("webhooks: [{name: r, url: %s}]", rc.URL) })
	p := startProcess(t, f.config)
	_, metrics, _ := p.WaitListening(t.Context())
	if err := testbed.CreateConfigMaps(t.Context(), cluster.Config, 10, testbed.NumberedConfigMap(f.ns, "pre-%02d")); err != nil {
		t.Fatal(err)
	}
	rc.waitFor(t, 10, 20*time.Second)
	files := storeFiles(t, f.state)
	st, err := os.Stat(files[len(files)-1]) // the segment commits append to
	if err != nil {
		t.Fatal(err)
	}
	setFileSizeLimit(t, p.PID(), uint64(st.Size()))
	_, create := configMaps(f.ns)
	big := strings.Repeat("x", 8<<10)
	const full = 200
	for i := range full {
		if err := create(t.Context(), fmt.Sprintf("full-%03d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		code, body, err := get(t.Context(), metrics+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "state store") {
			return fmt.Errorf("/readyz = %d %q; want 503 naming the state store", code, body)
		}
		return nil
	})
	if v := metricValue(t, metrics, "dynwatch_state_commit_errors_total"); v == 0 {
		t.Errorf("no commit errors counted while the disk is full")
	}
	setFileSizeLimit(t, p.PID(), unix.RLIM_INFINITY)
	testbed.Eventually(t, 30*time.Second, func() error {
		code, body, err := get(t.Context(), metrics+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz = %d %q; want 200 once space returns", code, body)
		}
		if n := len(idSet(rc.got())); n < 10+full {
			return fmt.Errorf("%d events delivered, want %d", n, 10+full)
		}
		if v := metricValue(t, metrics, `dynwatch_webhook_outbox_length{sink="r"}`); v != 0 {
			return fmt.Errorf("outbox length %v after delivery, want 0", v)
		}
		return nil
	})
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	before := len(rc.got())
	startProcess(t, f.config)
	if err := create(t.Context(), "sentinel", "1"); err != nil {
		t.Fatal(err)
	}
	waitSummary(t, rc, "ADDED sentinel v=1")
	if got := summary(rc)[before:]; len(got) != 1 {
		t.Errorf("a restart after the full disk delivered %d events, want only the sentinel: what was delivered was not committed", len(got))
	}
}
