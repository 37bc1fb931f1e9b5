package history

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	bytesDesc = prometheus.NewDesc("dynwatch_history_bytes",
		"Disk the resource's history takes, in bytes.", []string{"resource"}, nil)
	versionsDesc = prometheus.NewDesc("dynwatch_history_versions",
		"Changes the resource's history holds.", []string{"resource"}, nil)
	floorDesc = prometheus.NewDesc("dynwatch_history_floor_revision",
		"The resourceVersion from which the resource's history holds every change: lists at and watches from a resourceVersion at or after it are answered from the history.", []string{"resource"}, nil)
	oldestDesc = prometheus.NewDesc("dynwatch_history_oldest_timestamp_seconds",
		"When the oldest change the resource's history holds was observed, as a Unix time.", []string{"resource"}, nil)
	lostDesc = prometheus.NewDesc("dynwatch_history_lost_changes_total",
		"Changes left out of the resource's history: not written (the disk was full) or dropped while too many waited to be written.", []string{"resource"}, nil)
)

// collector reads the histories' Stats at each scrape: a history is opened with its
// resource's first event, so its series appear then.
type collector struct{ r *Recorder }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{bytesDesc, versionsDesc, floorDesc, oldestDesc, lostDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.r.Stats() {
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.GaugeValue, float64(st.Bytes), st.Resource)
		ch <- prometheus.MustNewConstMetric(versionsDesc, prometheus.GaugeValue, float64(st.Versions), st.Resource)
		ch <- prometheus.MustNewConstMetric(floorDesc, prometheus.GaugeValue, float64(st.Floor), st.Resource)
		oldest := 0.0
		if !st.Oldest.IsZero() {
			oldest = float64(st.Oldest.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, oldest, st.Resource)
		ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(st.Lost), st.Resource)
	}
}
