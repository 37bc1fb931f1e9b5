package httpapi

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports whether the service is ready, and if not, what holds it back.
type Readiness interface {
	Ready() (bool, []string)
}

// NewOps returns the operations handler: /metrics from gatherer, /healthz (liveness: the
// process serves HTTP), and /readyz (200 when ready, else 503 naming what is not ready).
func NewOps(gatherer prometheus.Gatherer, ready Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ok, reasons := ready.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n- %s\n", strings.Join(reasons, "\n- "))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
