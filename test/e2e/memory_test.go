package e2e

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/test/runner"
)

// memoryCgroup makes a memory cgroup limited to limit bytes inside this process' own, and
// removes it when the test ends. It skips the test where no memory controller can be written:
// neither cgroup v1's memory hierarchy nor a v2 hierarchy that delegates memory.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	defer func() { _ = f.Close() }() // read only
	var dir, limitFile string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path; v2's is 0::path.
		parts := strings.SplitN(sc.Text(), ":", 3)
		switch {
		case len(parts) == 3 && parts[1] == "memory":
			dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", parts[2]), "memory.limit_in_bytes"
		case len(parts) == 3 && parts[0] == "0" && parts[1] == "" && dir == "":
			if c, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", parts[2], "cgroup.subtree_control")); err == nil && strings.Contains(string(c), "memory") {
				dir, limitFile = filepath.Join("/sys/fs/cgroup", parts[2]), "memory.max"
			}
		}
	}
	if dir == "" {
		t.Skip("no writable memory cgroup controller here")
	}
	cg := filepath.Join(dir, fmt.Sprintf("dynwatch-e2e-%d", time.Now().UnixNano()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("cannot make a memory cgroup: %v", err)
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
			p, err := runner.Start(runner.Options{Binary: dynwatchBinary(t), Config: cfg, Kubeconfig: cluster.Kubeconfig, Env: tt.env, Cgroup: cg})
			if err != nil {
				t.Fatal(err)
			}
			supervise(t, p)
			if err := p.WaitReady(t.Context()); err != nil {
				t.Fatal(err)
			}
			_, metrics, _ := p.WaitListening(t.Context())
			if got := metricValue(t, metrics, "go_gc_gomemlimit_bytes"); got != tt.want {
				t.Errorf("go_gc_gomemlimit_bytes = %.0f, want %.0f", got, tt.want)
			}
		})
	}
}
