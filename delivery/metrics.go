package delivery

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/journal"
)

// metrics are the delivery metrics of every kind of sink, labelled by sink; every label value
// exists from the start. They keep the webhook_ names they had before sinks of other kinds.
type metrics struct {
	enqueued, delivered             *prometheus.CounterVec
	attempts, retries, filterErrors *prometheus.CounterVec
	deadLetters, deadLetterFailures *prometheus.CounterVec
	requestDuration, age            *prometheus.HistogramVec
	initialState, answers           *prometheus.CounterVec
	replaying, disabled, durable    *prometheus.GaugeVec
	queueLength, outboxLength       *prometheus.Desc
	journal                         *journal.Journal

	mu     sync.Mutex
	queues map[string]*Queue
}

// sinkMetrics are one sink's children of the metrics.
type sinkMetrics struct {
	enqueued, delivered, superseded, withheld, deadLettered, attempts, retries, filterErrors, deadLetterFailures prometheus.Counter
	deadLetters                                                                                                  map[string]prometheus.Counter
	answers                                                                                                      *prometheus.CounterVec // curried by sink
	durable                                                                                                      *prometheus.GaugeVec   // curried by sink
	requestDuration, age                                                                                         prometheus.Observer
	initialState                                                                                                 prometheus.Counter
	replaying, disabled                                                                                          prometheus.Gauge
}

var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600}

func newMetrics(j *journal.Journal) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynwatch_webhook_" + name, Help: help}, append([]string{"sink"}, labels...))
	}
	m := &metrics{
		enqueued:           counter("enqueued_total", "Events a sink's filters selected and its queue accepted."),
		delivered:          counter("deliveries_total", "Events finished, by result: delivered (a 2xx, or acknowledged by the stream or the Kafka cluster), superseded (a JetStream subject already held a newer version of the object), withheld (a Subscription's subject may not watch the object: never sent) or dead_lettered.", "result"),
		attempts:           counter("attempts_total", "Attempts to hand an event to a sink: HTTP requests, JetStream publishes, Kafka records produced."),
		retries:            counter("retries_total", "Attempts that repeated an earlier failed one."),
		answers:            counter("answers_total", "Attempts to hand an event to a sink by the class of the answer: a webhook's 2xx, 3xx, 4xx, 410, 429 or 5xx; a stream's ack or refused; timeout (no answer within the sink's timeout) or error (none: a connection that failed).", "class"),
		filterErrors:       counter("filter_errors_total", "Events the sink's CEL filter could not decide on (an error, a result not a bool, the cost limit); handled as its filterErrors says."),
		deadLetters:        counter("dead_letters_total", "Events dead-lettered, by reason: retries_exhausted, rejected, queue_full, shutdown, sink_removed, filterError, gone.", "reason"),
		deadLetterFailures: counter("dead_letter_failures_total", "Dead letters that could not be written to their file or URL, or not before the shutdown deadline without a state store; they are logged instead, without the object."),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynwatch_webhook_request_duration_seconds", Help: "Duration of each attempt to hand an event to a sink, until its answer or acknowledgement.", Buckets: latencyBuckets,
		}, []string{"sink"}),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynwatch_webhook_event_age_seconds", Help: "Time from an event's observation to its delivery.", Buckets: latencyBuckets,
		}, []string{"sink"}),
		initialState: counter("initial_state_objects_total", "Current objects recorded for a sink as ADDED by its initialState replay (those its filters selected)."),
		replaying: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynwatch_webhook_initial_state_replaying", Help: "1 while a sink's initialState replay is under way on this replica, else 0.",
		}, []string{"sink"}),
		disabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynwatch_webhook_disabled", Help: "1 while a sink is disabled because its destination answered 410 Gone, until its configuration changes; else 0.",
		}, []string{"sink"}),
		durable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynwatch_sink_durable", Help: "A stream sink's destination as its last durability check found it, one series per status set to 1: True (an acknowledged event has durability.minReplicas copies and survives the loss of power on every server at once), False or Unknown.",
		}, []string{"sink", "status"}),
		queueLength:  prometheus.NewDesc("dynwatch_webhook_queue_length", "Events queued or being delivered, per sink.", []string{"sink"}, nil),
		outboxLength: prometheus.NewDesc("dynwatch_webhook_outbox_length", "Events in a sink's durable outbox: neither delivered nor dead-lettered. 0 without a state store.", []string{"sink"}, nil),
		journal:      j,
		queues:       map[string]*Queue{},
	}
	return m
}

// answered counts an attempt answered in class.
func (sm sinkMetrics) answered(class string) { sm.answers.WithLabelValues(class).Inc() }

// forSink are sink's children of the metrics; webhook says which answers it gets.
func (m *metrics) forSink(sink string, q *Queue, webhook bool) sinkMetrics {
	m.mu.Lock()
	m.queues[sink] = q
	m.mu.Unlock()
	sm := sinkMetrics{
		enqueued:           m.enqueued.WithLabelValues(sink),
		delivered:          m.delivered.WithLabelValues(sink, "delivered"),
		superseded:         m.delivered.WithLabelValues(sink, "superseded"),
		withheld:           m.delivered.WithLabelValues(sink, "withheld"),
		deadLettered:       m.delivered.WithLabelValues(sink, "dead_lettered"),
		attempts:           m.attempts.WithLabelValues(sink),
		retries:            m.retries.WithLabelValues(sink),
		filterErrors:       m.filterErrors.WithLabelValues(sink),
		deadLetterFailures: m.deadLetterFailures.WithLabelValues(sink),
		deadLetters:        map[string]prometheus.Counter{},
		requestDuration:    m.requestDuration.WithLabelValues(sink),
		age:                m.age.WithLabelValues(sink),
		initialState:       m.initialState.WithLabelValues(sink),
		replaying:          m.replaying.WithLabelValues(sink),
		disabled:           m.disabled.WithLabelValues(sink),
		answers:            m.answers.MustCurryWith(prometheus.Labels{"sink": sink}),
		durable:            m.durable.MustCurryWith(prometheus.Labels{"sink": sink}),
	}
	for _, r := range reasons {
		sm.deadLetters[r] = m.deadLetters.WithLabelValues(sink, r)
	}
	classes := streamAnswers
	if webhook {
		classes = webhookAnswers
	}
	for _, c := range classes {
		sm.answers.WithLabelValues(c)
	}
	return sm
}

// removeSink drops a removed sink's series.
func (m *metrics) removeSink(sink string) {
	m.mu.Lock()
	delete(m.queues, sink)
	m.mu.Unlock()
	for _, c := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.enqueued, m.delivered, m.attempts, m.retries, m.filterErrors, m.deadLetters, m.deadLetterFailures, m.requestDuration, m.age,
		m.initialState, m.replaying, m.disabled, m.answers, m.durable,
	} {
		c.DeletePartialMatch(prometheus.Labels{"sink": sink})
	}
}

func (m *metrics) vectors() []prometheus.Collector {
	return []prometheus.Collector{m.enqueued, m.delivered, m.attempts, m.retries, m.filterErrors, m.deadLetters, m.deadLetterFailures, m.requestDuration, m.age,
		m.initialState, m.replaying, m.disabled, m.answers, m.durable}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.vectors() {
		c.Describe(ch)
	}
	ch <- m.queueLength
	ch <- m.outboxLength
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.vectors() {
		c.Collect(ch)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for sink, q := range m.queues {
		ch <- prometheus.MustNewConstMetric(m.queueLength, prometheus.GaugeValue, float64(q.Len()), sink)
		ch <- prometheus.MustNewConstMetric(m.outboxLength, prometheus.GaugeValue, float64(m.journal.OutboxLen(sink)), sink)
	}
}
