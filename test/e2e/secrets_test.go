package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestNoSecretValueSurvivesAnyTransformFlags applies a secret with kubectl (so it carries the
// last-applied annotation, which repeats its values), changes it, and looks for its values,
// plain and base64, in everything dynwatch produced: API answers (get, list, watch), webhook
// bodies, dead letters, the state store's file and the debug log. keepSecretData is false;
// the other transform flags take every combination.
func TestNoSecretValueSurvivesAnyTransformFlags(t *testing.T) {
	t.Parallel()
	for _, flags := range []struct{ managed, lastApplied bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		t.Run(fmt.Sprintf("stripManagedFields=%t,stripLastAppliedConfiguration=%t", flags.managed, flags.lastApplied), func(t *testing.T) {
			t.Parallel()
			ns := namespace(t)
			dir := t.TempDir()
			ok, rejecting := newReceiver(t, nil, false), newReceiver(t, func(int) int { return http.StatusBadRequest }, false)
			deadLetters, caFile := filepath.Join(dir, "dead-letters.jsonl"), filepath.Join(dir, "ca.crt")
			p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
resources:
  - version: v1
    resource: secrets
    namespaces: [%s]
    transform: {stripManagedFields: %t, stripLastAppliedConfiguration: %t}
webhooks:
  - {name: ok, url: %q}
  - {name: rejecting, url: %q, deadLetter: {file: %s}}
state: {path: %s}
api: {address: "127.0.0.1:0", tls: {selfSignedCAFile: %s}}
metrics: {address: "127.0.0.1:0"}
log: {level: debug}
`, ns, flags.managed, flags.lastApplied, ok.URL, rejecting.URL, deadLetters, filepath.Join(dir, "state.db"), caFile))
			if err := p.WaitReady(t.Context()); err != nil {
				t.Fatal(err)
			}
			var values []string
			for i := range 2 {
				values = append(values, secretValue(t, i))
			}
			// A name that occurs nowhere but where the secret is: each place is checked to
			// mention it, so a place that never saw the secret cannot pass for a clean one.
			suffix := make([]byte, 6)
			if _, err := rand.Read(suffix); err != nil {
				t.Fatal(err)
			}
			name := "db-" + hex.EncodeToString(suffix)
			apply := func(version int) {
				t.Helper()
				manifest := fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":%q,"namespace":%q,"labels":{"v":"%d"}},
"stringData":{"password":%q},"data":{"token":%q}}`, name, ns, version, values[0], base64.StdEncoding.EncodeToString([]byte(values[1])))
				path := filepath.Join(dir, "secret.json")
				writeFile(t, path, manifest)
				if out, err := cluster.Kubectl(t.Context(), "apply", "-f", path); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
			}
			apply(1)
			apply(2)
			ok.waitFor(t, 2, 15*time.Second)
			testbed.Eventually(t, 15*time.Second, func() error {
				if n, _ := countDeadLetters(deadLetters, "rejected"); n < 2 {
					return fmt.Errorf("%d dead letters, want 2", n)
				}
				return nil
			})

			url, _, _ := p.WaitListening(t.Context())
			api := dynwatchAPI{url: url, caFile: caFile}.client(t, cluster.Config.BearerToken)
			places := map[string][]byte{}
			for _, path := range []string{"/api/v1/namespaces/" + ns + "/secrets/" + name, "/api/v1/namespaces/" + ns + "/secrets", "/api/v1/secrets?watch=true&timeoutSeconds=1"} {
				resp, err := api.Get(url + path)
				if err != nil {
					t.Fatal(err)
				}
				places["GET "+path], _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			for i, r := range append(ok.got(), rejecting.got()...) {
				places[fmt.Sprintf("webhook body %d", i)] = r.body
			}
			if err := p.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(deadLetters)
			if err != nil {
				t.Fatal(err)
			}
			places["dead letters"] = b
			// The state store is a directory of log files: all of them, together.
			files, _ := filepath.Glob(filepath.Join(dir, "state.db", "*.wal"))
			if len(files) == 0 {
				t.Fatal("no state store files")
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				places["state store"] = append(places["state store"], b...)
			}
			places["log"] = []byte(p.Log())

			for place, b := range places {
				if !bytes.Contains(b, []byte(name)) {
					t.Errorf("%s does not mention the secret %s at all; the check proves nothing:\n%.500s", place, name, b)
				}
				for _, v := range values {
					for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
						if i := bytes.Index(b, []byte(form)); i >= 0 {
							t.Errorf("%s holds a secret value (%s): ...%s...", place, form, b[max(0, i-200):min(len(b), i+len(form)+50)])
						}
					}
				}
			}
		})
	}
}

// secretValue is a recognisable random value that occurs nowhere else.
func secretValue(t *testing.T, i int) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("SECRET%d-%s", i, strings.ToUpper(hex.EncodeToString(b)))
}
