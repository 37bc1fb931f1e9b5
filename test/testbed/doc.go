// Package testbed runs a real Kubernetes control plane for dynwatch's tests, demo and
// benchmarks: etcd and kube-apiserver, built from the test/tools module (k8s.io/kubernetes
// v1.36.3, etcd v3.6) into a cache directory outside the repository and started on free
// loopback ports. A Cluster hands back a *rest.Config and a kubeconfig file for an admin token,
// and can restart its apiserver and compact etcd for fault tests. The apiserver writes every
// SubjectAccessReview, with its body, to an audit log (AuditLog), so tests can see what a
// delegating authorizer asked.
//
// Binaries are built once per version of test/tools (the cache key hashes its go.mod and
// go.sum); concurrent test processes share the build through a file lock. The cache lives in
// $DYNWATCH_TESTBED_CACHE, or dynwatch-testbed under the user cache directory.
//
// Every process the package starts dies with the test process (SIGKILL on parent death), and
// Stop removes all it wrote. Nothing listens beyond 127.0.0.1. A Cluster's methods are safe for
// concurrent use, except that Stop and RestartAPIServer must not overlap.
//
// Tests come in two tiers, told apart by go test's -short flag: `make test-unit` runs
// `go test -short` and only the tests that need no test bed; `make test` runs every test. A
// package with test bed tests starts its Cluster with Main, which under -short starts nothing;
// each test that needs the Cluster, or a binary the test bed builds (helm), calls Need first and
// skips under -short. A package all of whose tests need the test bed uses MainAll instead.
//
// StartNATS runs a cluster of nats-server processes (NATSServerVersion, built from the Go module
// proxy beside helm and Prometheus) with JetStream on loopback, whose servers a test can kill and
// start again, for the JetStream sink's tests.
//
// CreateConfigMaps fills a namespace with numbered configmaps, for the tests and benchmarks
// that need many objects.
package testbed
