package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure a Cluster.
type Options struct {
	// Dir holds the cluster's data, certificates and logs. A temporary directory, removed by
	// Stop, when empty.
	Dir string
	// Out receives build progress. os.Stderr when nil.
	Out io.Writer
	// NoWatchCache turns the apiserver's watch cache off, so watches are served by etcd and a
	// compaction makes older resourceVersions unwatchable at once.
	NoWatchCache bool
	// CBOR turns the apiserver's CBORServingAndStorage feature gate on: clients that ask for
	// CBOR get it. Without it, as in clusters by default, they get JSON.
	CBOR bool
}

// Cluster is a running etcd and kube-apiserver on loopback.
type Cluster struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the same admin.
	Kubeconfig string
	// Dir holds data, certificates and logs (etcd.log, kube-apiserver.log).
	Dir string
	// Binaries are the executables the cluster runs; Binaries.Kubectl matches its version.
	Binaries Binaries

	ownDir   bool
	tokens   map[string]string // user → bearer token
	clientCA clientCA
	etcdURL  string
	apiArgs  []string
	apiURL   string
	mu       sync.Mutex
	etcd     *process
	api      *process
	stopOnce sync.Once
}

// process is a child that dies with the test process.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

func startProcess(name, bin, logPath string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close() // nothing was written; the start error is the one to report
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close() // the log is for reading after a failure; a lost tail leaves nothing to do
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, and SIGKILL if the process has not exited within grace.
func (p *process) stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return nil
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for a server a test
// starts: one below the kernel's ephemeral range, never handed out before by this process.
//
// A port from the ephemeral range (what listening on port 0 gives) is also where the kernel
// takes the local port of every outgoing connection, and the suite makes thousands: between
// FreePort and the server's own bind, one of them took etcd's port (CI: "bind: address already
// in use"), and a server restarted on its port (the NATS storm) could find it taken the same way.
// Below the range only another listener that names the port can take it.
func FreePort() (int, error) {
	low, high := portRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := low + mrand.IntN(high-low)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // another process's listener
		}
		_ = l.Close() // only a probe: the server binds the port itself
		portsGiven[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d)", low, high)
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// portRange is where FreePort chooses: from 10000 up to the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768 by default).
func portRange() (low, high int) {
	low, high = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	if f := strings.Fields(string(b)); len(f) == 2 {
		if n, err := strconv.Atoi(f[0]); err == nil && n > low+1000 {
			high = n
		}
	}
	return low, high
}

// Start builds the binaries if needed, starts etcd and kube-apiserver, and returns once the
// apiserver's /readyz answers 200. On error everything started is stopped.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	out := o.Out
	if out == nil {
		out = os.Stderr
	}
	bins, err := EnsureBinaries(ctx, out)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: o.Dir, Binaries: bins}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "dynwatch-testbed-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	for _, start := range []func() error{
		func() error { return c.startEtcd(ctx) },
		func() error { return c.prepareAPIServer(o) },
		func() error { return c.startAPIServer(ctx) },
	} {
		if err := start(); err != nil {
			c.Stop() // what started so far, and a temporary Dir
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	clientPort, err := FreePort()
	if err != nil {
		return err
	}
	peerPort, err := FreePort()
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	p, err := startProcess("etcd", c.Binaries.Etcd, filepath.Join(c.Dir, "etcd.log"),
		"--name=testbed", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=testbed="+peer, "--unsafe-no-fsync", "--log-level=warn",
		// etcd's 2 GiB default does not hold the benchmark's million objects and their history.
		"--quota-backend-bytes=8589934592")
	if err != nil {
		return err
	}
	c.etcd = p
	return c.waitFor(ctx, p, "etcd.log", func() bool {
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (c *Cluster) prepareAPIServer(o Options) error {
	pki := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	saKey := filepath.Join(pki, "sa.key")
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(saKey, keyPEM, 0o600); err != nil {
		return err
	}
	c.tokens = map[string]string{}
	var csv strings.Builder
	for _, user := range append([]string{"admin"}, Users...) {
		token := make([]byte, 16)
		if _, err := rand.Read(token); err != nil {
			return err
		}
		c.tokens[user] = hex.EncodeToString(token)
		groups := ""
		if user == "admin" {
			groups = "system:masters"
		}
		fmt.Fprintf(&csv, "%s,%s,%s,%q\n", c.tokens[user], user, user, groups)
	}
	adminToken := c.tokens["admin"]
	tokens := filepath.Join(pki, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(csv.String()), 0o600); err != nil {
		return err
	}
	if err := c.clientCA.create(pki); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	c.apiURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apiArgs = []string{
		"--etcd-servers=" + c.etcdURL,
		"--secure-port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + pki,
		"--token-auth-file=" + tokens,
		"--client-ca-file=" + c.clientCA.certFile,
		"--authorization-mode=RBAC",
		// A request without credentials is refused (401), as in a hardened cluster.
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		// No controller-manager runs, so nothing creates default service accounts.
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	// SubjectAccessReviews are audited with their bodies, so tests can see what a delegating
	// authorizer asked (RBAC ignores some of it, such as selectors).
	policy := filepath.Join(c.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return err
	}
	c.apiArgs = append(c.apiArgs, "--audit-policy-file="+policy, "--audit-log-path="+c.AuditLog(), "--audit-log-format=json")
	if o.NoWatchCache {
		c.apiArgs = append(c.apiArgs, "--watch-cache=false")
	}
	if o.CBOR {
		c.apiArgs = append(c.apiArgs, "--feature-gates=CBORServingAndStorage=true")
	}
	c.Config = &rest.Config{Host: c.apiURL, BearerToken: adminToken, QPS: 200, Burst: 400}
	return nil
}

// apiserverStarts lets one kube-apiserver of this process start at a time. A starting
// apiserver takes a core or more for tens of seconds (storage, RBAC bootstrap, OpenAPI); the
// end-to-end tests that start clusters of their own run in parallel, and on two cores several
// starting at once each took past the readiness wait.
var apiserverStarts = make(chan struct{}, 1)

func (c *Cluster) startAPIServer(ctx context.Context) error {
	select {
	case apiserverStarts <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-apiserverStarts }()
	p, err := startProcess("kube-apiserver", c.Binaries.APIServer, filepath.Join(c.Dir, "kube-apiserver.log"), c.apiArgs...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.api = p
	c.mu.Unlock()
	// The apiserver writes its self-signed serving certificate and CA before it listens; a
	// file read while it is being written holds no certificate yet, and is read again.
	var client *http.Client
	last := "no answer yet" // the last probe's outcome, for the error
	err = c.waitFor(ctx, p, "kube-apiserver.log", func() bool {
		if client == nil {
			ca, err := os.ReadFile(filepath.Join(c.Dir, "pki", "apiserver.crt"))
			if err != nil {
				last = err.Error()
				return false
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				last = "pki/apiserver.crt holds no certificate yet"
				return false
			}
			c.Config.CAData = ca
			client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.apiURL+"/readyz?verbose", nil)
		req.Header.Set("Authorization", "Bearer "+c.Config.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		last = fmt.Sprintf("/readyz: %s\n%s", resp.Status, body)
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		return fmt.Errorf("%w\nthe last readiness probe: %s", err, last)
	}
	return c.writeKubeconfig()
}

func (c *Cluster) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testbed"] = &clientcmdapi.Cluster{Server: c.apiURL, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.Config.BearerToken}
	cfg.Contexts["testbed"] = &clientcmdapi.Context{Cluster: "testbed", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "testbed"
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	return clientcmd.WriteToFile(*cfg, c.Kubeconfig)
}

// waitFor polls ready until it holds, the process exits, ctx ends or ten minutes pass: a
// bound for a server that will never be ready. It is no measure of a start: in the e2e suite
// on 2 CPUs, an apiserver started beside seven busy tests once took more than three minutes.
func (c *Cluster) waitFor(ctx context.Context, p *process, logName string, ready func() bool) error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		if err := p.exited(); err != nil {
			return fmt.Errorf("%w; last lines of %s:\n%s", err, logName, c.logTail(logName))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; last lines of %s:\n%s", p.name, time.Since(began).Round(time.Second), ctx.Err(), logName, c.logTail(logName))
		case <-tick.C:
		}
	}
	return nil
}

func (c *Cluster) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, name))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// URL is the apiserver's base URL.
func (c *Cluster) URL() string { return c.apiURL }

// PIDs are the process ids of the apiserver and etcd as they run now (a restart changes the
// apiserver's), for a test that measures what they use.
func (c *Cluster) PIDs() (apiserver, etcd int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.api.cmd.Process.Pid, c.etcd.cmd.Process.Pid
}

// RestartAPIServer stops the apiserver (SIGTERM, then SIGKILL after 5s: with watches open it
// does not finish a graceful shutdown sooner) and starts it again on the same port and
// storage, returning when it is ready. Watches against it break, as in a real restart.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	api := c.api
	c.mu.Unlock()
	api.stop(5 * time.Second)
	return c.startAPIServer(ctx)
}

// CompactEtcd compacts etcd's history up to its current revision, so a watch from an older
// resourceVersion fails with 410 Gone and informers must relist.
func (c *Cluster) CompactEtcd(ctx context.Context) error {
	var rng struct {
		Header struct {
			Revision json.Number `json:"revision"`
		} `json:"header"`
	}
	if err := c.etcdCall(ctx, "/v3/kv/range", `{"key":"AA=="}`, &rng); err != nil {
		return fmt.Errorf("read etcd revision: %w", err)
	}
	body := fmt.Sprintf(`{"revision":%q,"physical":true}`, rng.Header.Revision.String())
	if err := c.etcdCall(ctx, "/v3/kv/compaction", body, nil); err != nil {
		return fmt.Errorf("compact etcd at revision %s: %w", rng.Header.Revision, err)
	}
	return nil
}

func (c *Cluster) etcdCall(ctx context.Context, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Kubectl runs the test bed's kubectl against the cluster and returns its standard output. An
// error carries standard error.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return Kubectl(ctx, c.Binaries.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
}

// Kubectl runs the kubectl binary at path with args.
func Kubectl(ctx context.Context, path string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// Stop stops the apiserver and etcd and removes a temporary Dir. It is safe to call twice.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		api := c.api
		c.mu.Unlock()
		if api != nil {
			api.stop(10 * time.Second)
		}
		if c.etcd != nil {
			c.etcd.stop(10 * time.Second)
		}
		if c.ownDir {
			_ = os.RemoveAll(c.Dir)
		}
	})
}

// auditPolicy logs every SubjectAccessReview with its request body, and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    resources: [{group: authorization.k8s.io, resources: [subjectaccessreviews]}]
  - level: None
`

// AuditLog is the apiserver's audit log: one JSON event per line, for every
// SubjectAccessReview, with its request body.
func (c *Cluster) AuditLog() string { return filepath.Join(c.Dir, "audit.log") }

// Users have bearer tokens the apiserver accepts, and no permissions until a test grants them
// some with RBAC. Their groups are only system:authenticated.
var Users = []string{"alice", "bob", "carol", "dave"}

// Token returns the bearer token of "admin" (system:masters) or one of Users.
func (c *Cluster) Token(user string) string { return c.tokens[user] }

// ClientCAFile is the CA the apiserver trusts for client certificates.
func (c *Cluster) ClientCAFile() string { return c.clientCA.certFile }

// ClientCert issues a client certificate for user (CN) in groups (O), signed by the CA the
// apiserver trusts, and returns the paths of the certificate and its key.
func (c *Cluster) ClientCert(user string, groups ...string) (certFile, keyFile string, err error) {
	return c.clientCA.issue(c.Dir, user, groups)
}

// WriteKubeconfig writes a kubeconfig at path for server, trusting the CA in caFile, with a
// bearer token as the user.
func WriteKubeconfig(path, server, caFile, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["server"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "server", AuthInfo: "user", Namespace: "default"}
	cfg.CurrentContext = "default"
	return clientcmd.WriteToFile(*cfg, path)
}

// KubeconfigAs writes a kubeconfig that uses the admin token to impersonate user (and groups),
// so a client runs with exactly that user's RBAC permissions. It returns the file's path.
func (c *Cluster) KubeconfigAs(user string, groups ...string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		return "", err
	}
	cfg.AuthInfos["admin"].Impersonate = user
	cfg.AuthInfos["admin"].ImpersonateGroups = groups
	f, err := os.CreateTemp(c.Dir, "kubeconfig-"+user+"-")
	if err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), clientcmd.WriteToFile(*cfg, f.Name())
}
