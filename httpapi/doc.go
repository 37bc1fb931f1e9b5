// Package httpapi owns dynwatch's HTTP surfaces: the API server (gin), which serves /status
// and read-only queries over the informer caches, and the operations server, which serves
// /metrics, /healthz and /readyz.
//
// Handlers only read: they take their data from the dynamicinformer.Manager and the Prometheus
// gatherer they are built with, and are safe for concurrent use. Serve runs one http.Server
// until its context ends, then shuts it down gracefully.
package httpapi
