// Command demo shows dynwatch at work against a local kube-apiserver: it starts the test bed,
// runs the dynwatch binary with dynwatch.yaml, makes changes with kubectl and prints what
// dynwatch reports after each. Run it with `make demo`.
package main

import (
	"context"
	"crypto/rand"
	"crypto/x509/pkix"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

//go:embed dynwatch.yaml
var demoConfig string

//go:embed crd.yaml
var crd []byte

//go:embed widget.yaml
var widget []byte

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	keep := flag.Bool("keep", false, "keep dynwatch and the apiserver running until interrupted")
	logPath := flag.String("log", "", "write dynwatch's log to this file (default: a file in the demo directory)")
	flag.Parse()

	step("Starting a local etcd and kube-apiserver " + testbed.KubernetesVersion + " (the first run builds them: minutes)")
	cluster, err := testbed.Start(ctx, testbed.Options{Out: os.Stdout})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	fmt.Println("   apiserver:", cluster.URL(), " kubeconfig:", cluster.Kubeconfig)

	step("Starting a webhook receiver that verifies signatures and prints what arrives")
	receiverURL, secretFile, err := startReceiver(cluster.Dir)
	if err != nil {
		return err
	}
	tlsCert, tlsKey, caFile, err := issueServingCert(cluster.Dir)
	if err != nil {
		return err
	}
	configPath := filepath.Join(cluster.Dir, "dynwatch.yaml")
	vars := map[string]string{"RECEIVER_URL": receiverURL, "SECRET_FILE": secretFile, "STATE_FILE": filepath.Join(cluster.Dir, "state.db"),
		"TLS_CERT": tlsCert, "TLS_KEY": tlsKey}
	if err := os.WriteFile(configPath, []byte(os.Expand(demoConfig, func(k string) string { return vars[k] })), 0o600); err != nil {
		return err
	}
	fmt.Println("   receiver:", receiverURL)

	step("Building and starting dynwatch with test/demo/dynwatch.yaml")
	bin, err := runner.Build(ctx, cluster.Dir, false)
	if err != nil {
		return err
	}
	if *logPath == "" {
		*logPath = filepath.Join(cluster.Dir, "dynwatch.log")
	}
	logFile, err := os.Create(*logPath)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }() // the demo's own log: nothing to lose
	// The demo reads dynwatch's API as the test bed's admin, through TLS.
	admin, err := rest.HTTPClientFor(&rest.Config{BearerToken: cluster.Token("admin"), TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}})
	if err != nil {
		return err
	}
	dwOptions := runner.Options{Binary: bin, Config: configPath, Kubeconfig: cluster.Kubeconfig, Log: logFile, APIClient: admin}
	dw, err := runner.Start(dwOptions)
	if err != nil {
		return err
	}
	defer dw.Stop(10 * time.Second) //nolint:errcheck // reported below when it matters
	if err := dw.WaitReady(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, dw.Log())
	}
	api, metrics, _ := dw.WaitListening(ctx)
	fmt.Println("   API:", api, " metrics:", metrics, " log:", *logPath)
	if err := show(ctx, dw, "ready: configmaps and pods synced; widgets not served yet (no CRD)"); err != nil {
		return err
	}

	kubectl := func(args ...string) error {
		fmt.Println("   $ kubectl", strings.Join(args, " "))
		_, err := cluster.Kubectl(ctx, args...)
		return err
	}
	crdPath, widgetPath := filepath.Join(cluster.Dir, "crd.yaml"), filepath.Join(cluster.Dir, "widget.yaml")
	if err := errors.Join(os.WriteFile(crdPath, crd, 0o644), os.WriteFile(widgetPath, widget, 0o644)); err != nil {
		return err
	}
	steps := []struct {
		title string
		cmds  [][]string
	}{
		{"Create configmaps in namespace demo (one has a password dynwatch strips)", [][]string{
			{"create", "namespace", "demo"},
			{"-n", "demo", "create", "configmap", "web", "--from-literal=color=blue", "--from-literal=password=hunter2"},
			{"-n", "demo", "label", "configmap", "web", "app=web"},
			{"-n", "demo", "create", "configmap", "db", "--from-literal=size=10Gi"},
			{"-n", "demo", "annotate", "configmap", "db", "example.com/team=storage"},
		}},
		{"Create a pod bound to node n1 (no kubelet runs; it stays Pending)", [][]string{
			{"-n", "demo", "run", "nginx", "--image=nginx:1.27", "--overrides", `{"spec":{"nodeName":"n1"}}`},
		}},
		{"Install the Widget CRD: dynwatch discovers it within seconds and starts watching", [][]string{
			{"apply", "-f", crdPath},
			{"wait", "--for=condition=Established", "crd/widgets.demo.dynwatch.io"},
		}},
		{"Create a widget, change a configmap, delete the pod", [][]string{
			{"apply", "-f", widgetPath},
			{"-n", "demo", "patch", "configmap", "web", "-p", `{"data":{"color":"green"}}`},
			{"-n", "demo", "delete", "pod", "nginx", "--grace-period=0", "--force"},
		}},
	}
	for _, s := range steps {
		step(s.title)
		for _, c := range s.cmds {
			if err := kubectl(c...); err != nil {
				return err
			}
		}
		time.Sleep(3 * time.Second) // let discovery (every 2s) and the watches catch up before showing
		if err := show(ctx, dw, "after: "+s.title); err != nil {
			return err
		}
	}

	step("Query dynwatch's cache the way you query the apiserver: kubectl and curl, with the admin's token")
	kubeconfigFor := func(user string) (string, error) {
		path := filepath.Join(cluster.Dir, "kubeconfig-dynwatch-"+user)
		return path, testbed.WriteKubeconfig(path, api, caFile, cluster.Token(user))
	}
	dwKubectl := func(user string, args ...string) (string, error) {
		kubeconfig, err := kubeconfigFor(user)
		if err != nil {
			return "", err
		}
		fmt.Printf("   $ kubectl --kubeconfig %s %s\n", kubeconfig, strings.Join(args, " "))
		out, err := testbed.Kubectl(ctx, cluster.Binaries.Kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(cluster.Dir, "kubectl-cache")}, args...)...)
		return string(out), err
	}
	for _, args := range [][]string{
		{"get", "configmaps", "-n", "demo", "-l", "app=web"},
		{"get", "widgets", "-A"},
		{"get", "configmap", "web", "-n", "demo", "-o", "jsonpath={.data}"},
		{"describe", "configmap", "web", "-n", "demo"},
		{"explain", "configmap.data"},
	} {
		out, err := dwKubectl("admin", args...)
		if err != nil {
			return err
		}
		fmt.Println(indent(out))
	}
	query := api + "/api/v1/namespaces/demo/configmaps?index=byTeam&value=storage"
	fmt.Printf("   $ curl --cacert %s -H 'Authorization: Bearer <admin token>' '%s'   (names only)\n", caFile, query)
	if err := printNames(ctx, admin, query); err != nil {
		return err
	}

	step("Every read is the caller's own: alice may read configmaps in demo, carol may not")
	for _, c := range [][]string{
		{"-n", "demo", "create", "role", "configmap-reader", "--verb=get,list,watch", "--resource=configmaps"},
		{"-n", "demo", "create", "rolebinding", "alice-reads-configmaps", "--role=configmap-reader", "--user=alice"},
	} {
		if err := kubectl(c...); err != nil {
			return err
		}
	}
	for _, q := range []struct {
		user string
		args []string
	}{
		{"alice", []string{"get", "configmaps", "-n", "demo"}},
		{"alice", []string{"get", "configmaps", "-A"}},
		{"carol", []string{"get", "configmaps", "-n", "demo"}},
	} {
		out, err := dwKubectl(q.user, q.args...)
		if err != nil {
			out = err.Error()
			if i := strings.LastIndex(out, "Error from server"); i >= 0 {
				out = out[i:]
			}
		}
		fmt.Printf("   (as %s)\n%s\n", q.user, indent(out))
	}

	step("Event counters from " + metrics + "/metrics")
	if err := printMetrics(ctx, metrics, "dynwatch_informer_events_total"); err != nil {
		return err
	}

	step("Stop dynwatch; while it is down, change a configmap and delete the widget")
	if err := dw.Stop(10 * time.Second); err != nil {
		return err
	}
	for _, c := range [][]string{
		{"-n", "demo", "patch", "configmap", "db", "-p", `{"data":{"size":"20Gi"}}`},
		{"-n", "demo", "delete", "widget", "gear"},
	} {
		if err := kubectl(c...); err != nil {
			return err
		}
	}
	step("Start dynwatch again on its state: the receiver gets those two changes and nothing else")
	if dw, err = runner.Start(dwOptions); err != nil {
		return err
	}
	defer dw.Stop(10 * time.Second) //nolint:errcheck // reported below when it matters
	if err := dw.WaitReady(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, dw.Log())
	}
	api, metrics, _ = dw.WaitListening(ctx)
	time.Sleep(3 * time.Second) // let the widgets' CRD be discovered and its list compared
	if err := printMetrics(ctx, metrics, "dynwatch_state_suppressed_events_total"); err != nil {
		return err
	}
	if *keep {
		step("Still running. Try: kubectl --kubeconfig " + filepath.Join(cluster.Dir, "kubeconfig-dynwatch-alice") + " get cm -n demo\n   curl " + metrics + "/metrics\n   kubectl --kubeconfig " + cluster.Kubeconfig + " get cm -n demo   (the apiserver)\n   Press Ctrl-C to stop.")
		<-ctx.Done()
	}
	if dw, err = highAvailability(ctx, cluster, dw, dwOptions, vars, kubectl); err != nil {
		return err
	}
	step("Stopping dynwatch with SIGTERM")
	if err := dw.Stop(10 * time.Second); err != nil {
		return err
	}
	fmt.Println("   dynwatch exited 0")
	return nil
}

// highAvailability stops dw and runs two replicas with leader election in its place, kills the
// leader, and shows the other take over and deliver. It returns the survivor.
func highAvailability(ctx context.Context, cluster *testbed.Cluster, dw *runner.Process, o runner.Options, vars map[string]string, kubectl func(...string) error) (*runner.Process, error) {
	step("High availability: two replicas with leader election (a 4s lease) in place of the one")
	if err := dw.Stop(10 * time.Second); err != nil {
		return nil, err
	}
	replicas := map[string]*runner.Process{}
	for _, id := range []string{"a", "b"} {
		state := vars["STATE_FILE"]
		if id == "b" {
			state = filepath.Join(cluster.Dir, "state-b.db")
		}
		cfg := os.Expand(demoConfig, func(k string) string {
			if k == "STATE_FILE" {
				return state
			}
			return vars[k]
		}) + "leaderElection: {enabled: true, namespace: default, identity: " + id + ", leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 500ms}\n"
		o.Config = filepath.Join(cluster.Dir, "dynwatch-"+id+".yaml")
		if err := os.WriteFile(o.Config, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		p, err := runner.Start(o)
		if err != nil {
			return nil, err
		}
		if err := p.WaitReady(ctx); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, p.Log())
		}
		replicas[id] = p
	}
	leaderOf := func() string {
		for id, p := range replicas {
			if st, err := p.Status(ctx); err == nil {
				if le, ok := st.LeaderElection.(map[string]any); ok && le["leading"] == true {
					return id
				}
			}
		}
		return ""
	}
	var leader string
	for leader = leaderOf(); leader == ""; leader = leaderOf() {
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Println("   both replicas answer queries; replica", leader, "holds the Lease default/dynwatch and delivers")
	if err := kubectl("-n", "demo", "patch", "configmap", "web", "-p", `{"data":{"color":"red"}}`); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second)
	step("SIGKILL replica " + leader + ", then change the configmap again: the other takes over and delivers it")
	killed := time.Now()
	if err := replicas[leader].Signal(syscall.SIGKILL); err != nil {
		return nil, err
	}
	<-replicas[leader].Done()
	delete(replicas, leader)
	if err := kubectl("-n", "demo", "patch", "configmap", "web", "-p", `{"data":{"color":"yellow"}}`); err != nil {
		return nil, err
	}
	var next string
	for next = leaderOf(); next == ""; next = leaderOf() {
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("   replica %s leads %.1fs after the kill\n", next, time.Since(killed).Seconds())
	time.Sleep(2 * time.Second) // let its delivery print
	return replicas[next], nil
}

// out serialises the demo's output with the receiver's.
var out sync.Mutex

func step(s string) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf("\n== %s\n", s)
}

// startReceiver serves a webhook receiver on 127.0.0.1 that verifies each request's Standard
// Webhooks signature and prints the event. It returns its URL and the signing secret's file.
func startReceiver(dir string) (string, string, error) {
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	secretFile := filepath.Join(dir, "signing-secret")
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		return "", "", err
	}
	verifier, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return "", "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			verified := "signature ok"
			if err := verifier.Verify(body, r.Header); err != nil {
				verified = "BAD SIGNATURE: " + err.Error()
			}
			out.Lock()
			fmt.Printf("   webhook <- %-8s %-45s ce-id=%s  %s\n", strings.TrimPrefix(r.Header.Get("ce-type"), "io.dynwatch.resource."),
				r.Header.Get("ce-source")+" "+r.Header.Get("ce-subject"), r.Header.Get("ce-id"), verified)
			out.Unlock()
		}))
	}()
	return "http://" + ln.Addr().String() + "/events", secretFile, nil
}

func show(ctx context.Context, dw *runner.Process, title string) error {
	st, err := dw.Status(ctx)
	if err != nil {
		return err
	}
	out.Lock()
	defer out.Unlock()
	fmt.Printf("   /status (%s): ready=%v\n", title, st.Ready)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "   RESOURCE\tSTATE\tOBJECTS\tINDEXERS\tREASON")
	for _, r := range st.Resources {
		fmt.Fprintf(w, "   %s\t%s\t%d\t%s\t%s\n", r.Resource, r.State, r.Objects, strings.Join(r.Indexers, ","), r.Reason)
	}
	return w.Flush()
}

func indent(s string) string {
	return "     " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n     ")
}

func printNames(ctx context.Context, client *http.Client, url string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var list struct {
		Kind  string
		Items []struct {
			Metadata struct{ Namespace, Name string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return err
	}
	for _, item := range list.Items {
		fmt.Printf("     %s %s/%s  (lookup: %s)\n", list.Kind, item.Metadata.Namespace, item.Metadata.Name, resp.Header.Get("X-Dynwatch-Lookup"))
	}
	return nil
}

func printMetrics(ctx context.Context, base, prefix string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			fmt.Println("   " + line)
		}
	}
	return nil
}

// issueServingCert makes a CA and a certificate for 127.0.0.1 signed by it, as a Secret
// (or cert-manager) would provide, and returns the certificate's, key's and CA's paths.
func issueServingCert(dir string) (cert, key, ca string, err error) {
	caCert, caKey, caPEM, _, err := testbed.NewCert(pkix.Name{CommonName: "demo-ca"}, nil, nil, nil)
	if err != nil {
		return "", "", "", err
	}
	_, _, certPEM, keyPEM, err := testbed.NewCert(pkix.Name{CommonName: "dynwatch"}, []string{"127.0.0.1", "localhost"}, caCert, caKey)
	if err != nil {
		return "", "", "", err
	}
	cert, key, ca = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key"), filepath.Join(dir, "api-ca.crt")
	return cert, key, ca, errors.Join(os.WriteFile(cert, certPEM, 0o600), os.WriteFile(key, keyPEM, 0o600), os.WriteFile(ca, caPEM, 0o600))
}
