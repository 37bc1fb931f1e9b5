package e2e

import (
	"net/http"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// dynwatchAPI is a dynwatch query API served over TLS with a CA the test can trust.
type dynwatchAPI struct {
	url    string
	caFile string
}

// restConfig is a client-go configuration for dynwatch with token as credential ("" for none).
func (d dynwatchAPI) restConfig(token string) *rest.Config {
	return &rest.Config{Host: d.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: d.caFile}}
}

// client is an HTTP client that trusts dynwatch's CA and sends token ("" for none).
func (d dynwatchAPI) client(t *testing.T, token string) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(d.restConfig(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubeconfig writes a kubeconfig whose server is dynwatch and whose user is token.
func (d dynwatchAPI) kubeconfig(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testbed.WriteKubeconfig(path, d.url, d.caFile, token); err != nil {
		t.Fatal(err)
	}
	return path
}
