//go:build tools

// Package tools pins the versions of the real Kubernetes control-plane binaries that dynwatch's
// test bed runs: kube-apiserver, kubectl (k8s.io/kubernetes v1.36.3, every staging module replaced
// by its v0.36.3 release) and etcd (go.etcd.io/etcd/server/v3). It is a module of its own so the
// service's go.mod never depends on k8s.io/kubernetes. Nothing here is imported; the test bed
// builds these main packages with `go build` into a cache directory outside the repository.
// go.mod's tool directive pins gofail too, whose `go tool gofail enable` turns dynwatch's
// failpoint comments into code for the tests that inject faults (test/runner).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
