package httpapi

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports whether the service is ready, and if not, what holds it back.
type Readiness interface {
	Ready() (bool, []string)
}

// NewOps returns the operations handler: /metrics from gatherer, /healthz (liveness: the
// process serves HTTP), /readyz (200 when every one of ready is, else 503 naming what is not
// ready), and with withPProf Go's profiles under /debug/pprof/.
func NewOps(gatherer prometheus.Gatherer, withPProf bool, ready ...Readiness) http.Handler {
	mux := http.NewServeMux()
	if withPProf {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var reasons []string
		for _, r := range ready {
			if ok, why := r.Ready(); !ok {
				reasons = append(reasons, why...)
			}
		}
		if len(reasons) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n- %s\n", strings.Join(reasons, "\n- "))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
