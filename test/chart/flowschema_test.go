package chart

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// dispatched reads apiserver_flowcontrol_dispatched_requests_total from the apiserver's
// /metrics, by "flow schema/priority level".
func dispatched(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	s := bufio.NewScanner(bytes.NewReader(body))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		line, ok := strings.CutPrefix(s.Text(), "apiserver_flowcontrol_dispatched_requests_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(line, "} ")
		var fs, pl string
		for _, l := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(l, "=")
			switch v = strings.Trim(v, `"`); k {
			case "flow_schema":
				fs = v
			case "priority_level":
				pl = v
			}
		}
		n, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", s.Text(), err)
		}
		out[fs+"/"+pl] += n
	}
	return out, s.Err()
}

// TestFlowSchemasPutLeaderElectionAndReviewsWhereIntended applies the rendered FlowSchemas,
// runs dynwatch as the chart's ServiceAccount with leader election and the query API, and
// reads the apiserver's flow-control metrics: its Lease and checkpoint requests are
// dispatched in the leader-election priority level, its TokenReviews and SubjectAccessReviews
// in workload-low under their own FlowSchema.
func TestFlowSchemasPutLeaderElectionAndReviewsWhereIntended(t *testing.T) {
	release, watched := "dynwatch-fs", "fs-watched"
	for _, ns := range []string{release, watched} {
		namespace(t, ns)
	}
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
config:
  resources:
    - {version: v1, resource: configmaps, namespaces: [`+watched+`]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A release name of its own: the chart's cluster-scoped objects are named after it.
	out, err := helm(t, "template", "fs", chartDir, "--namespace", release, "-f", values)
	if err != nil {
		t.Fatal(err)
	}
	var applied []*unstructured.Unstructured
	schemas := map[string]string{} // FlowSchema → its priority level
	for _, o := range objects(t, out) {
		if o.GetKind() == "FlowSchema" {
			schemas[o.GetName()], _, _ = unstructured.NestedString(o.Object, "spec", "priorityLevelConfiguration", "name")
		}
		if slices.Contains([]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Lease", "FlowSchema"}, o.GetKind()) ||
			o.GetKind() == "ConfigMap" && o.GetName() == "fs-dynwatch-checkpoints" {
			applied = append(applied, o)
		}
	}
	leaderElection, reviews := "fs-dynwatch-leader-election/leader-election", "fs-dynwatch-reviews/workload-low"
	if got := fmt.Sprint(schemas); got != "map[fs-dynwatch-leader-election:leader-election fs-dynwatch-reviews:workload-low]" {
		t.Fatalf("rendered FlowSchemas %s; want fs-dynwatch-leader-election in leader-election and fs-dynwatch-reviews in workload-low", got)
	}
	path := apply(t, applied)
	t.Cleanup(func() { _, _ = cluster.Kubectl(context.Background(), "delete", "--ignore-not-found", "-f", path) })
	// The apiserver takes a FlowSchema up once it is not dangling: its priority level exists.
	testbed.Eventually(t, 30*time.Second, func() error {
		for name := range schemas {
			out, err := cluster.Kubectl(t.Context(), "get", "flowschema", name, "-o", `jsonpath={.status.conditions[?(@.type=="Dangling")].status}`)
			if err != nil {
				return err
			}
			if string(out) != "False" {
				return fmt.Errorf("FlowSchema %s: Dangling=%q", name, out)
			}
		}
		return nil
	})

	sa := "system:serviceaccount:" + release + ":fs-dynwatch"
	kubeconfig, err := cluster.KubeconfigAs(sa, "system:serviceaccounts", "system:serviceaccounts:"+release, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	p, caFile := startRendered(t, objects(t, out), kubeconfig, sa)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	testbed.Eventually(t, 30*time.Second, func() error {
		lease, err := cs.CoordinationV1().Leases(release).Get(ctx, "fs-dynwatch", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("lease fs-dynwatch has no holder")
		}
		return nil
	})
	before, err := dispatched(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}

	// Queries, each needing a review of its own: a TokenReview for each token, a
	// SubjectAccessReview for each namespace.
	api, _, _ := p.WaitListening(ctx)
	const queries = 20
	for i := range queries {
		token := []string{cluster.Token("admin"), cluster.Token("carol")}[i%2]
		client, err := rest.HTTPClientFor(&rest.Config{Host: api, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Get(fmt.Sprintf("%s/api/v1/namespaces/fs-query-%d/configmaps", api, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := []int{http.StatusOK, http.StatusForbidden}[i%2]; resp.StatusCode != want {
			t.Fatalf("query %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	// The leader renews every retryPeriod (2 s): a few renewals after the queries.
	var delta map[string]float64
	testbed.Eventually(t, 30*time.Second, func() error {
		after, err := dispatched(ctx, cs)
		if err != nil {
			return err
		}
		delta = map[string]float64{}
		for k, v := range after {
			if d := v - before[k]; d > 0 {
				delta[k] = d
			}
		}
		if delta[leaderElection] < 3 || delta[reviews] < queries {
			return fmt.Errorf("requests dispatched since dynwatch led, by flow schema/priority level: %v; want at least 3 in %s and %d in %s", delta, leaderElection, queries, reviews)
		}
		return nil
	})
	t.Logf("requests dispatched since dynwatch led, by flow schema/priority level: %v", delta)
}

func TestFlowSchemasFollowTheirValues(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // FlowSchema: priority level @ precedence
	}{
		{"by default", nil, "map[dw-dynwatch-leader-election:leader-election@200 dw-dynwatch-reviews:workload-low@800]"},
		{"opted out", []string{"--set", "flowControl.enabled=false"}, "map[]"},
		{"without reviews", []string{"--set", "config.api.auth.mode=none"}, "map[dw-dynwatch-leader-election:leader-election@200]"},
		{"without leader election", []string{"--set", "replicaCount=1", "--set", "config.leaderElection.enabled=false"}, "map[dw-dynwatch-reviews:workload-low@800]"},
		{"with other levels", []string{"--set", "flowControl.leaderElection.priorityLevel=system", "--set", "flowControl.reviews.priorityLevel=global-default", "--set", "flowControl.reviews.matchingPrecedence=8000"},
			"map[dw-dynwatch-leader-election:system@200 dw-dynwatch-reviews:global-default@8000]"},
	}
	for _, tt := range tests {
		got := map[string]string{}
		for _, o := range objects(t, render(t, "dw", tt.args...)) {
			if o.GetKind() == "FlowSchema" {
				level, _, _ := unstructured.NestedString(o.Object, "spec", "priorityLevelConfiguration", "name")
				precedence, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "matchingPrecedence")
				got[o.GetName()] = fmt.Sprintf("%s@%v", level, precedence)
			}
		}
		if fmt.Sprint(got) != tt.want {
			t.Errorf("%s: FlowSchemas %v, want %s", tt.name, got, tt.want)
		}
	}
	for set, want := range map[string]string{
		"flowControl.reviews.matchingPrecedence=0":            "/flowControl/reviews/matchingPrecedence",
		"flowControl.leaderElection.priorityLevel=":           "/flowControl/leaderElection/priorityLevel",
		"flowControl.leaderElection.matchingPrecedence=10001": "/flowControl/leaderElection/matchingPrecedence",
	} {
		if _, err := helm(t, "template", "dw", chartDir, "--set", set); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("helm template --set %s = %v; want a refusal naming %s", set, err, want)
		}
	}
}
