package delivery_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/webhook"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// signed builds the webhook transport, as app does: the benchmark measures what a signed
// webhook sink delivers, request and all.
func signed(cfg config.SinkConfig, log *slog.Logger, f delivery.Fence) (delivery.Transport, error) {
	return webhook.New(cfg.(*config.Webhook), object.Cluster{ID: "bench"}, log, f)
}

// BenchmarkDelivery sends events through a Dispatcher with one signed sink (4 workers) to a
// receiver on 127.0.0.1 that reads and discards each request. burst enqueues as fast as it can
// and reports delivered events per second; paced sends 1,000 events/s and reports the latency
// from enqueue to receipt.
func BenchmarkDelivery(b *testing.B) {
	sample, err := os.ReadFile("../dynamicinformer/testdata/transform/configmap-applied.golden.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var template map[string]any
	if err := yaml.Unmarshal(sample, &template); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct {
		name     string
		interval time.Duration
	}{{"burst", 0}, {"paced-1000/s", time.Millisecond}} {
		b.Run(mode.name, func(b *testing.B) { benchDelivery(b, template, mode.interval) })
	}
}

func benchDelivery(b *testing.B, template map[string]any, interval time.Duration) {
	var mu sync.Mutex
	received := map[string]time.Time{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		received[r.Header.Get("ce-id")] = time.Now()
		mu.Unlock()
	}))
	defer srv.Close()
	endpoint, _ := url.Parse(srv.URL)
	cfg := config.Webhook{Sink: config.Sink{Name: "bench", Labels: labels.Everything()}, Endpoint: endpoint, SigningSecrets: []config.Secret{[]byte("0123456789abcdef0123456789abcdef")}}
	cfg.Timeout, cfg.Workers, cfg.QueueSize = 10*time.Second, 4, 1<<20
	cfg.Retry = config.Retry{InitialBackoff: 10 * time.Millisecond, MaxBackoff: time.Second, MaxElapsed: time.Minute}
	d := delivery.StartPipeline(b, delivery.Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Transports: signed, Sinks: []config.SinkConfig{&cfg}}, "")
	defer d.Stop()

	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	sent := map[string]time.Time{}
	start := time.Now()
	next := start
	i := 0
	for b.Loop() {
		obj := (&unstructured.Unstructured{Object: template}).DeepCopy()
		obj.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
		obj.SetResourceVersion(fmt.Sprint(i))
		if interval > 0 {
			next = next.Add(interval)
			time.Sleep(time.Until(next))
		}
		e := object.Event{Type: object.Added, Resource: gvr, Object: object.New(obj), Observed: time.Now()}
		sent[journal.EventID(e)] = e.Observed
		d.Journal.OnEvent(e)
		i++
	}
	for {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= len(sent) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	var lat []time.Duration
	for id, t0 := range sent {
		lat = append(lat, received[id].Sub(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(sent))/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
