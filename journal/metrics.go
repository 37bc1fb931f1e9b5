package journal

import "github.com/prometheus/client_golang/prometheus"

// metrics are the state store's metrics.
type metrics struct {
	store                                          *store // nil: no store
	storeSize, written, held                       *prometheus.Desc
	commits, commitErrors, suppressed, fullReplays prometheus.Counter
	writeErrors, corrupt, damaged                  prometheus.Counter
	compactions, compactionErrors, syncs           prometheus.Counter
}

func newMetrics(store *store) *metrics {
	m := &metrics{
		store:            store,
		storeSize:        prometheus.NewDesc("dynwatch_state_size_bytes", "Size of the state store's files: its snapshot and the log after it.", nil, nil),
		held:             prometheus.NewDesc("dynwatch_state_held_bytes", "Size of the state the store holds: the objects' JSON and the outbox entries, as a snapshot writes them.", nil, nil),
		written:          prometheus.NewDesc("dynwatch_state_written_bytes_total", "Bytes the state store's commits appended to its log (snapshots not counted).", nil, nil),
		commits:          prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_commits_total", Help: "Commits to the state store, each one frame written to its log; each carries every event and acknowledgement pending at its start."}),
		syncs:            prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_syncs_total", Help: "fdatasyncs of the state store's log; each makes every commit written since the last durable."}),
		compactions:      prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_compactions_total", Help: "Snapshots of the state store written in place of its log."}),
		compactionErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_compaction_errors_total", Help: "Snapshots of the state store that could not be written; the log is kept and compacted later."}),
		commitErrors:     prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_commit_errors_total", Help: "State store transactions that failed to commit (a full disk); nothing in them is delivered until a later commit succeeds."}),
		writeErrors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_write_errors_total", Help: "Single operations the state store refused; each was skipped and the rest of its transaction committed."}),
		corrupt:          prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_corrupt_entries_total", Help: "Stored objects or outbox entries that did not decode; objects are derived again from the cache, outbox entries removed."}),
		damaged:          prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_damaged_total", Help: "State store files found damaged at start, set aside and replaced by a full replay."}),
		suppressed:       prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_suppressed_events_total", Help: "Events not delivered because the sinks already had that state of the object (an unchanged object in the initial list after a restart)."}),
		fullReplays:      prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_state_full_replays_total", Help: "Initial lists delivered in full as ADDED because nothing was stored for the resource (a new resource, a first start, or a lost state volume)."}),
	}
	if store != nil && store.Damaged != "" {
		m.damaged.Inc()
	}
	if store != nil {
		m.corrupt.Add(float64(store.corruptAtOpen))
	}
	return m
}

func (m *metrics) counters() []prometheus.Collector {
	return []prometheus.Collector{m.commits, m.commitErrors, m.suppressed, m.fullReplays, m.writeErrors, m.corrupt, m.damaged, m.compactions, m.compactionErrors, m.syncs}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.counters() {
		c.Describe(ch)
	}
	ch <- m.storeSize
	ch <- m.written
	ch <- m.held
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.counters() {
		c.Collect(ch)
	}
	var size, written, held int64
	if m.store != nil {
		size, written, held = m.store.size.Load(), m.store.written.Load(), m.store.held.Load()
	}
	ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(m.storeSize, prometheus.GaugeValue, float64(size))
	ch <- prometheus.MustNewConstMetric(m.written, prometheus.CounterValue, float64(written))
}
