package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// The cluster's identity as SIG Multicluster standardised it (KEP-2149): the ClusterProperty
// named cluster.clusterset.k8s.io, whose spec.value is the cluster's id.
var (
	clusterProperties = schema.GroupVersionResource{Group: "about.k8s.io", Version: "v1alpha1", Resource: "clusterproperties"}
	namespaces        = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

// ClusterPropertyName is the ClusterProperty that holds the cluster's id.
const ClusterPropertyName = "cluster.clusterset.k8s.io"

// resolveCluster is the cluster's identity: cfg's id when set; else the ClusterProperty's
// value where the apiserver serves that API, the property exists and dynwatch may read it;
// else the kube-system namespace's uid. An answer that says neither yes nor no (the apiserver
// unreachable, a 5xx) is asked again until ctx ends; a kube-system dynwatch may not read is an
// error naming the grant.
func resolveCluster(ctx context.Context, log *slog.Logger, cfg config.Cluster, dyn dynamic.Interface) (object.Cluster, error) {
	c := object.Cluster{Name: cfg.Name, InKeys: *cfg.InKeys}
	if cfg.ID != "" {
		c.ID, c.From = cfg.ID, object.ClusterIDConfigured
		return c, nil
	}
	var err error
	retry := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 1 << 30}
	waitErr := wait.ExponentialBackoffWithContext(ctx, retry, func(ctx context.Context) (bool, error) {
		c.ID, c.From, err = readClusterID(ctx, dyn)
		if err != nil && !errors.Is(err, errNoClusterID) {
			log.Warn("cluster identity: the apiserver did not answer; asking again", "err", err)
			return false, nil
		}
		return true, nil
	})
	switch {
	case errors.Is(err, errNoClusterID):
		return c, err
	case waitErr != nil:
		return c, fmt.Errorf("cluster identity: %w (last: %w)", waitErr, err)
	}
	log.Info("cluster identity", "id", c.ID, "from", c.From, "name", c.Name)
	return c, nil
}

// errNoClusterID is an answer that will not change by asking again.
var errNoClusterID = errors.New("cluster identity")

// readClusterID reads the cluster's id once (see resolveCluster).
func readClusterID(ctx context.Context, dyn dynamic.Interface) (id, from string, err error) {
	p, err := dyn.Resource(clusterProperties).Get(ctx, ClusterPropertyName, metav1.GetOptions{})
	switch {
	case err == nil:
		v, _, _ := unstructured.NestedString(p.Object, "spec", "value")
		if err := config.ValidateClusterID(v); err != nil {
			return "", "", fmt.Errorf("%w: the ClusterProperty %s's spec.value: %w (set cluster.id to override it)", errNoClusterID, ClusterPropertyName, err)
		}
		return v, object.ClusterIDFromClusterProperty, nil
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsMethodNotSupported(err):
		// Not served, not there, or not ours to read: the kube-system namespace's uid.
	default:
		return "", "", err
	}
	ns, err := dyn.Resource(namespaces).Get(ctx, "kube-system", metav1.GetOptions{})
	switch {
	case err == nil:
		return string(ns.GetUID()), object.ClusterIDFromKubeSystem, nil
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
		return "", "", fmt.Errorf("%w: cannot read the namespace kube-system (%w): grant get on namespaces named kube-system, or set cluster.id", errNoClusterID, err)
	}
	return "", "", err
}
