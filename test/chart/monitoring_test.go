package chart

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dynwatch/dynwatch/test/runner"
)

// fullValues turns every optional object on, the PrometheusRule and the dashboard among them.
var fullValues = filepath.Join(chartDir, "ci", "full-values.yaml")

// ruleGroup and rule are the parts of a Prometheus rule file the tests read and write.
type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// renderedRules returns the rule groups of the PrometheusRule that helm renders with args.
func renderedRules(t *testing.T, namespace string, args ...string) []ruleGroup {
	t.Helper()
	for _, o := range objects(t, render(t, namespace, args...)) {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		b, err := json.Marshal(o.Object["spec"])
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Groups []ruleGroup `json:"groups"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		return spec.Groups
	}
	t.Fatalf("helm template %v renders no PrometheusRule", args)
	return nil
}

// writeRules writes groups as a Prometheus rule file.
func writeRules(t *testing.T, path string, groups []ruleGroup) {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), cluster.Binaries.Promtool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// exportedMetrics are the metric families dynwatch's /metrics serves, from the golden file
// test/e2e keeps of it, and up, which Prometheus itself records for every target.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(runner.Root(t), "test", "e2e", "testdata", "metrics.golden"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	// dynwatch_sink_durable has series only for a stream sink, which the golden's dynwatch does
	// not have: test/e2e/durability_test.go reads it from one that does.
	names := map[string]bool{"up": true, "dynwatch_sink_durable": true}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# TYPE "); ok {
			names[strings.Fields(rest)[0]] = true
		}
	}
	if len(names) < 40 {
		t.Fatalf("metrics.golden names %d families; is it complete?", len(names))
	}
	return names
}

var selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)

// unknownMetrics returns the metric names expr selects that dynwatch does not export. Every
// selector in the chart's rules and panels carries label matchers, so a name is what stands
// before a '{'; a histogram's or summary's series are named by their family.
func unknownMetrics(expr string, exported map[string]bool) []string {
	var unknown []string
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !exported[name] && !exported[family] {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

// alertTests is the part of promtool's unit test file that says which alerts fire when.
type alertTests struct {
	Tests []struct {
		Name  string `json:"name"`
		Cases []struct {
			Alert     string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func TestAlertRulesFireOnlyWhenTheyShould(t *testing.T) {
	groups := renderedRules(t, "dynwatch", "-f", fullValues)
	dir := t.TempDir()
	// The rules as rendered, annotation templates included, parse.
	writeRules(t, filepath.Join(dir, "rendered.yaml"), groups)
	promtool(t, "check", "rules", filepath.Join(dir, "rendered.yaml"))

	// Each alert's annotations say what it is, what to look at and where its runbook is.
	runbook, err := os.ReadFile(filepath.Join(runner.Root(t), "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	var alerts []string
	for _, g := range groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s has no %s", r.Alert, a)
				}
			}
			if want := "/docs/runbook.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("%s: runbook_url %q does not end in %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("%s: docs/runbook.md has no section \"## %s\"", r.Alert, r.Alert)
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s has no severity", r.Alert)
			}
			if unknown := unknownMetrics(r.Expr, exported); len(unknown) > 0 {
				t.Errorf("%s selects %v, which dynwatch does not export (test/e2e/testdata/metrics.golden)", r.Alert, unknown)
			}
		}
	}
	if len(alerts) < 16 {
		t.Errorf("%d alerts rendered: %v", len(alerts), alerts)
	}

	// promtool's unit tests over the rules without annotations (they compare annotations in
	// full; the checks above cover them).
	for i := range groups {
		for j := range groups[i].Rules {
			groups[i].Rules[j].Annotations = nil
		}
	}
	writeRules(t, filepath.Join(dir, "rules.yaml"), groups)
	src, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	promtool(t, "test", "rules", filepath.Join(dir, "alerts_test.yaml")) // every group, whatever --run matches

	// Every alert has a case where it fires and one where it stays silent. Each test group runs
	// again as a subtest of its own, so that one alert's cases can be run and watched alone.
	var tests alertTests
	if err := yaml.Unmarshal(src, &tests); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tt := range tests.Tests {
		t.Run(tt.Name, func(t *testing.T) {
			promtool(t, "test", "rules", "--run", "^"+regexp.QuoteMeta(tt.Name)+"$", filepath.Join(dir, "alerts_test.yaml"))
		})
		for _, c := range tt.Cases {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alert] = true
			} else {
				silent[c.Alert] = true
			}
		}
	}
	for _, a := range alerts {
		if !fires[a] || !silent[a] {
			t.Errorf("%s: testdata/alerts_test.yaml has a case where it fires: %v, where it stays silent: %v; want both", a, fires[a], silent[a])
		}
	}
}

func TestAlertsCanBeRetunedAndTurnedOff(t *testing.T) {
	groups := renderedRules(t, "ops", "--set", "prometheusRule.enabled=true",
		"--set", "prometheusRule.alerts.DynwatchDown.enabled=false",
		"--set", "prometheusRule.alerts.DynwatchOutboxGrowing.minLength=5000",
		"--set", "prometheusRule.alerts.DynwatchOutboxGrowing.for=1h",
		"--set", `prometheusRule.selector=job="dynwatch"`,
		"--set", "prometheusRule.additionalLabels.team=platform")
	var outbox *rule
	for _, g := range groups {
		for i, r := range g.Rules {
			if r.Alert == "DynwatchDown" {
				t.Error("DynwatchDown is rendered although turned off")
			}
			if r.Alert == "DynwatchOutboxGrowing" {
				outbox = &g.Rules[i]
			}
			if r.Labels["team"] != "platform" {
				t.Errorf("%s: labels %v lack team=platform", r.Alert, r.Labels)
			}
			if strings.Contains(r.Expr, `namespace="`) || strings.Count(r.Expr, `job="dynwatch"`) != strings.Count(r.Expr, "{") {
				t.Errorf("%s does not select with the configured selector alone: %s", r.Alert, r.Expr)
			}
		}
	}
	if outbox == nil {
		t.Fatal("DynwatchOutboxGrowing is not rendered")
	}
	if !strings.Contains(outbox.Expr, "> 5000") || outbox.For != "1h" {
		t.Errorf("DynwatchOutboxGrowing: expr %q for %q; want minLength 5000 for 1h", outbox.Expr, outbox.For)
	}
	// Rules that select the ServiceMonitor's job without a ServiceMonitor are refused.
	_, err := helm(t, "template", "dw", chartDir, "--set", "prometheusRule.enabled=true")
	if err == nil || !strings.Contains(err.Error(), "prometheusRule.enabled needs serviceMonitor.enabled, or a prometheusRule.selector") {
		t.Errorf("helm template with rules and no ServiceMonitor = %v; want a refusal", err)
	}
	// A duration that is none is refused by the schema, naming the value.
	_, err = helm(t, "template", "dw", chartDir, "--set", "prometheusRule.alerts.DynwatchDown.for=soon")
	if err == nil || !strings.Contains(err.Error(), "DynwatchDown") {
		t.Errorf("helm template with for=soon = %v; want a refusal naming DynwatchDown", err)
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVariables are the dashboard's variables with what stands in for them when its
// queries are checked by promtool.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".+", "$pod", ".+")

func TestTheDashboardRendersAndQueriesWhatDynwatchExports(t *testing.T) {
	var configMap map[string]any
	for _, o := range objects(t, render(t, "dynwatch", "-f", fullValues)) {
		if o.GetKind() == "ConfigMap" && o.GetLabels()["grafana_dashboard"] == "1" {
			if o.GetNamespace() != "monitoring" {
				t.Errorf("the dashboard's ConfigMap is in %q; ci/full-values.yaml puts it in monitoring", o.GetNamespace())
			}
			configMap = o.Object
		}
	}
	if configMap == nil {
		t.Fatal("ci/full-values.yaml renders no ConfigMap labelled grafana_dashboard")
	}
	data, _ := configMap["data"].(map[string]any)
	src, _ := data["dynwatch.json"].(string)
	var d dashboard
	if err := json.Unmarshal([]byte(src), &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if d.UID != "dynwatch" {
		t.Errorf("uid %q, want dynwatch", d.UID)
	}
	exported := exportedMetrics(t)
	ids := map[int]bool{}
	var panels int
	var queries []rule
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for i, q := range p.Targets {
			if unknown := unknownMetrics(q.Expr, exported); len(unknown) > 0 {
				t.Errorf("panel %q selects %v, which dynwatch does not export", p.Title, unknown)
			}
			if !strings.Contains(q.Expr, `pod=~"$pod"`) {
				t.Errorf("panel %q: %s does not follow the pod variable", p.Title, q.Expr)
			}
			queries = append(queries, rule{Record: fmt.Sprintf("dashboard:panel_%d:query_%d", p.ID, i), Expr: grafanaVariables.Replace(q.Expr)})
		}
	}
	if panels < 12 {
		t.Errorf("%d panels, want at least 12", panels)
	}
	// Every query parses as PromQL: promtool checks them as recording rules.
	path := filepath.Join(t.TempDir(), "queries.yaml")
	writeRules(t, path, []ruleGroup{{Name: "dashboard", Rules: queries}})
	promtool(t, "check", "rules", path)
	file, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "dynwatch.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(file)) != src {
		t.Error("the ConfigMap does not carry dashboards/dynwatch.json as it is")
	}
}
