package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// chartRules renders the chart's PrometheusRule with the extra --set values and returns its
// spec as a Prometheus rule file.
func chartRules(t *testing.T, set ...string) []byte {
	t.Helper()
	args := []string{"template", "dw", filepath.Join(runner.Root(t), "charts", "dynwatch"), "-s", "templates/prometheusrule.yaml", "--set", "prometheusRule.enabled=true"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(t.Context(), cluster.Binaries.Helm, args...)
	cmd.Env = append(cmd.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v", args, err)
	}
	var rule struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil {
		t.Fatal(err)
	}
	file, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// TestAlertsFireInARealPrometheus scrapes a real dynwatch with a real Prometheus, both on
// 127.0.0.1, evaluating the chart's rules (with short durations): one sink cannot be
// reached, so its outbox grows; another refuses every event, so it dead-letters them.
// DynwatchOutboxGrowing and DynwatchDeadLetters go pending, then firing, as Prometheus' own API
// says; DynwatchDown never fires while dynwatch answers.
func TestAlertsFireInARealPrometheus(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	refusing := newReceiver(t, func(int) int { return http.StatusBadRequest }, false)
	unreachable, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, cluster.Kubeconfig, plainConfig(ns, fmt.Sprintf(`
webhooks:
  - {name: unreachable, url: "http://127.0.0.1:%d/events", retry: {initialBackoff: 100ms, maxBackoff: 1s, maxElapsed: 1h}}
  - {name: refusing, url: "%s/events"}
state: {path: %s}
`, unreachable, refusing.URL, filepath.Join(t.TempDir(), "state.db"))))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := p.WaitListening(t.Context())

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), string(chartRules(t,
		`prometheusRule.selector=job="dynwatch-e2e"`,
		"prometheusRule.alerts.DynwatchOutboxGrowing.for=5s",
		"prometheusRule.alerts.DynwatchOutboxGrowing.window=30s",
		"prometheusRule.alerts.DynwatchOutboxGrowing.minLength=5",
		"prometheusRule.alerts.DynwatchDeadLetters.for=5s",
		"prometheusRule.alerts.DynwatchDeadLetters.window=1m",
		"prometheusRule.alerts.DynwatchDown.for=30s")))
	prom, err := testbed.StartPrometheus(t.Context(), cluster.Binaries, dir, fmt.Sprintf(`
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: dynwatch-e2e
    static_configs: [{targets: [%q], labels: {namespace: %q, pod: dynwatch-0}}]
`, strings.TrimPrefix(metrics, "http://"), ns))
	if err != nil {
		t.Fatal(err)
	}
	defer prom.Stop()

	// Changes keep coming until the alerts fire: one configmap every 200 ms.
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	go func() {
		cs := kubernetes.NewForConfigOrDie(cluster.Config)
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}}, metav1.CreateOptions{})
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()

	want := map[string]map[string]string{
		"DynwatchOutboxGrowing": {"sink": "unreachable", "pod": "dynwatch-0", "namespace": ns, "severity": "warning"},
		"DynwatchDeadLetters":   {"sink": "refusing", "reason": "rejected", "pod": "dynwatch-0", "namespace": ns, "severity": "warning"},
	}
	seen := map[string][]string{} // alert → the states it was seen in, in order
	testbed.Eventually(t, 3*time.Minute, func() error {
		alerts, err := prom.Alerts(t.Context())
		if err != nil {
			return err
		}
		firing := 0
		for _, a := range alerts {
			name := a.Labels["alertname"]
			if name == "DynwatchDown" && a.State == "firing" { // pending until the first scrape: up is absent
				t.Fatalf("DynwatchDown fires while dynwatch answers: %v", a.Labels)
			}
			labels, ok := want[name]
			if !ok {
				continue
			}
			for k, v := range labels {
				if a.Labels[k] != v {
					t.Fatalf("%s has labels %v; want %s=%q", name, a.Labels, k, v)
				}
			}
			if states := seen[name]; len(states) == 0 || states[len(states)-1] != a.State {
				seen[name] = append(states, a.State)
			}
			if a.State == "firing" {
				firing++
			}
		}
		if firing < len(want) {
			return fmt.Errorf("alerts seen: %v; want %d firing", seen, len(want))
		}
		return nil
	})
	for name, states := range seen {
		t.Logf("%s: %v", name, states)
		if !slices.Equal(states, []string{"pending", "firing"}) && !slices.Equal(states, []string{"firing"}) {
			t.Errorf("%s went through %v; want pending, then firing", name, states)
		}
	}
}
