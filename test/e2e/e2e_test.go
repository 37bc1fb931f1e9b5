// Package e2e tests the dynwatch binary end to end against the test bed's real apiserver.
//
// A test that shares nothing with the others (its own namespaces, receivers and ports, or a
// cluster of its own) calls t.Parallel. The others run one at a time, before the parallel ones:
// those that measure time, CPU or memory (latency, deadlines, failover), and those that compare
// what all namespaces of the shared apiserver hold, which the parallel tests change.
package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/runner"
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
	}
	code := testbed.MainAll(m, &cluster)
	raceBinary.remove()
	noRaceBinary.remove()
	os.Exit(code)
}

// dynwatchBinary builds the binary, with the race detector, once per test run.
func dynwatchBinary(t *testing.T) string { return raceBinary.get(t) }

// plainBinary builds the binary without the race detector, whose instrumentation would
// multiply what a memory measurement sees, once per test run.
func plainBinary(t *testing.T) string { return noRaceBinary.get(t) }

var raceBinary, noRaceBinary = &build{race: true}, &build{}

// build is one build of the binary, made on first use into a directory of its own.
type build struct {
	race bool
	once sync.Once
	dir  string
	path string
	err  error
}

func (b *build) get(t *testing.T) string {
	t.Helper()
	b.make()
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// make builds the binary, or waits for the build under way; only the first call builds.
func (b *build) make() {
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "dynwatch-e2e-")
		if b.err != nil {
			return
		}
		b.path, b.err = runner.Build(context.Background(), b.dir, b.race)
	})
}

// remove deletes the build's directory, once no test runs the binary any more (and the build,
// if one is under way, has ended).
func (b *build) remove() {
	b.once.Do(func() {}) // waits for a build under way; marks one never begun as done
	if b.dir != "" {
		_ = os.RemoveAll(b.dir) // a leftover temporary directory harms nothing
	}
}

// start runs the binary with the YAML configuration and kubeconfig until the test ends.
func start(t *testing.T, kubeconfig, yaml string) *runner.Process {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return startFile(t, kubeconfig, path)
}

// startFile runs the binary with the configuration file at path until the test ends.
func startFile(t *testing.T, kubeconfig, path string) *runner.Process {
	t.Helper()
	p, err := tryStart(t, kubeconfig, path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tryStart is startFile for a goroutine other than the test's: it returns its error.
func tryStart(t *testing.T, kubeconfig, path string) (*runner.Process, error) {
	p, err := runner.Start(runner.Options{Binary: dynwatchBinary(t), Config: path, Kubeconfig: kubeconfig})
	if err != nil {
		return nil, err
	}
	supervise(t, p)
	return p, nil
}

// stopTimeout is how long a process has to exit after SIGTERM when its test ends: its drain
// (shutdownTimeout, 25 s by default) and some.
const stopTimeout = config.DefaultShutdownTimeout + 10*time.Second

// supervise stops p when the test ends (after a SIGCONT, should the test have paused it) and
// fails the test, naming p, for every data race p reported, and for an exit status other than
// 0 that the test did not ask for with Kill, or a stop that did not end it within stopTimeout.
// Every dynwatch an end-to-end test starts is supervised, so the race detector it is built
// with sees every process: stopped, reloaded or killed.
func supervise(t *testing.T, p *runner.Process) {
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGCONT)
		_ = p.Stop(stopTimeout) // its error is Check's
		if err := p.Check(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", p.Name(), p.Log())
		}
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	name = name[:min(len(name), 50)] + "-" + hex.EncodeToString(suffix)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

func get(ctx context.Context, url string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
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
	grantConfigMapReads(t, ns, user)
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

// grantConfigMapReads lets user get, list and watch configmaps in ns of the shared test bed: a
// Role and a RoleBinding, both named dynwatch.
func grantConfigMapReads(t *testing.T, ns, user string) {
	t.Helper()
	grantConfigMapReadsIn(t, kubernetes.NewForConfigOrDie(cluster.Config), ns, user)
}

// grantConfigMapReadsIn is grantConfigMapReads through cs, in whichever apiserver it reaches.
func grantConfigMapReadsIn(t *testing.T, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	if _, err := cs.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "dynwatch"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bindConfigMapReadsIn(t, cs, ns, user)
}

// bindConfigMapReads binds the Role grantConfigMapReads made to user.
func bindConfigMapReads(t *testing.T, ns, user string) {
	t.Helper()
	bindConfigMapReadsIn(t, kubernetes.NewForConfigOrDie(cluster.Config), ns, user)
}

func bindConfigMapReadsIn(t *testing.T, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	if _, err := cs.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "dynwatch"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "dynwatch"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
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
