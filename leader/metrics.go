package leader

import "github.com/prometheus/client_golang/prometheus"

// metrics are the leader election's metrics.
type metrics struct {
	leading     prometheus.Gauge
	transitions prometheus.Counter
	checkpoints *prometheus.CounterVec
	refused     *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		leading:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynwatch_leader_election_leading", Help: "1 while this replica holds the Lease and delivers, else 0."}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynwatch_leader_election_transitions_total", Help: "Changes of leader this replica has seen."}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynwatch_leader_election_checkpoints_total", Help: "Checkpoint exchanges with the cluster, by operation (write while leading, read while following) and result (ok, error, or refused: read and not acted on)."}, []string{"operation", "result"}),
		refused:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynwatch_leader_election_checkpoints_refused_total", Help: "Checkpoints read from the ConfigMap and not acted on, by reason: malformed, notLeaseHolder (not written by the Lease's holder in its current term), aheadOfCluster (a revision the cluster has not reached)."}, []string{"reason"}),
	}
	for _, op := range []string{"read", "write"} {
		for _, r := range []string{"ok", "error"} {
			m.checkpoints.WithLabelValues(op, r)
		}
	}
	m.checkpoints.WithLabelValues("read", "refused")
	for _, r := range refusals {
		m.refused.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leading, m.transitions, m.checkpoints, m.refused}
}
