package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/test/runner"
)

// memoryCgroup makes a memory cgroup limited to limit bytes inside this process's own, and
// removes it when the test ends: under cgroup v1's memory hierarchy, or under cgroup v2 (every
// current Kubernetes node and CI runner), where memory must first be delegated to the
// process's cgroup (see delegateMemory). Where neither can be written (not root, or no
// memory controller), the test cannot run: under CI (CI=true) it fails saying why, elsewhere
// it is skipped saying why.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	dir, limitFile, err := memoryParent()
	if err != nil {
		cannotRun(t, err)
	}
	cg := filepath.Join(dir, fmt.Sprintf("dynwatch-e2e-%d", time.Now().UnixNano()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		cannotRun(t, fmt.Errorf("make a memory cgroup: %w", err))
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Logf("remove cgroup %s: %v", cg, err)
		}
	})
	if err := os.WriteFile(filepath.Join(cg, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	return cg
}

// cannotRun ends a test that needs a memory cgroup where none can be made: it fails under CI,
// where the suite is expected to run whole, and is skipped elsewhere.
func cannotRun(t *testing.T, why error) {
	t.Helper()
	msg := fmt.Sprintf("this test needs a memory cgroup it can write (root, and cgroup v1's memory hierarchy or a cgroup v2 hierarchy with the memory controller): %v", why)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// memoryParent is the cgroup directory memory cgroups are made in, and the file that limits
// one: cgroup v1's memory hierarchy at this process's place in it, or this process's cgroup
// v2, its memory controller delegated to its children first.
func memoryParent() (dir, limitFile string, err error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "", fmt.Errorf("no cgroups: %w", err)
	}
	var v2 string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controllers:path; v2's is 0::path.
		parts := strings.SplitN(line, ":", 3)
		switch {
		case len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory"):
			return filepath.Join("/sys/fs/cgroup/memory", parts[2]), "memory.limit_in_bytes", nil
		case len(parts) == 3 && parts[0] == "0" && parts[1] == "":
			v2 = filepath.Join("/sys/fs/cgroup", parts[2])
		}
	}
	if v2 == "" {
		return "", "", errors.New("neither a cgroup v1 memory hierarchy nor cgroup v2")
	}
	delegation.Do(func() { delegation.err = delegateMemory(v2) })
	return v2, "memory.max", delegation.err
}

// delegation is delegateMemory's one run for the test process.
var delegation struct {
	sync.Once
	err error
}

// delegateMemory enables the memory controller for the children of the cgroup v2 directory
// dir, as a container runtime or systemd does for a delegated subtree. A cgroup v2 that holds
// processes cannot enable a controller for its children (the no-internal-processes rule), so
// its processes, this test process among them, first move into a leaf of their own, dir/tests.
func delegateMemory(dir string) error {
	control := filepath.Join(dir, "cgroup.subtree_control")
	if c, err := os.ReadFile(control); err == nil && slices.Contains(strings.Fields(string(c)), "memory") {
		return nil
	}
	c, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(string(c)), "memory") {
		return fmt.Errorf("cgroup v2 %s is not given the memory controller by its parent (cgroup.controllers: %q)", dir, c)
	}
	leaf := filepath.Join(dir, "tests")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("make a leaf cgroup for this process: %w", err)
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, pid := range strings.Fields(string(procs)) {
		// One pid per write; a process that has exited meanwhile cannot be moved.
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0o644); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("move process %s into %s: %w", pid, leaf, err)
		}
	}
	if err := os.WriteFile(control, []byte("+memory"), 0o644); err != nil {
		return fmt.Errorf("delegate memory to the children of %s: %w", dir, err)
	}
	return nil
}

// TestTheGoMemoryLimitLeavesHeadroomUnderTheContainersLimit runs the binary in a cgroup
// limited to 512 MiB, as a pod with that memory limit runs: the Go runtime's soft limit is 90%
// of it, and GOMEMLIMIT, when set, wins.
func TestTheGoMemoryLimitLeavesHeadroomUnderTheContainersLimit(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		if _, set := os.LookupEnv(v); set {
			t.Skipf("%s is set in the test's environment, which dynwatch inherits", v)
		}
	}
	const limit = 512 << 20
	cg := memoryCgroup(t, limit)
	ns := namespace(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, cfg, plainConfig(ns, ""))
	for _, tt := range []struct {
		name string
		env  []string
		want float64
	}{
		{"90% of the cgroup's limit", nil, math.Floor(limit * 0.9)},
		{"GOMEMLIMIT set in the environment", []string{"GOMEMLIMIT=300MiB"}, 300 << 20},
		{"another ratio in AUTOMEMLIMIT", []string{"AUTOMEMLIMIT=0.5"}, limit / 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := startReady(t, runner.Options{Config: cfg, Env: tt.env, Cgroup: cg})
			_, metrics, _ := p.WaitListening(t.Context())
			if got := metricValue(t, metrics, "go_gc_gomemlimit_bytes"); got != tt.want {
				t.Errorf("go_gc_gomemlimit_bytes = %.0f, want %.0f", got, tt.want)
			}
		})
	}
}
