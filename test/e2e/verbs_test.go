package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestVerbsAndBooleansAgreeWithTheAPIServer sends the same GETs, with the same token, to the
// apiserver and to dynwatch: watch and the other boolean parameters in every spelling, and
// watch on paths that name an object. Both must answer with the same status and the same
// first value: a list, an object or a watch event.
func TestVerbsAndBooleansAgreeWithTheAPIServer(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	var paths []string
	for _, v := range []string{"1", "true", "TRUE", "", "t", "f", "yes", "no", "0", "false", "False"} {
		paths = append(paths, "/api/v1/namespaces/"+f.a+"/configmaps?timeoutSeconds=5&watch="+v)
	}
	for _, v := range []string{"1", "true", "f", "yes"} {
		paths = append(paths, "/api/v1/namespaces/"+f.a+"/configmaps/cm?watch="+v)
	}
	paths = append(paths,
		"/api/v1/namespaces/"+f.a+"/configmaps?timeoutSeconds=5&watch=1&allowWatchBookmarks=yes",
		"/api/v1/namespaces/"+f.a+"/configmaps?timeoutSeconds=5&watch=1&allowWatchBookmarks=on&sendInitialEvents=yes&resourceVersionMatch=NotOlderThan",
		"/api/v1/namespaces/"+f.a+"/configmaps?timeoutSeconds=5&watch=1&allowWatchBookmarks=&sendInitialEvents=&resourceVersionMatch=NotOlderThan",
		"/api/v1/namespaces/"+f.a+"/configmaps?timeoutSeconds=5&watch=1&fieldSelector=metadata.name%3Dcm",
		"/api/v1/namespaces/"+f.b+"/secrets/s?watch=1",
		"/api/v1/namespaces/"+f.b+"/secrets/s?watch=true&timeoutSeconds=5",
		"/api/v1/namespaces/"+f.b+"/secrets?watch=1&timeoutSeconds=5&fieldSelector=metadata.name%3Ds",
		"/api/v1/namespaces/"+f.b+"/secrets?watch=f&timeoutSeconds=5",
	)
	callers := []caller{f.callers[2], f.callers[4], f.callers[5]} // alice, carol, dave
	for _, c := range callers {
		t.Run(c.name, func(t *testing.T) {
			apiserver := httpClient(t, c.config(cluster.URL(), "", cluster.Config.CAData))
			dynwatch := httpClient(t, c.config(f.url, f.caFile, nil))
			for _, path := range paths {
				want := askFirst(t, apiserver, cluster.URL()+path)
				if want.code == 0 {
					t.Fatalf("GET %s from the apiserver: %s", path, want.first)
				}
				var got reply
				// A denial cached from before the fixture's RoleBindings may linger for the deny
				// cache's TTL; the apiserver's answer is the reference.
				testbed.Eventually(t, 15*time.Second, func() error {
					if got = askFirst(t, dynwatch, f.url+path); got != want {
						return fmt.Errorf("GET %s: dynwatch answered %+v, the apiserver %+v", path, got, want)
					}
					return nil
				})
			}
		})
	}
}

// TestAGetOnlyCallerCannotHoldAWatch: dave may get the secret s and nothing else. A GET of it
// with watch answers the object and ends, as the apiserver's does; the watch form is refused.
func TestAGetOnlyCallerCannotHoldAWatch(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	dave := f.callers[5]
	client := httpClient(t, dave.config(f.url, f.caFile, nil))
	url := f.url + "/api/v1/namespaces/" + f.b + "/secrets/s?watch=1"
	var body []byte
	testbed.Eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if body, err = io.ReadAll(resp.Body); err != nil {
			return fmt.Errorf("GET %s did not end: %w (read %.200s)", url, err, body)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s = %d %.200s", url, resp.StatusCode, body)
		}
		return nil
	})
	var secret struct{ Kind, Type string }
	if err := json.Unmarshal(body, &secret); err != nil || secret.Kind != "Secret" || secret.Type != "Opaque" {
		t.Errorf("GET %s answered %.300s; want the Secret alone", url, body)
	}
	watch := f.url + "/api/v1/namespaces/" + f.b + "/secrets?watch=1&fieldSelector=metadata.name%3Ds"
	if got := askFirst(t, client, watch); got.code != http.StatusForbidden {
		t.Errorf("GET %s as dave = %+v, want 403", watch, got)
	}
}

// TestSubjectAccessReviewsCarryTheRequestsSelectors lists and watches with label and field
// selectors, and reads the SubjectAccessReviews dynwatch sent from the apiserver's audit log:
// each carries the selectors' requirements, as the apiserver passes them to its authorizers
// (AuthorizeWithSelectors). RBAC ignores them, so the audit log is where they can be seen.
func TestSubjectAccessReviewsCarryTheRequestsSelectors(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	alice := f.callers[2]
	client := httpClient(t, alice.config(f.url, f.caFile, nil))
	// The label value is this test's own namespace, so no earlier review answers from a cache.
	for _, verb := range []string{"list", "watch"} {
		url := f.url + "/api/v1/namespaces/" + f.a + "/configmaps?labelSelector=app!%3D" + verb + "-" + f.a + "&fieldSelector=metadata.name%3Dcm"
		if verb == "watch" {
			url += "&watch=1&timeoutSeconds=1"
		}
		testbed.Eventually(t, 15*time.Second, func() error {
			if got := askFirst(t, client, url); got.code != http.StatusOK {
				return fmt.Errorf("GET %s as alice = %+v", url, got)
			}
			return nil
		})
		testbed.Eventually(t, 10*time.Second, func() error {
			reviews, err := auditedReviews(cluster.AuditLog(), "alice", f.a, verb)
			if err != nil {
				return err
			}
			want := fmt.Sprintf("labels [{app NotIn [%s-%s]}], fields [{metadata.name In [cm]}]", verb, f.a)
			var seen []string
			for _, r := range reviews {
				got := selectorsOf(r)
				if got == want {
					return nil
				}
				seen = append(seen, got)
			}
			return fmt.Errorf("no SubjectAccessReview for alice's %s in %s carries %s; seen: %q", verb, f.a, want, seen)
		})
	}
}

// auditedReviews are the SubjectAccessReviews in the audit log at path for user's verb in ns.
func auditedReviews(path, user, ns, verb string) ([]authorizationv1.SubjectAccessReview, error) {
	return auditedReviewsIn(path, -1, user, ns, verb)
}

// auditedReviewsIn is auditedReviews in the log's first size bytes (a size from auditLogSize),
// the whole log when size is negative. A line being written as the size was taken is left out.
// Reading a shared test bed's log takes seconds on a loaded machine: a review made while it
// is read, after the moment the caller asks about, is not in those bytes.
func auditedReviewsIn(path string, size int64, user, ns, verb string) ([]authorizationv1.SubjectAccessReview, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = file.Close() }()
	var r io.Reader = file
	if size >= 0 {
		r = io.LimitReader(file, size)
	}
	var out []authorizationv1.SubjectAccessReview
	lines := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := lines.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return out, nil // a last line without its newline is still being written
		}
		if err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		var event struct {
			RequestObject *authorizationv1.SubjectAccessReview `json:"requestObject"`
		}
		if err := json.Unmarshal(line, &event); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		sar := event.RequestObject
		if sar == nil || sar.Spec.User != user || sar.Spec.ResourceAttributes == nil {
			continue
		}
		if a := sar.Spec.ResourceAttributes; a.Namespace == ns && a.Verb == verb {
			out = append(out, *sar)
		}
	}
}

// auditLogSize is the size of the shared test bed's audit log now.
func auditLogSize(t *testing.T) int64 {
	t.Helper()
	info, err := os.Stat(cluster.AuditLog())
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// selectorsOf writes a review's selector requirements as "labels [...], fields [...]".
func selectorsOf(r authorizationv1.SubjectAccessReview) string {
	a := r.Spec.ResourceAttributes
	var labels, fields []string
	if a.LabelSelector != nil {
		for _, q := range a.LabelSelector.Requirements {
			labels = append(labels, fmt.Sprintf("{%s %s %v}", q.Key, q.Operator, q.Values))
		}
	}
	if a.FieldSelector != nil {
		for _, q := range a.FieldSelector.Requirements {
			fields = append(fields, fmt.Sprintf("{%s %s %v}", q.Key, q.Operator, q.Values))
		}
	}
	slices.Sort(labels)
	slices.Sort(fields)
	return fmt.Sprintf("labels [%s], fields [%s]", strings.Join(labels, " "), strings.Join(fields, " "))
}

// wsAnswer is how a server answered a websocket upgrade: the status code and, for 101, the
// first message read as askFirst reads a body; otherwise the kind of the JSON body, if any.
type wsAnswer struct {
	code     int
	protocol string // the Sec-WebSocket-Protocol answered
	first    string
}

// askWebSocket sends a websocket upgrade GET for path over HTTP/1.1 with cfg's bearer token
// and the given extra headers, and reads the answer: the first frame's message after a 101.
func askWebSocket(t *testing.T, cfg *rest.Config, base, path string, header http.Header) wsAnswer {
	t.Helper()
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig.NextProtos = []string{"http/1.1"}
	u, _ := neturl.Parse(base)
	dialer := &tls.Dialer{Config: tlsConfig}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	if cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, req)
	if err != nil {
		t.Fatalf("GET %s with a websocket upgrade: %v", path, err)
	}
	a := wsAnswer{code: resp.StatusCode, protocol: resp.Header.Get("Sec-WebSocket-Protocol")}
	var body io.Reader = resp.Body
	if resp.StatusCode == http.StatusSwitchingProtocols {
		msg, err := readFrame(r)
		if err != nil {
			// No frame before the watch's timeout (a cache still filling on a loaded
			// machine): an answer that differs, which a caller waiting for agreement retries.
			a.first = fmt.Sprintf("no first frame: %v", err)
			return a
		}
		body = bytes.NewReader(msg)
	}
	var v struct {
		Kind   string          `json:"kind"`
		Type   string          `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if json.NewDecoder(body).Decode(&v) == nil {
		a.first = v.Kind
		if v.Type != "" && v.Object != nil {
			a.first = "watch event " + v.Type
		}
	}
	return a
}

// readFrame reads one unmasked websocket frame from a server and returns its payload.
func readFrame(r *bufio.Reader) ([]byte, error) {
	var head [2]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := uint64(head[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > 1<<20 {
		return nil, fmt.Errorf("a frame of %d bytes", n)
	}
	payload := make([]byte, n)
	_, err := io.ReadFull(r, payload)
	return payload, err
}

// TestAWebSocketWatchIsAnsweredAsTheAPIServerAnswersIt sends websocket upgrades, with the
// same credentials, to the apiserver and to dynwatch: a watch with an Origin is upgraded and
// its events are websocket messages; without an Origin the handshake is refused; a token may
// ride in the websocket protocol header, next to the protocol the server echoes; a caller without rights is refused first; a get and
// a list ignore the upgrade.
func TestAWebSocketWatchIsAnsweredAsTheAPIServerAnswersIt(t *testing.T) {
	t.Parallel()
	f := startSecured(t)
	alice, carol := f.callers[2], f.callers[4]
	origin := http.Header{"Origin": {"https://dynwatch.example"}}
	protocol := http.Header{
		"Origin":                 {"https://dynwatch.example"},
		"Sec-Websocket-Protocol": {"base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(alice.token)) + ", dynwatch.test"},
	}
	watch := "/api/v1/namespaces/" + f.a + "/configmaps?watch=1&timeoutSeconds=5"
	tests := []struct {
		name   string
		caller caller
		path   string
		header http.Header
	}{
		{"a watch with an Origin", alice, watch, origin},
		{"a watch without an Origin", alice, watch, nil},
		{"a watch with the token in the websocket protocol", caller{}, watch, protocol},
		{"a watch by a caller without rights", carol, watch, origin},
		{"a named get", alice, "/api/v1/namespaces/" + f.a + "/configmaps/cm?watch=1", origin},
		{"a list", alice, "/api/v1/namespaces/" + f.a + "/configmaps", origin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := askWebSocket(t, tt.caller.config(cluster.URL(), "", cluster.Config.CAData), cluster.URL(), tt.path, tt.header)
			var got wsAnswer
			testbed.Eventually(t, 15*time.Second, func() error {
				if got = askWebSocket(t, tt.caller.config(f.url, f.caFile, nil), f.url, tt.path, tt.header); got != want {
					return fmt.Errorf("GET %s upgraded: dynwatch answered %+v, the apiserver %+v", tt.path, got, want)
				}
				return nil
			})
			t.Logf("both answered %+v", got)
		})
	}
}
