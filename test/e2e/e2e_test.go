// Package e2e tests the dynwatch binary end to end against the test bed's real apiserver.
//
// A test that shares nothing with the others (its own namespaces, receivers and ports, or a
// cluster of its own) calls t.Parallel. The others run one at a time, before the parallel ones:
// those that measure time, CPU or memory (latency, deadlines, failover), and those that compare
// what all namespaces of the shared apiserver hold, which the parallel tests change.
package e2e

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/dynwatch/dynwatch/test/testbed"
)

var (
	update  = flag.Bool("update", false, "rewrite golden files under testdata/")
	cluster *testbed.Cluster
)

// Every test here runs dynwatch against the test bed: under -short none runs.
func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		// Both builds are made before the test bed starts, one after the other, not in the
		// first tests that need them. Made beside the test bed's start, they starved its
		// apiserver, which once was not ready within three minutes (a CI-like run).
		raceBinary.make()
		noRaceBinary.make()
		failpointsBinary.make()
	}
	code := testbed.MainAll(m, &cluster)
	raceBinary.remove()
	noRaceBinary.remove()
	failpointsBinary.remove()
	os.Exit(code)
}

func TestBadConfigExitsNonZeroNamingEveryField(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	bad := `
resources:
  - version: v1
    resource: pods
    labelSelector: "app in (web"
    indexers:
      - {name: byImage, type: jsonPath, path: "{.spec.containers[*"}
      - {name: byImage, type: owner}
  - {version: v1, resource: pods}
`
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), dynwatchBinary(t), "--config", path, "--kubeconfig", cluster.Kubeconfig).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("dynwatch with a bad config: err=%v, want a non-zero exit; output:\n%s", err, out)
	}
	for _, want := range []string{
		"resources[0].labelSelector:",
		"resources[0].indexers[0].path:",
		"resources[0].indexers[1].name: duplicate indexer name",
		"resources[1]: duplicate of resources[0]",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "listening") {
		t.Errorf("dynwatch started serving with a bad config:\n%s", out)
	}
}

func TestReadyzFollowsTheInformersAccess(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	user := "dynwatch-" + ns
	grantClusterID(t, user)
	kubeconfig, err := cluster.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, kubeconfig, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
  - {group: nowhere.example.com, version: v1, kind: Ghost}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns))
	_, metrics, err := p.WaitListening(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The user may not list configmaps: the informer cannot sync.
	testbed.Eventually(t, 20*time.Second, func() error {
		code, body, err := get(t.Context(), metrics+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "configmaps.v1: Syncing") {
			return fmt.Errorf("/readyz = %d %q; want 503 naming configmaps.v1", code, body)
		}
		return nil
	})
	if code, _, err := get(t.Context(), metrics+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz = %d, %v while not ready; liveness must not depend on readiness", code, err)
	}
	grantConfigMapReads(t, nil, ns, user)
	testbed.Eventually(t, 60*time.Second, func() error {
		code, body, err := get(t.Context(), metrics+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz = %d %q; want 200 once access is granted", code, body)
		}
		return nil
	})
	// A resource the server does not serve is reported, but does not hold readiness back.
	st, err := p.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready || len(st.Resources) != 2 || st.Resources[1].State != "NotServed" || !strings.Contains(st.Resources[1].Reason, "nowhere.example.com/v1") {
		t.Errorf("/status = %+v; want ready, with Ghost NotServed and its reason", st)
	}
}

func TestMetricsAreLintCleanAndPreInitialised(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rc := newReceiver(t, nil, false)
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps, namespaces: [%s]}
  - {group: nowhere.example.com, version: v1, resource: ghosts}
webhooks:
  - {name: audit, url: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
state: {path: %s}
leaderElection: {enabled: true, namespace: %[1]s, identity: golden}
`, ns, rc.URL, filepath.Join(t.TempDir(), "state.db")))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := p.WaitListening(t.Context())
	code, body, err := get(t.Context(), metrics+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics = %d, %v", code, err)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	// The dynwatch series, without values, and the types of the Go runtime's and the process'
	// families (the alerts and the dashboard use them), against testdata/metrics.golden.
	var series []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "dynwatch_") || strings.HasPrefix(line, "# HELP dynwatch_") || strings.HasPrefix(line, "# TYPE ") {
			if !strings.HasPrefix(line, "#") {
				line = line[:strings.LastIndex(line, " ")]
			}
			series = append(series, strings.ReplaceAll(line, ns, "NAMESPACE"))
		}
	}
	slices.Sort(series)
	got := strings.Join(series, "\n") + "\n"
	golden := "testdata/metrics.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("dynwatch series differ from %s:\n%s", golden, got)
	}
}

func TestSIGTERMStopsPromptlyWithExitZero(t *testing.T) {
	p := start(t, cluster.Kubeconfig, `
resources:
  - {version: v1, resource: configmaps}
  - {version: v1, resource: pods}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`)
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("dynwatch still runs 5s after SIGTERM")
	}
	if err := p.ExitErr(); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want exit code 0", err)
	}
	if _, err := p.WaitLog(t.Context(), `"msg":"stopped"`); err != nil {
		t.Error(err)
	}
}
