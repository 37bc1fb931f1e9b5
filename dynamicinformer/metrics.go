package dynamicinformer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the Manager's metrics. The gauges are read from the resources at scrape time.
type metrics struct {
	m                 *Manager
	events            *prometheus.CounterVec
	relistEvents      *prometheus.CounterVec
	watchErrors       *prometheus.CounterVec
	checks            *prometheus.CounterVec
	transitions       *prometheus.CounterVec
	discoveryFailures prometheus.Counter
	objects           *prometheus.Desc
	synced, stale     *prometheus.Desc
	served            *prometheus.Desc
}

func newMetrics(m *Manager) *metrics {
	return &metrics{
		m: m,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_informer_events_total",
			Help: "Events emitted by the informers of a watched resource, by event type.",
		}, []string{"resource", "type"}),
		relistEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_informer_relist_events_total",
			Help: "Events a relist produced, by event type: changes made while the watch was broken (expired, or the apiserver restarted) that the watch never reported.",
		}, []string{"resource", "type"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_informer_watch_errors_total",
			Help: "List and watch errors reported by the informers of a watched resource.",
		}, []string{"resource"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_informer_consistency_checks_total",
			Help: "Consistency checks of a watched resource's cache against a list from the apiserver at the cache's resourceVersion, by result: success, failure (the cache differed, and was listed again) or error (the list failed).",
		}, []string{"resource", "status"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_informer_selection_transitions_total",
			Help: "Changes of a namespaceSelector's selection brought into a watch of the resource (applied), and those that first waited out the one-second debounce (deferred); a namespace that leaves and comes back within it produces no events.",
		}, []string{"resource", "result"}),
		discoveryFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynwatch_discovery_failures_total",
			Help: "Discovery runs that failed.",
		}),
		objects: prometheus.NewDesc("dynwatch_informer_objects",
			"Objects in the cache of a watched resource.", []string{"resource"}, nil),
		synced: prometheus.NewDesc("dynwatch_informer_synced",
			"1 when the informers of a watched resource have synced, else 0.", []string{"resource"}, nil),
		stale: prometheus.NewDesc("dynwatch_informer_stale",
			"1 when a watched resource's list and watch have failed for longer than its staleAfter, so its data may be out of date, else 0.", []string{"resource"}, nil),
		served: prometheus.NewDesc("dynwatch_informer_served",
			"1 when the apiserver serves a watched resource and its informers run, else 0.", []string{"resource"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (x *metrics) Describe(ch chan<- *prometheus.Desc) {
	x.events.Describe(ch)
	x.relistEvents.Describe(ch)
	x.watchErrors.Describe(ch)
	x.checks.Describe(ch)
	x.transitions.Describe(ch)
	x.discoveryFailures.Describe(ch)
	ch <- x.objects
	ch <- x.synced
	ch <- x.stale
	ch <- x.served
}

// Collect implements prometheus.Collector.
func (x *metrics) Collect(ch chan<- prometheus.Metric) {
	x.events.Collect(ch)
	x.relistEvents.Collect(ch)
	x.watchErrors.Collect(ch)
	x.checks.Collect(ch)
	x.transitions.Collect(ch)
	x.discoveryFailures.Collect(ch)
	for _, r := range x.m.Resources() {
		st := r.State()
		ch <- prometheus.MustNewConstMetric(x.objects, prometheus.GaugeValue, float64(r.objects.Load()), r.name)
		ch <- prometheus.MustNewConstMetric(x.synced, prometheus.GaugeValue, bool01(st == StateSynced), r.name)
		ch <- prometheus.MustNewConstMetric(x.stale, prometheus.GaugeValue, bool01(st == StateStale), r.name)
		ch <- prometheus.MustNewConstMetric(x.served, prometheus.GaugeValue, bool01(st == StateSyncing || st == StateSynced), r.name)
	}
}

// forget drops a removed resource's series.
func (x *metrics) forget(resource string) {
	for _, v := range []*prometheus.CounterVec{x.events, x.relistEvents, x.watchErrors, x.checks, x.transitions} {
		v.DeletePartialMatch(prometheus.Labels{"resource": resource})
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
