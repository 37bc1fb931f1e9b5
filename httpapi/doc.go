// Package httpapi owns dynwatch's HTTP surfaces: the API server (gin), which serves /status
// and read-only queries over the informer caches, and the operations server, which serves
// /metrics, /healthz and /readyz.
//
// Every API request passes the gate first (guard.go): the URL length limit, the server's and
// the caller's share of in-flight requests and watches, and, with api.auth.mode kubernetes,
// authentication (TokenReview, client certificates) and authorization (SubjectAccessReview)
// through the cluster with the attributes the apiserver would check, so a caller reads
// exactly what it could read from the apiserver. Security builds those from the config, with
// the serving certificate (tls.go), which follows its files without a restart.
//
// Handlers only read, and are safe for concurrent use: objects from the dynamicinformer.Manager's
// caches and the watch Hub; /status also from the reload, election and journal reports they are
// given; OpenAPI documents, CustomResourceDefinitions and (with api.events apiserver) events
// from the apiserver, with dynwatch's identity; the metrics from the Prometheus gatherer. Work on a request stops when
// its client goes away or api.requestTimeout passes. Serve runs one http.Server until its
// context ends, then shuts it down gracefully.
package httpapi
