package dynamicinformer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// Options are a Manager's dependencies.
type Options struct {
	Logger *slog.Logger
	// JSON lists and watches whole objects, which the caches keep as JSON (NewJSONClient).
	JSON rest.Interface
	// Dynamic serves the namespaces a namespaceSelector selects and the objects of resources
	// that have one.
	Dynamic dynamic.Interface
	// Metadata serves the resources whose cache keeps metadata only.
	Metadata    metadata.Interface
	Discovery   discovery.DiscoveryInterface
	Registerer  prometheus.Registerer
	Resources   []config.Resource
	Interval    time.Duration // how often discovery runs while a resource is not running, or always with a whole group
	Subscribers []Subscriber
	// Gate, when set, holds the informers back while what they handed the subscribers waits
	// (see Gate).
	Gate Gate
	// ConsistencyCheck is how often each informer's cache is compared with the apiserver;
	// zero for never (see config.ConsistencyCheck).
	ConsistencyCheck time.Duration
	Now              func() time.Time // the clock; time.Now when nil
}

// Manager runs the informers of every configured resource.
type Manager struct {
	log         *slog.Logger
	json        rest.Interface
	dynamic     dynamic.Interface
	metadata    metadata.Interface
	discovery   discovery.DiscoveryInterface
	interval    time.Duration
	subscribers []Subscriber
	gate        Gate
	checkEvery  time.Duration // 0: no consistency check
	checkPage   int64         // objects a page of a consistency check's list holds; 0 for one list
	now         func() time.Time
	met         *metrics

	discovered atomic.Bool // discovery has succeeded at least once
	version    atomic.Pointer[version.Info]
	nudge      chan struct{}
	runs       atomic.Uint64 // informer starts, numbering ListObserver calls

	reconciling sync.Mutex // held by reconcile and Update: one changes informers at a time
	mu          sync.RWMutex
	resources   []*Resource // the configured entries, in configuration order
	watched     []*Resource // what runs informers: configured resources and whole groups' members
	byGVR       map[schema.GroupVersionResource]*Resource
}

// New builds a Manager and registers its metrics. Nothing runs until Run.
func New(o Options) (*Manager, error) {
	if o.JSON == nil || o.Dynamic == nil || o.Metadata == nil || o.Discovery == nil {
		return nil, errors.New("the JSON, dynamic, metadata and discovery clients are all required")
	}
	m := &Manager{
		log:         o.Logger,
		json:        o.JSON,
		dynamic:     o.Dynamic,
		metadata:    o.Metadata,
		discovery:   o.Discovery,
		interval:    o.Interval,
		subscribers: o.Subscribers,
		gate:        o.Gate,
		checkEvery:  o.ConsistencyCheck,
		checkPage:   checkPageSize,
		now:         o.Now,
		nudge:       make(chan struct{}, 1),
		byGVR:       map[schema.GroupVersionResource]*Resource{},
	}
	if m.now == nil {
		m.now = time.Now
	}
	m.met = newMetrics(m)
	if err := o.Registerer.Register(m.met); err != nil {
		return nil, fmt.Errorf("register informer metrics: %w", err)
	}
	for i := range o.Resources {
		m.resources = append(m.resources, m.newResource(&o.Resources[i]))
	}
	m.watched = watchedOf(m.resources)
	return m, nil
}

func (m *Manager) newResource(cfg *config.Resource) *Resource {
	r := &Resource{cfg: cfg, name: cfg.String(), m: m, state: StatePending, events: map[object.EventType]counter{}, relistEvents: map[object.EventType]counter{}}
	if cfg.IsWildcard() {
		return r // a whole group: its members have the informers and the metrics
	}
	for _, t := range object.EventTypes {
		r.events[t] = m.met.events.WithLabelValues(r.name, string(t))
		r.relistEvents[t] = m.met.relistEvents.WithLabelValues(r.name, string(t))
	}
	r.watchErrs = m.met.watchErrors.WithLabelValues(r.name)
	r.checks = map[string]counter{}
	for _, result := range checkResults {
		r.checks[result] = m.met.checks.WithLabelValues(r.name, result)
	}
	r.transitions.applied = m.met.transitions.WithLabelValues(r.name, "applied")
	r.transitions.deferred = m.met.transitions.WithLabelValues(r.name, "deferred")
	return r
}

func (m *Manager) logger() *slog.Logger               { return m.log }
func (m *Manager) clock() time.Time                   { return m.now() }
func (m *Manager) subscribed() []Subscriber           { return m.subscribers }
func (m *Manager) nextRun() uint64                    { return m.runs.Add(1) }
func (m *Manager) jsonClient() rest.Interface         { return m.json }
func (m *Manager) metadataClient() metadata.Interface { return m.metadata }
func (m *Manager) checkPeriod() time.Duration         { return m.checkEvery }
func (m *Manager) checkPageSize() int64               { return m.checkPage }

// Resources returns every watched resource, in configuration order: the configured ones, and
// in place of a whole group (resource: "*") the members discovery found, in name order.
func (m *Manager) Resources() []*Resource {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.watched
}

// entries returns the configured entries, whole groups as one each, in configuration order.
func (m *Manager) entries() []*Resource {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.resources
}

// Update applies a new resource configuration while running. A resource configured as before
// keeps its informers and cache and emits nothing. A changed one is stopped and started again
// with its new configuration; a removed one is stopped; a new one starts. Resources are
// matched by name (resource.version.group, *.version.group for a whole group). A changed whole
// group keeps its members until the next discovery, which restarts them with the new
// configuration or drops those it no longer selects.
func (m *Manager) Update(resources []config.Resource) {
	m.reconciling.Lock()
	defer m.reconciling.Unlock()
	m.mu.Lock()
	old := map[string]*Resource{}
	for _, r := range m.resources {
		old[r.name] = r
	}
	next := make([]*Resource, 0, len(resources))
	var stopped []*Resource
	for i := range resources {
		cfg := &resources[i]
		r, ok := old[cfg.String()]
		delete(old, cfg.String())
		if ok && r.cfg.Source == cfg.Source {
			next = append(next, r)
			continue
		}
		n := m.newResource(cfg)
		switch {
		case ok && cfg.IsWildcard(): // the same name: both whole groups
			n.members = r.members // the next discovery restarts or drops them
		case ok:
			stopped = append(stopped, r)
		}
		next = append(next, n)
	}
	var removed []string
	for _, r := range old {
		for _, x := range r.informed() {
			stopped = append(stopped, x)
			removed = append(removed, x.name)
		}
	}
	m.resources, m.watched = next, watchedOf(next)
	for gvr, r := range m.byGVR {
		if !slices.Contains(m.watched, r) {
			delete(m.byGVR, gvr)
		}
	}
	m.mu.Unlock()
	for _, r := range stopped {
		r.stopInformers()
	}
	m.forget(removed...)
	m.Nudge()
}

// Lookup returns the running resource that serves gvr.
func (m *Manager) Lookup(gvr schema.GroupVersionResource) (*Resource, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.byGVR[gvr]
	return r, ok
}

// ServerVersion returns the apiserver's version, or nil before discovery has succeeded.
func (m *Manager) ServerVersion() *version.Info { return m.version.Load() }

// Nudge asks the Manager to run discovery now rather than at the next interval.
func (m *Manager) Nudge() {
	select {
	case m.nudge <- struct{}{}:
	default:
	}
}

// Run resolves the configured resources through discovery and runs their informers until ctx
// ends; then it stops every informer and returns nil. While any resource is not running
// (not served yet, discovery failing), and always when a whole group is configured (its
// resources may come and go), discovery runs again every interval, and at once when a watch
// reports its resource gone.
func (m *Manager) Run(ctx context.Context) error {
	defer func() {
		for _, r := range m.Resources() {
			r.stopInformers()
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-m.nudge:
			timer.Stop()
		}
		m.reconcile(ctx)
		if !m.allRunning() {
			timer.Reset(m.interval)
		}
	}
}

// allRunning reports whether every configured entry runs its informers; a whole group never
// does itself, so that discovery keeps looking for its members.
func (m *Manager) allRunning() bool {
	for _, r := range m.entries() {
		if !r.running() {
			return false
		}
	}
	return true
}

// Ready reports whether every resource the apiserver serves has synced, and if not, which
// resources are holding readiness back and why. A Stale member of a whole group does not: its
// group's other resources are served without it.
func (m *Manager) Ready() (bool, []string) {
	if !m.discovered.Load() {
		return false, []string{"discovery has not succeeded yet"}
	}
	var laggards []string
	for _, r := range m.Resources() {
		if st := r.State(); st == StatePending || st == StateSyncing || (st == StateStale && r.parent == nil) {
			laggards = append(laggards, fmt.Sprintf("%s: %s", r.name, st))
		}
	}
	return len(laggards) == 0, laggards
}

// Status reports every configured resource, in configuration order; a whole group as itself,
// followed by its members.
func (m *Manager) Status() []Status {
	m.mu.RLock()
	entries, watched := m.resources, m.watched
	m.mu.RUnlock()
	out := make([]Status, 0, len(entries)+len(watched))
	for _, r := range entries {
		out = append(out, m.statusOf(r)...)
	}
	return out
}

// reconcile runs discovery once and starts or stops informers to match what is served.
func (m *Manager) reconcile(ctx context.Context) {
	m.reconciling.Lock()
	defer m.reconciling.Unlock()
	resources := m.entries()
	served, err := m.serve()
	if err != nil {
		m.met.discoveryFailures.Inc()
		m.log.Warn("discovery failed", "err", err)
		for _, r := range resources {
			if !r.running() {
				r.mu.Lock()
				r.lastError = err.Error()
				r.mu.Unlock()
			}
		}
		return
	}
	m.discovered.Store(true)
	if m.version.Load() == nil {
		if v, err := m.discovery.ServerVersion(); err == nil {
			m.version.Store(v)
		}
	}
	byGVR := map[schema.GroupVersionResource]*Resource{}
	for _, r := range resources {
		if r.cfg.IsWildcard() {
			continue // after every resource configured alone, which it leaves out
		}
		api, gvr, reason := resolve(served.resources, r.cfg)
		if reason != "" {
			r.stopInformers()
			r.setState(StateNotServed, reason)
			continue
		}
		if other, dup := byGVR[gvr]; dup {
			r.stopInformers()
			r.setState(StateInvalid, fmt.Sprintf("resolves to %s, already watched as %s", gvr, other.name))
			continue
		}
		if reason := applicable(r.cfg, api); reason != "" {
			r.stopInformers()
			r.setState(StateInvalid, reason)
			continue
		}
		byGVR[gvr] = r
		r.mu.RLock()
		moved := r.stop != nil && r.gvr != gvr
		r.mu.RUnlock()
		if moved {
			r.stopInformers()
		}
		if !r.running() {
			if err := r.start(ctx, m.dynamic, gvr, api); err != nil {
				r.setState(StateInvalid, err.Error())
			}
		}
	}
	m.expandGroups(ctx, served, byGVR)
}

// served is what discovery found.
type served struct {
	resources map[schema.GroupVersion][]metav1.APIResource
	// versions lists each group's versions, the preferred one first, then in discovery's order.
	versions map[string][]string
	// failed holds the group versions whose discovery failed: what they serve is unknown.
	failed map[schema.GroupVersion]bool
}

// serve returns what the apiserver serves. A discovery failure of some groups (a broken
// aggregated API) is logged, and the groups that answered are used.
func (m *Manager) serve() (served, error) {
	groups, lists, err := m.discovery.ServerGroupsAndResources()
	out := served{resources: map[schema.GroupVersion][]metav1.APIResource{}, versions: map[string][]string{}, failed: map[schema.GroupVersion]bool{}}
	if err != nil {
		var partial *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &partial) {
			return served{}, fmt.Errorf("discover served resources: %w", err)
		}
		m.log.Warn("discovery failed for some groups", "err", err)
		for gv := range partial.Groups {
			out.failed[gv] = true
		}
	}
	for _, list := range lists {
		gv, perr := schema.ParseGroupVersion(list.GroupVersion)
		if perr != nil {
			return served{}, errors.Join(err, perr)
		}
		out.resources[gv] = list.APIResources
	}
	for _, g := range groups {
		versions := []string{g.PreferredVersion.Version}
		for _, v := range g.Versions {
			if v.Version != g.PreferredVersion.Version {
				versions = append(versions, v.Version)
			}
		}
		out.versions[g.Name] = versions
	}
	return out, nil
}

// resolve finds the configured resource among the served ones, or says why it is not served.
func resolve(served map[schema.GroupVersion][]metav1.APIResource, cfg *config.Resource) (metav1.APIResource, schema.GroupVersionResource, string) {
	gv := cfg.GroupVersion()
	list, ok := served[gv]
	if !ok {
		return metav1.APIResource{}, schema.GroupVersionResource{}, fmt.Sprintf("the server does not serve API group version %q", gv)
	}
	for _, api := range list {
		if strings.Contains(api.Name, "/") { // a subresource
			continue
		}
		if (cfg.Resource != "" && api.Name == cfg.Resource) || (cfg.Kind != "" && api.Kind == cfg.Kind) {
			return api, gv.WithResource(api.Name), ""
		}
	}
	what := cfg.Resource
	if what == "" {
		what = "kind " + cfg.Kind
	}
	return metav1.APIResource{}, schema.GroupVersionResource{}, fmt.Sprintf("the server does not serve %s in %q", what, gv)
}

// applicable says why the configuration cannot apply to a served resource, or "".
func applicable(cfg *config.Resource, api metav1.APIResource) string {
	if !slices.Contains(api.Verbs, "list") || !slices.Contains(api.Verbs, "watch") {
		return fmt.Sprintf("%s does not support list and watch (verbs %v)", api.Name, api.Verbs)
	}
	if !api.Namespaced && (len(cfg.Namespaces) > 0 || len(cfg.ExcludeNamespaces) > 0 || cfg.NamespaceSelector != "") {
		return fmt.Sprintf("%s is cluster-scoped: namespaces, excludeNamespaces and namespaceSelector must be empty", api.Name)
	}
	return ""
}
