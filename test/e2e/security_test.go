package e2e

import (
	"crypto/x509/pkix"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// caller is one identity a test sends requests as.
type caller struct {
	name              string
	token             string
	certFile, keyFile string
}

// config is a client configuration for host, trusting the CA in caFile or caData.
func (c caller) config(host, caFile string, caData []byte) *rest.Config {
	return &rest.Config{Host: host, BearerToken: c.token, TLSClientConfig: rest.TLSClientConfig{
		CAFile: caFile, CAData: caData, CertFile: c.certFile, KeyFile: c.keyFile,
	}}
}

// securityFixture is one dynwatch with the secure defaults and client certificates from the
// test bed's client CA, two namespaces with a configmap and a secret each, and callers whose
// RBAC differs.
type securityFixture struct {
	dynwatchAPI
	a, b    string // namespaces
	callers []caller
}

func startSecured(t *testing.T) securityFixture {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources:
  - {version: v1, resource: configmaps}
  - {version: v1, resource: secrets}
  - {version: v1, resource: pods}
api:
  address: "127.0.0.1:0"
  tls: {selfSignedCAFile: %s}
  auth: {clientCAFile: %s}
metrics: {address: "127.0.0.1:0"}
`, caFile, cluster.ClientCAFile()))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	f := securityFixture{dynwatchAPI: dynwatchAPI{url: url, caFile: caFile}, a: namespace(t), b: namespace(t)}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	ctx := t.Context()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{f.a, f.b} {
		must(cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}))
		must(cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}))
	}
	readCM := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}
	clusterRole := "cm-reader-" + f.a
	must(cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: clusterRole}, Rules: readCM}, metav1.CreateOptions{}))
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(ctx, clusterRole, metav1.DeleteOptions{}) })
	must(cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bob-" + f.a},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "bob"}},
	}, metav1.CreateOptions{}))
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, "bob-"+f.a, metav1.DeleteOptions{}) })
	// alice reads configmaps in a; dave may get the one secret s in b, not list it; the
	// service account reads configmaps in b; the group "readers" (a client certificate's O)
	// reads configmaps in a.
	roles := []struct {
		ns, name string
		rules    []rbacv1.PolicyRule
		subject  rbacv1.Subject
	}{
		{f.a, "alice", readCM, rbacv1.Subject{Kind: "User", Name: "alice"}},
		{f.b, "dave", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"s"}, Verbs: []string{"get"}}}, rbacv1.Subject{Kind: "User", Name: "dave"}},
		{f.b, "sa", readCM, rbacv1.Subject{Kind: "ServiceAccount", Name: "reader", Namespace: f.b}},
		{f.a, "readers", readCM, rbacv1.Subject{Kind: "Group", Name: "readers"}},
	}
	for _, r := range roles {
		must(cs.RbacV1().Roles(r.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: r.name}, Rules: r.rules}, metav1.CreateOptions{}))
		must(cs.RbacV1().RoleBindings(r.ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: r.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: r.name},
			Subjects:   []rbacv1.Subject{r.subject},
		}, metav1.CreateOptions{}))
	}
	must(cs.CoreV1().ServiceAccounts(f.b).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{}))
	tr, err := cs.CoreV1().ServiceAccounts(f.b).CreateToken(ctx, "reader", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := cluster.ClientCert("erin", "readers")
	if err != nil {
		t.Fatal(err)
	}
	f.callers = []caller{
		{name: "no credential"},
		{name: "a bad token", token: "not-a-token"},
		{name: "alice, a namespaced Role", token: cluster.Token("alice")},
		{name: "bob, a ClusterRole", token: cluster.Token("bob")},
		{name: "carol, no rights", token: cluster.Token("carol")},
		{name: "dave, get one secret by name", token: cluster.Token("dave")},
		{name: "a ServiceAccount", token: tr.Status.Token},
		{name: "erin, a client certificate in group readers", certFile: certFile, keyFile: keyFile},
	}
	return f
}

func TestEveryCallerGetsWhatTheAPIServerGivesThem(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	paths := []string{
		"/api/v1/configmaps",
		"/api/v1/configmaps?watch=true&timeoutSeconds=5",
		"/api/v1/namespaces/" + f.a + "/configmaps",
		"/api/v1/namespaces/" + f.a + "/configmaps?watch=true&timeoutSeconds=5",
		"/api/v1/namespaces/" + f.a + "/configmaps/cm",
		"/api/v1/namespaces/" + f.a + "/configmaps?fieldSelector=metadata.name%3Dcm",
		"/api/v1/namespaces/" + f.b + "/configmaps",
		"/api/v1/namespaces/" + f.b + "/configmaps/cm",
		"/api/v1/namespaces/" + f.b + "/secrets",
		"/api/v1/namespaces/" + f.b + "/secrets/s",
		"/api/v1/namespaces/" + f.b + "/secrets?fieldSelector=metadata.name%3Ds",
		"/api/v1/secrets",
		"/api/v1/pods?watch=true&timeoutSeconds=5",
		"/api",
		"/api/v1",
		"/apis",
	}
	allowed := map[string]int{}
	for _, c := range f.callers {
		t.Run(c.name, func(t *testing.T) {
			apiserver := httpClient(t, c.config(cluster.URL(), "", cluster.Config.CAData))
			dynwatch := httpClient(t, c.config(f.url, f.caFile, nil))
			for _, path := range paths {
				want := ask(t, apiserver, cluster.URL()+path)
				var got answer
				// A cached denial from the first look at a new RoleBinding may linger for the
				// deny cache's TTL; the apiserver's answer is the reference.
				testbed.Eventually(t, 15*time.Second, func() error {
					if got = ask(t, dynwatch, f.url+path); got != want {
						return fmt.Errorf("GET %s: dynwatch answered %v, the apiserver %v", path, got, want)
					}
					return nil
				})
				if got.code == http.StatusOK {
					allowed[c.name]++
				}
			}
		})
	}
	// The matrix must hold both answers for the users with rights, or it proves little.
	for _, c := range f.callers[2:] {
		if n := allowed[c.name]; c.name != "carol, no rights" && (n == 0 || n == len(paths)) {
			t.Errorf("%s was allowed %d of %d requests: the fixture's RBAC does not separate", c.name, n, len(paths))
		}
	}
}

func TestStatusNeedsItsOwnPermission(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	tests := []struct {
		caller caller
		want   int
	}{
		{caller{name: "admin", token: cluster.Config.BearerToken}, http.StatusOK},
		{caller{name: "carol", token: cluster.Token("carol")}, http.StatusForbidden},
		{caller{name: "nobody"}, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		if got := ask(t, httpClient(t, tt.caller.config(f.url, f.caFile, nil)), f.url+"/status"); got.code != tt.want {
			t.Errorf("GET /status as %s = %v, want %d", tt.caller.name, got, tt.want)
		}
	}
	// /version is public, as the apiserver's system:public-info-viewer makes it.
	if got := ask(t, httpClient(t, caller{}.config(f.url, f.caFile, nil)), f.url+"/version"); got.code != http.StatusOK {
		t.Errorf("GET /version without credentials = %v, want 200", got)
	}
}

func TestKubectlWithAUsersTokenThroughTLS(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	alice := f.kubeconfig(t, cluster.Token("alice"))
	apiserver := writeKubeconfigAs(t, cluster.Token("alice"))
	t.Run("what alice may list", func(t *testing.T) {
		want := kubectl(t, apiserver, "get", "cm", "-n", f.a, "-o", "name")
		testbed.Eventually(t, 15*time.Second, func() error {
			if got := kubectl(t, alice, "get", "cm", "-n", f.a, "-o", "name"); got != want {
				return fmt.Errorf("kubectl get cm -n %s as alice: dynwatch %q, the apiserver %q", f.a, got, want)
			}
			return nil
		})
	})
	t.Run("what alice may not list", func(t *testing.T) {
		_, want := testbed.Kubectl(t.Context(), cluster.Binaries.Kubectl, "--kubeconfig", apiserver, "get", "cm", "-A")
		_, got := testbed.Kubectl(t.Context(), cluster.Binaries.Kubectl, "--kubeconfig", alice, "--cache-dir", t.TempDir(), "get", "cm", "-A")
		if want == nil || got == nil {
			t.Fatalf("kubectl get cm -A as alice: apiserver error %v, dynwatch error %v; want both refused", want, got)
		}
		if w, g := forbiddenLine(want.Error()), forbiddenLine(got.Error()); w == "" || w != g {
			t.Fatalf("kubectl get cm -A as alice:\ndynwatch:      %s\nthe apiserver: %s", g, w)
		}
	})
}

// forbiddenLine is kubectl's "Error from server (Forbidden): ..." line in err, or "".
func forbiddenLine(err string) string {
	for line := range strings.SplitSeq(err, "\n") {
		if i := strings.Index(line, "Error from server (Forbidden)"); i >= 0 {
			return line[i:]
		}
	}
	return ""
}

// writeKubeconfigAs writes a kubeconfig for the test bed's apiserver with token as the user.
func writeKubeconfigAs(t *testing.T, token string) string {
	t.Helper()
	d := dynwatchAPI{url: cluster.URL(), caFile: filepath.Join(t.TempDir(), "apiserver-ca.crt")}
	if err := os.WriteFile(d.caFile, cluster.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	return d.kubeconfig(t, token)
}

func TestARotatedServingCertificateIsServedWithoutRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	issue := func(version string) (caPEM []byte) {
		t.Helper()
		ca, caKey, caPEM, _, err := testbed.NewCert(pkix.Name{CommonName: "ca-" + version}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _, certPEM, keyPEM, err := testbed.NewCert(pkix.Name{CommonName: "dynwatch-" + version}, []string{"127.0.0.1"}, ca, caKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := kubeletSwap(dir, version, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}); err != nil {
			t.Fatal(err)
		}
		return caPEM
	}
	first := issue("v1")
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps}]
api: {address: "127.0.0.1:0", tls: {certFile: %[1]s/tls.crt, keyFile: %[1]s/tls.key}}
metrics: {address: "127.0.0.1:0"}
`, dir))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	admin := caller{token: cluster.Config.BearerToken}
	if got := ask(t, httpClient(t, admin.config(url, "", first)), url+"/api/v1/configmaps"); got.code != http.StatusOK {
		t.Fatalf("with the first certificate: %v", got)
	}
	second := issue("v2")
	start := time.Now()
	testbed.Eventually(t, 30*time.Second, func() error {
		client := httpClient(t, admin.config(url, "", second))
		resp, err := client.Get(url + "/api/v1/configmaps")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	t.Logf("the rotated certificate was served %s after the swap", time.Since(start).Round(time.Millisecond))
	kubeconfig := dynwatchAPI{url: url, caFile: filepath.Join(dir, "ca-v2.crt")}
	if err := os.WriteFile(kubeconfig.caFile, second, 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, kubeconfig.kubeconfig(t, cluster.Token("bob")), "version")
}

// kubeletSwap writes files into dir the way the kubelet updates a mounted Secret: into a new
// timestamped directory, then an atomic rename of the ..data symlink (each name is a symlink
// into ..data), then removal of the previous directory.
func kubeletSwap(dir, version string, files map[string][]byte) error {
	ts := "..v-" + version
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), b, 0o600); err != nil {
			return err
		}
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	previous, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	if previous == "" {
		return nil
	}
	return os.RemoveAll(filepath.Join(dir, previous))
}
