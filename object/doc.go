// Package object is the one place for an object's identity in dynwatch: its key in the cache,
// the key that orders its deliveries, list order, the parsing of its resourceVersion, and the
// name of its resource, spelt one way in logs, metrics, dead letters, the checkpoint ConfigMap
// and the state store. It imports nothing of dynwatch's and holds no state.
//
// Vocabulary: a key is namespace/name, or name for a cluster-scoped object, as client-go's
// MetaNamespaceKeyFunc makes it. List order is the apiserver's (etcd's key order): by
// namespace, then name, cluster-scoped objects first. A resource name is
// resource.version.group (configmaps.v1, deployments.v1.apps): a resource and a version are
// DNS labels and hold no dot, so the name parses back unambiguously. An ordering key is the
// resource name and the object's key, joined by "|".
package object
