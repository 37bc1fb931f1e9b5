package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/runner"
)

// The -subscriptions run measures what teams' Subscriptions cost the configured sinks: two
// dynwatch processes side by side on one bed through one storm, each watching configmaps in
// every namespace with three configured webhooks, one serving subscriptionTeams namespaces'
// subscriptionsPerTeam Subscriptions each, the other with subscriptions off. Each team
// namespace's Subscriptions are written by its own user, who may watch configmaps in that
// namespace only, and subscribe to configmaps of every namespace. While the storm updates the
// bench namespace's objects at o.rate, a writer updates each team namespace's configmaps once a
// second. After it: the configured webhooks' update→receipt with subscriptions against
// without, CPU and memory; the SubjectAccessReviews a second against the reviews client's rate;
// and whether every subscription received exactly its own namespace's updates.
const (
	subscriptionTeams    = 20
	subscriptionsPerTeam = 10
	// teamObjects are the configmaps of each team namespace.
	teamObjects = 5
	// subscriptionsObjects and subscriptionsUpdates are -objects and -updates unless given: a
	// storm of 75 s at 300/s, longer than the review period (1m), so that the reviews asked
	// again fall within it.
	subscriptionsObjects = 10000
	subscriptionsUpdates = 22500
	subscriptionsRate    = 300
	// reviewsQPS is the reviews client's rate: client.rateLimits.accessReviews.qps's default.
	reviewsQPS = 20
)

var subscriptionsGVR = schema.GroupVersionResource{Group: "events.dynwatch.io", Version: "v1alpha1", Resource: "subscriptions"}

// runSubscriptions is the -subscriptions run on the bed b.
func runSubscriptions(ctx context.Context, o options, b *bed, start time.Time) error {
	if err := installSubscriptions(ctx, b); err != nil {
		return err
	}
	teams, err := makeTeams(ctx, b)
	if err != nil {
		return err
	}
	subs := newSubReceiver()
	defer subs.close()
	subsURL := subs.serve()
	if err := subscribe(ctx, b, teams, subsURL); err != nil {
		return err
	}
	runs := map[bool]*subscriptionsRun{}
	for _, on := range []bool{false, true} {
		r, err := startSubscriptionsRun(ctx, o, b, on)
		if err != nil {
			return err
		}
		defer r.stop()
		runs[on] = r
	}
	off, on := runs[false], runs[true]
	if err := waitReady(ctx, b, teams); err != nil {
		return fmt.Errorf("%w\n%s", err, on.dw.rp.Log())
	}
	logf("subscriptions: %d Ready in %d namespaces", len(teams)*subscriptionsPerTeam, len(teams))

	// What the initial list needed asked (each subject in each namespace, one review at a
	// time at the client's rate): the storm measures the steady state. The reviews are counted
	// from the apiserver's audit log, which records every SubjectAccessReview (scraping
	// dynwatch's /metrics every second would cost it more than its deliveries: 200 sinks' series).
	if err := waitSteady(ctx, 5*time.Minute, func() float64 { return float64(len(auditedReviews(b, time.Time{}, time.Time{}))) }); err != nil {
		return fmt.Errorf("subscriptions: the reviews the initial list needed: %w", err)
	}
	cpuOff0, cpuOn0 := cpuSeconds(off.dw.pid), cpuSeconds(on.dw.pid)
	failed0 := sumMetric(ctx, on.dw.metrics, `dynwatch_subscription_access_reviews_total{result="error"}`)
	stormStart := time.Now()
	profiled := startProfile(ctx, on.dw.metrics, max(1, o.updates/o.rate), o.profile)
	teamCtx, stopTeams := context.WithCancel(ctx)
	teamWrites := make(chan []teamWrite, 1)
	go func() { teamWrites <- writeTeams(teamCtx, b.cs, teams) }()
	written, err := storm(ctx, b.cs, o)
	stopTeams()
	tw := <-teamWrites
	if err != nil {
		return err
	}
	if err := <-profiled; err != nil {
		return err
	}
	byTeam := map[string]map[string]bool{}
	for _, t := range teams {
		byTeam[t.namespace] = map[string]bool{}
		for _, rv := range t.created {
			byTeam[t.namespace][rv] = true
		}
	}
	for _, w := range tw {
		byTeam[w.namespace][w.rv] = true
	}
	err = waitFor(ctx, 2*time.Minute, func() bool {
		return off.covers(written) && on.covers(written) && subs.covers(teams, byTeam)
	})
	if err != nil {
		return fmt.Errorf("storm events not all received (without subscriptions %v, with %v, subscriptions %v): %w", off.covers(written), on.covers(written), subs.covers(teams, byTeam), err)
	}
	n := float64(len(written) + len(tw))
	cpuOff, cpuOn := (cpuSeconds(off.dw.pid)-cpuOff0)/n*1e6, (cpuSeconds(on.dw.pid)-cpuOn0)/n*1e6
	perSecond := perSecondOf(auditedReviews(b, stormStart, time.Now()), stormStart)
	failed := sumMetric(ctx, on.dw.metrics, `dynwatch_subscription_access_reviews_total{result="error"}`) - failed0
	// Anything foreign would have arrived with the rest: a second more lets a straggler show.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	exact, wrong := subs.exact(teams, byTeam)
	for _, w := range wrong[:min(len(wrong), 5)] {
		logf("subscriptions: %s", w)
	}
	mOff, mOn := residentMemory(off.dw.pid), residentMemory(on.dw.pid)
	latOff, latOn := off.latencies(written), on.latencies(written)
	subLat := subs.latencies(tw)
	busiest, total := 0.0, 0.0
	for _, v := range perSecond {
		busiest, total = max(busiest, v), total+v
	}
	average := total / float64(max(1, len(perSecond)))
	logf("SubjectAccessReviews each second from the storm's start: %v", perSecond)

	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	always := func(float64) bool { return true }
	count := float64(len(teams) * subscriptionsPerTeam)
	rows := []result{
		row("configured webhooks' update → receipt p99, with subscriptions against without", "ms", pct(latOn, 99), pct(latOff, 99), "without", "≤ 1.5x", func(r float64) bool { return r <= 1.5 }),
		row("configured webhooks' update → receipt p50, with subscriptions against without", "ms", pct(latOn, 50), pct(latOff, 50), "without", "", always),
		row("CPU per update (the storm's and the teams'), with subscriptions against without", "µs", cpuOn, cpuOff, "without", "", always),
		row("resident memory after the storm, with subscriptions against without", "MB", mb(mOn.now), mb(mOff.now), "without", "", always),
		row("resident memory after the storm: anonymous (RssAnon)", "MB", mb(mOn.anon), mb(mOff.anon), "without", "", always),
		row("SubjectAccessReviews in the storm's busiest second, against the reviews client's rate", "/s", busiest, reviewsQPS, "qps", "< 1x", func(r float64) bool { return r < 1 }),
		row("SubjectAccessReviews a second through the storm, against the reviews client's rate", "/s", average, reviewsQPS, "qps", "< 1x", func(r float64) bool { return r < 1 }),
		row("SubjectAccessReviews that failed through the storm", "", failed, 0, "", "", always),
		row("subscriptions that received exactly their namespace's configmaps and updates", "", float64(exact), count, "all", "all", func(r float64) bool { return r == 1 }),
		row("subscriptions' update → receipt p99, against the configured webhooks'", "ms", pct(subLat, 99), pct(latOn, 99), "configured", "", always),
	}
	title := fmt.Sprintf("subscriptions: %d in %d namespaces, %d %s, %d updates at %d/s and %d to the teams' configmaps; %s; %s",
		int(count), len(teams), o.objects, o.resource, len(written), o.rate, len(tw), machine(), time.Since(start).Round(time.Second))
	printTable(title, [2]string{"subscriptions", "against"}, rows)
	return saveResults(o, b.objBytes, rows, map[string]any{"subscriptions": int(count), "updates": len(written), "teamUpdates": len(tw), "rate": o.rate, "reviewsPerSecond": perSecond})
}

// installSubscriptions applies the chart's Subscription CRD and admission policies and waits
// until the mutating policy records a writer's subject.
func installSubscriptions(ctx context.Context, b *bed) error {
	root, err := runner.ModuleRoot()
	if err != nil {
		return err
	}
	for _, f := range []string{"crd.yaml", "admission.yaml"} {
		if out, err := b.cluster.Kubectl(ctx, "apply", "-f", filepath.Join(root, "charts", "dynwatch", "files", "subscriptions", f)); err != nil {
			return fmt.Errorf("kubectl apply %s: %w\n%s", f, err, out)
		}
	}
	admin := dynamic.NewForConfigOrDie(b.cluster.Config).Resource(subscriptionsGVR).Namespace(namespace)
	probe := newSubscription("probe", "http://127.0.0.1:9/")
	probe.Object["spec"].(map[string]any)["subject"] = map[string]any{"username": "nobody"}
	var last error
	err = waitEvery(ctx, time.Minute, 200*time.Millisecond, func() bool {
		created, err := admin.Create(ctx, probe, metav1.CreateOptions{})
		if err != nil {
			last = err
			return false
		}
		_ = admin.Delete(ctx, "probe", metav1.DeleteOptions{})
		got, _, _ := unstructured.NestedString(created.Object, "spec", "subject", "username")
		last = fmt.Errorf("the probe's subject is %q: the mutating policy is not in effect yet", got)
		return got != "nobody"
	})
	if err != nil {
		return fmt.Errorf("%w: %w", err, last)
	}
	return nil
}

func newSubscription(name, url string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "events.dynwatch.io/v1alpha1", "kind": "Subscription",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"url": url, "resources": []any{"configmaps"}},
	}}
}

// tenant is a namespace and the user who writes its Subscriptions and may watch its configmaps,
// and nothing else.
type tenant struct {
	namespace, user string
	// created are its configmaps' resourceVersions as created: dynwatch starts after them,
	// and its initial list delivers each as ADDED to every subscription of the namespace.
	created []string
}

// makeTeams makes the team namespaces, their users' grants and configmaps, and waits until RBAC
// lets the last user watch.
func makeTeams(ctx context.Context, b *bed) ([]tenant, error) {
	var teams []tenant
	for i := range subscriptionTeams {
		t := tenant{namespace: fmt.Sprintf("team-%02d", i), user: fmt.Sprintf("team-%02d-writer", i)}
		teams = append(teams, t)
		if _, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.namespace}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{subscriptionsGVR.Group}, Resources: []string{"subscriptions"}, Verbs: []string{"get", "list", "watch", "create"}},
		}}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "team"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: t.user}},
		}
		if _, err := b.cs.RbacV1().Roles(t.namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if _, err := b.cs.RbacV1().RoleBindings(t.namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		for j := range teamObjects {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", j)}, Data: map[string]string{"team": t.namespace}}
			created, err := b.cs.CoreV1().ConfigMaps(t.namespace).Create(ctx, cm, metav1.CreateOptions{})
			if err != nil {
				return nil, err
			}
			teams[i].created = append(teams[i].created, created.ResourceVersion)
		}
	}
	last := teams[len(teams)-1]
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: last.user, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: last.namespace, Verb: "create", Group: subscriptionsGVR.Group, Resource: "subscriptions"},
	}}
	err := waitFor(ctx, 30*time.Second, func() bool {
		got, err := b.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed
	})
	return teams, err
}

// subscribe creates each team's Subscriptions, as its user, to configmaps of every namespace,
// each to its own path of url.
func subscribe(ctx context.Context, b *bed, teams []tenant, url string) error {
	for _, t := range teams {
		c := rest.CopyConfig(b.cluster.Config)
		c.QPS, c.Burst = -1, 0
		c.Impersonate = rest.ImpersonationConfig{UserName: t.user}
		client := dynamic.NewForConfigOrDie(c).Resource(subscriptionsGVR).Namespace(t.namespace)
		for i := range subscriptionsPerTeam {
			name := fmt.Sprintf("s-%d", i)
			if _, err := client.Create(ctx, newSubscription(name, url+"/"+t.namespace+"/"+name), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create subscription %s/%s as %s: %w", t.namespace, name, t.user, err)
			}
		}
	}
	return nil
}

// waitReady waits until every team's Subscriptions are Ready.
func waitReady(ctx context.Context, b *bed, teams []tenant) error {
	admin := dynamic.NewForConfigOrDie(b.cluster.Config).Resource(subscriptionsGVR)
	var notReady []string
	err := waitEvery(ctx, 2*time.Minute, 500*time.Millisecond, func() bool {
		notReady = notReady[:0]
		for _, t := range teams {
			l, err := admin.Namespace(t.namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				notReady = append(notReady, err.Error())
				continue
			}
			for _, s := range l.Items {
				if !ready(s) {
					notReady = append(notReady, t.namespace+"/"+s.GetName())
				}
			}
		}
		return len(notReady) == 0
	})
	if err != nil {
		return fmt.Errorf("subscriptions not Ready: %v: %w", notReady[:min(len(notReady), 10)], err)
	}
	return nil
}

func ready(s unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(s.Object, "status", "conditions")
	for _, c := range conds {
		if c, ok := c.(map[string]any); ok && c["type"] == "Ready" {
			return c["status"] == "True"
		}
	}
	return false
}

// teamWrite is one update of a team namespace's configmap.
type teamWrite struct {
	namespace string
	write
}

// writeTeams updates one configmap of each team namespace every second until ctx ends, one
// namespace after the other, and returns every update.
func writeTeams(ctx context.Context, cs kubernetes.Interface, teams []tenant) []teamWrite {
	var out []teamWrite
	tick := time.NewTicker(time.Second / time.Duration(len(teams)))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		t := teams[i%len(teams)]
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"example.com/touched":"%d"}}}`, i)
		t0 := time.Now()
		cm, err := cs.CoreV1().ConfigMaps(t.namespace).Patch(ctx, fmt.Sprintf("cm-%d", (i/len(teams))%teamObjects), "application/merge-patch+json", patch, metav1.PatchOptions{})
		if err != nil {
			if ctx.Err() == nil {
				logf("team write: %v", err)
			}
			continue
		}
		out = append(out, teamWrite{namespace: t.namespace, write: write{rv: cm.ResourceVersion, started: t0}})
	}
}

// auditedReviews are the times of the SubjectAccessReviews the apiserver answered about the
// teams' users (dynwatch's for their subscriptions), from from to to (zero: unbounded).
func auditedReviews(b *bed, from, to time.Time) []time.Time {
	f, err := os.Open(b.cluster.AuditLog())
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	var out []time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct {
			Stage          string    `json:"stage"`
			StageTimestamp time.Time `json:"stageTimestamp"`
			RequestObject  struct {
				Spec struct{ User string } `json:"spec"`
			} `json:"requestObject"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || !strings.HasPrefix(e.RequestObject.Spec.User, "team-") {
			continue
		}
		if (from.IsZero() || !e.StageTimestamp.Before(from)) && (to.IsZero() || e.StageTimestamp.Before(to)) {
			out = append(out, e.StageTimestamp)
		}
	}
	return out
}

// perSecondOf counts times in each second from start.
func perSecondOf(times []time.Time, start time.Time) []float64 {
	var out []float64
	for _, t := range times {
		i := int(t.Sub(start) / time.Second)
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i]++
	}
	return out
}

// subscriptionsRun is one of the two processes, with its configured webhooks' receivers.
type subscriptionsRun struct {
	dw        *dwProc
	receivers []*receiver
}

func (r *subscriptionsRun) stop() {
	r.dw.stop()
	for _, rc := range r.receivers {
		rc.close()
	}
}

func (r *subscriptionsRun) covers(ws []write) bool {
	for _, rc := range r.receivers {
		if !rc.covers(ws) {
			return false
		}
	}
	return true
}

// latencies are every configured webhook's, sorted.
func (r *subscriptionsRun) latencies(ws []write) []time.Duration {
	var out []time.Duration
	for _, rc := range r.receivers {
		out = append(out, latencies(ws, rc.arrivals())...)
	}
	slices.Sort(out)
	return out
}

// startSubscriptionsRun starts dynwatch watching configmaps in every namespace with three
// webhooks, serving Subscriptions (which may reach loopback) if on, a state store of its own,
// and waits until its webhooks have received the initial list.
func startSubscriptionsRun(ctx context.Context, o options, b *bed, on bool) (*subscriptionsRun, error) {
	name := map[bool]string{false: "off", true: "on"}[on]
	r := &subscriptionsRun{}
	var webhooks []string
	for i := range 3 {
		rc := newReceiver()
		r.receivers = append(r.receivers, rc)
		webhooks = append(webhooks, fmt.Sprintf("{name: bench-%d, url: %s, workers: 4}", i, rc.serve()))
	}
	subscriptions := ""
	if on {
		subscriptions = "subscriptions: {enabled: true, egress: {allow: [127.0.0.1/32]}}\n"
	}
	text := fmt.Sprintf(`resources:
  - version: v1
    resource: %s
webhooks: [%s]
api: {address: "127.0.0.1:0", auth: {mode: kubernetes}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0", pprof: true}
state: {path: %s}
%s`, o.resource, strings.Join(webhooks, ", "), filepath.Join(b.cluster.Dir, "state-subscriptions-"+name, "state.db"), subscriptions)
	path := filepath.Join(b.cluster.Dir, "bench-dynwatch-subscriptions-"+name+".yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return nil, err
	}
	dw, err := launch(ctx, runner.Options{Binary: b.dwBin, Config: path, Kubeconfig: b.cluster.Kubeconfig, Env: o.env, Log: io.Discard})
	if err != nil {
		r.stop()
		return nil, err
	}
	r.dw = dw
	initial := o.objects + subscriptionTeams*teamObjects
	err = waitFor(ctx, syncWait, func() bool {
		for _, rc := range r.receivers {
			if rc.count() < initial {
				return false
			}
		}
		return true
	})
	if err != nil {
		r.stop()
		return nil, fmt.Errorf("subscriptions %s: initial-list deliveries: %w\n%s", name, err, dw.rp.Log())
	}
	logf("subscriptions %s: synced in %s, initial list delivered", name, dw.synced.Round(time.Millisecond))
	return r, nil
}

// subReceiver receives every subscription's deliveries, each at its own path
// (/namespace/name), and notes when each resourceVersion reached each.
type subReceiver struct {
	srv  *http.Server
	mu   sync.Mutex
	seen map[string]map[string]int64 // path → resourceVersion → arrival
}

func newSubReceiver() *subReceiver { return &subReceiver{seen: map[string]map[string]int64{}} }

func (r *subReceiver) serve() string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		now := time.Now().UnixNano()
		rv := ""
		if parts := strings.Split(req.Header.Get("ce-id"), "."); len(parts) == 3 {
			rv = parts[1]
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.seen[req.URL.Path] == nil {
			r.seen[req.URL.Path] = map[string]int64{}
		}
		r.seen[req.URL.Path][rv] = now
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return "http://" + ln.Addr().String()
}

func (r *subReceiver) close() {
	if r.srv != nil {
		_ = r.srv.Close()
	}
}

// paths are every team's subscriptions' paths, with their namespaces.
func paths(teams []tenant) map[string]string {
	out := map[string]string{}
	for _, t := range teams {
		for i := range subscriptionsPerTeam {
			out[fmt.Sprintf("/%s/s-%d", t.namespace, i)] = t.namespace
		}
	}
	return out
}

// covers reports whether every subscription has received every update of its namespace.
func (r *subReceiver) covers(teams []tenant, byTeam map[string]map[string]bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for path, ns := range paths(teams) {
		for rv := range byTeam[ns] {
			if _, ok := r.seen[path][rv]; !ok {
				return false
			}
		}
	}
	return true
}

// exact counts the subscriptions that received their namespace's updates and nothing else,
// and describes what each other one received wrongly.
func (r *subReceiver) exact(teams []tenant, byTeam map[string]map[string]bool) (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, wrong := 0, []string(nil)
	for path, ns := range paths(teams) {
		missing, foreign := 0, 0
		for rv := range byTeam[ns] {
			if _, ok := r.seen[path][rv]; !ok {
				missing++
			}
		}
		for rv := range r.seen[path] {
			if !byTeam[ns][rv] {
				foreign++
			}
		}
		if missing == 0 && foreign == 0 {
			n++
		} else {
			wrong = append(wrong, fmt.Sprintf("%s: %d of its namespace's updates missing, %d others received", path, missing, foreign))
		}
	}
	for path := range r.seen {
		if _, ok := paths(teams)[path]; !ok {
			wrong = append(wrong, "deliveries to "+path+", no subscription's")
		}
	}
	slices.Sort(wrong)
	return n, wrong
}

// latencies are every subscription's, from each team update to its arrival, sorted.
func (r *subReceiver) latencies(ws []teamWrite) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for path, rvs := range r.seen {
		ns := strings.Split(path, "/")[1]
		for _, w := range ws {
			if at, ok := rvs[w.rv]; ok && w.namespace == ns {
				out = append(out, time.Duration(at-w.started.UnixNano()))
			}
		}
	}
	slices.Sort(out)
	return out
}
