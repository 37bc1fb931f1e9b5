package e2e

// The helpers the end-to-end tests share, in one place: starting dynwatch (every process a test
// starts is supervised: stopped when the test ends, its races and exit status checked), granting
// a caller RBAC in the test bed, and asking a server.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// Starting dynwatch.

// dynwatchBinary builds the binary, with the race detector, once per test run.
func dynwatchBinary(t *testing.T) string { return raceBinary.get(t) }

// plainBinary builds the binary without the race detector, whose instrumentation would
// multiply what a memory measurement sees, once per test run.
func plainBinary(t *testing.T) string { return noRaceBinary.get(t) }

// failpointBinary builds the binary with the race detector and its failpoints enabled
// (runner.BuildWithFailpoints), once per test run.
func failpointBinary(t *testing.T) string { return failpointsBinary.get(t) }

var raceBinary, noRaceBinary, failpointsBinary = &build{race: true}, &build{}, &build{race: true, failpoints: true}

// build is one build of the binary, made on first use into a directory of its own.
type build struct {
	race       bool
	failpoints bool
	once       sync.Once
	dir        string
	path       string
	err        error
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
		if b.failpoints {
			b.path, b.err = runner.BuildWithFailpoints(context.Background(), b.dir, b.race)
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
	p, err := launch(t, runner.Options{Config: path, Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// consistencyCheckEvery is how often the consistency check of every dynwatch a test starts
// compares its caches with the apiserver, unless the test's environment for it says otherwise:
// often enough that each test that runs a while is checked by it, and every process's Check
// fails for a cache found differing.
const consistencyCheckEvery = "20s"

// launch starts dynwatch as o says, supervised until the test ends: every dynwatch a test
// starts to run it to its end goes through here. An empty o.Binary is the race-built binary,
// an empty o.Kubeconfig the shared test bed's. It returns its error, for a goroutine other
// than the test's.
func launch(t *testing.T, o runner.Options) (*runner.Process, error) {
	o.Env = append([]string{"DYNWATCH_CONSISTENCYCHECK_PERIOD=" + consistencyCheckEvery}, o.Env...)
	if o.Binary == "" {
		o.Binary = dynwatchBinary(t)
	}
	if o.Kubeconfig == "" {
		o.Kubeconfig = cluster.Kubeconfig
	}
	p, err := runner.Start(o)
	if err != nil {
		return nil, err
	}
	supervise(t, p)
	return p, nil
}

// startReady is launch from the test's goroutine: it fails the test on an error, and returns
// once the process is ready.
func startReady(t *testing.T, o runner.Options) *runner.Process {
	t.Helper()
	p, err := launch(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p
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

// namespace creates a namespace in the shared test bed named after the test, with a random
// suffix, and returns its name.
func namespace(t *testing.T) string {
	t.Helper()
	return namespaceIn(t, cluster.Config)
}

// namespaceIn creates a namespace named after the test, with a random suffix, in the cluster
// config reaches, and returns its name.
func namespaceIn(t *testing.T, config *rest.Config) string {
	t.Helper()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	name = name[:min(len(name), 50)] + "-" + hex.EncodeToString(suffix)
	cs := kubernetes.NewForConfigOrDie(config)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// ownCluster starts a cluster of the test's own, its data in a directory of the test's, and stops
// it when the test ends: for a test that restarts or compacts it, turns a gate or the watch cache
// off, or loads it so much that the shared one would measure it.
func ownCluster(t *testing.T, o testbed.Options) *testbed.Cluster {
	t.Helper()
	o.Dir = t.TempDir()
	c, err := testbed.Start(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// startProcess runs dynwatch on a configuration file the test owns (and may rewrite), and
// waits until it is ready.
func startProcess(t *testing.T, configPath string) *runner.Process {
	t.Helper()
	return startReady(t, runner.Options{Config: configPath})
}

// writeFile writes content to path, owner-only.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startWithWebhooks runs dynwatch with yaml and the query API and metrics on loopback without
// authentication, waits until it is ready, and returns it with its metrics server's URL.
func startWithWebhooks(t *testing.T, yaml string) (*runner.Process, string) {
	t.Helper()
	p := start(t, cluster.Kubeconfig, yaml+"\napi: {address: \"127.0.0.1:0\", auth: {mode: none}, tls: {enabled: false}}\nmetrics: {address: \"127.0.0.1:0\"}\n")
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := p.WaitListening(t.Context())
	return p, metrics
}

// RBAC.

// grantConfigMapReads lets user get, list and watch configmaps in ns, through cs (nil: the
// shared test bed): a Role and a RoleBinding, both named dynwatch. A Role an earlier grant
// made in ns is kept, and bound.
func grantConfigMapReads(t *testing.T, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	grantRole(t, cs, ns, "dynwatch", "dynwatch", user, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}})
}

// grantRole binds user, as binding, to the Role role of ns with rules, through cs (nil: the
// shared test bed); a Role of that name made earlier is kept.
func grantRole(t *testing.T, cs kubernetes.Interface, ns, role, binding, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	if cs == nil {
		cs = kubernetes.NewForConfigOrDie(cluster.Config)
	}
	if _, err := cs.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      rules,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clusterID is the id dynwatch gives the cluster c configures when nothing else names it: its
// kube-system namespace's uid.
func clusterID(t *testing.T, c *rest.Config) string {
	t.Helper()
	ns, err := kubernetes.NewForConfigOrDie(c).CoreV1().Namespaces().Get(t.Context(), "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(ns.UID)
}

// grantClusterID lets user read what dynwatch reads its cluster's id from, as the chart grants
// it: the namespace kube-system and the ClusterProperty cluster.clusterset.k8s.io.
func grantClusterID(t *testing.T, user string) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	name := "cluster-id-" + user
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
			{APIGroups: []string{"about.k8s.io"}, Resources: []string{"clusterproperties"}, ResourceNames: []string{"cluster.clusterset.k8s.io"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// Requests.

// get GETs url without credentials and returns the status code and body.
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

// getBody GETs url with client and returns the answer's body and status code.
func getBody(t *testing.T, c *http.Client, url string) ([]byte, int) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body, resp.StatusCode
}

// getJSON GETs url with client and decodes its answer, which must be 200, into v.
func getJSON(t *testing.T, client *http.Client, url string, v any) {
	t.Helper()
	body, code := getBody(t, client, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %.300s", url, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// withToken copies kubeconfig with token as its user's only credential.
func withToken(t *testing.T, kubeconfig, token string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.AuthInfos {
		*u = clientcmdapi.AuthInfo{Token: token}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// decodeJSON decodes resp's body, which must be 200, into v, and closes it.
func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// httpClient is a client with cfg's credentials and CA.
func httpClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// answer is what a server answered to a GET: the status code and, for errors, the Status.
type answer struct {
	code    int
	reason  metav1.StatusReason
	message string
}

// shortURL keeps test messages readable when a test sends a huge URL.
func shortURL(u string) string {
	if len(u) > 160 {
		return fmt.Sprintf("%s... (%d bytes)", u[:160], len(u))
	}
	return u
}

// shortErr is err's message with any URL in it cut as shortURL cuts it.
func shortErr(err error) string {
	var uerr *neturl.Error
	if errors.As(err, &uerr) {
		return fmt.Sprintf("%s %s: %v", uerr.Op, shortURL(uerr.URL), uerr.Err)
	}
	return err.Error()
}

func (a answer) String() string { return fmt.Sprintf("%d %s %q", a.code, a.reason, a.message) }

// ask GETs url and returns the answer; it reads only the headers of a successful watch.
func ask(t *testing.T, client *http.Client, url string) answer {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", shortURL(url), shortErr(err))
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode}
	if resp.StatusCode >= 400 {
		var st metav1.Status
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &st); err != nil || st.Kind != "Status" {
			t.Fatalf("GET %s: %d with a body that is no Status: %.300s", shortURL(url), resp.StatusCode, b)
		}
		a.reason, a.message = st.Reason, st.Message
	}
	return a
}

// reply is what a server answered to a GET, read as far as its first JSON value: the status
// code, the Status's reason for errors, and what came first (an object's kind, or "watch
// event TYPE" for a watch stream).
type reply struct {
	code   int
	reason metav1.StatusReason
	first  string
}

// askFirst GETs url and reads the answer's first JSON value, then hangs up.
func askFirst(t *testing.T, client *http.Client, url string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		// No answer at all (a pooled connection the server closed while the machine was
		// loaded): code 0 matches no server's answer, so a caller waiting for agreement
		// asks again and a caller that expects a status fails with this message.
		return reply{first: fmt.Sprintf("no answer: %v", err)}
	}
	defer resp.Body.Close()
	var v struct {
		Kind   string              `json:"kind"`
		Reason metav1.StatusReason `json:"reason"`
		Type   string              `json:"type"`
		Object json.RawMessage     `json:"object"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		// A watch that ended before its first event: an answer that differs from any
		// expected one, which a caller waiting for agreement retries.
		return reply{code: resp.StatusCode, first: fmt.Sprintf("no JSON value: %v", err)}
	}
	r := reply{code: resp.StatusCode, reason: v.Reason, first: v.Kind}
	if v.Type != "" && v.Object != nil {
		r.first = "watch event " + v.Type
	}
	return r
}

// floodGet GETs url with token and returns the status code, 0 if there was no answer.
func floodGet(c *http.Client, url, token string) int {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// cpuTime is the user and system CPU process pid has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	d, err := testbed.CPUTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
