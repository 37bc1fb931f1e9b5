// Package object is dynwatch's data model, on which every other package stands: the Object the
// cache, the journal and the query API share (object.go: an object kept as its JSON with a
// header of offsets, header.go; its JSON encoding, json.go; its JSON read in place,
// members.go; the summary of who changed it, managers.go), the Event a change becomes
// (event.go), and an object's identity (key.go): its key in the cache, the key that orders
// its deliveries, list order, the parsing of its resourceVersion, and the name of its
// resource, spelt one way in logs, metrics, dead letters, the checkpoint ConfigMap and the
// state store. It imports nothing of dynwatch's (the standard library, apimachinery and the
// JSON reader only) and holds no state but the seed of the summaries' hashes, set once.
//
// Concurrency: an Object is immutable once made, and safe to share between goroutines; nothing
// may modify what its methods return. The exception is an Object of a Slab (slab.go: objects
// for a moment, their structs and headers in pooled chunks), valid until the slab is Reset; a
// Slab is its one user's.
//
// Vocabulary: a key is namespace/name, or name for a cluster-scoped object, as client-go's
// MetaNamespaceKeyFunc makes it. List order is the apiserver's (etcd's key order): by
// namespace, then name, cluster-scoped objects first. A resource name is
// resource.version.group (configmaps.v1, deployments.v1.apps): a resource and a version are
// DNS labels and hold no dot, so the name parses back unambiguously. An ordering key is the
// resource name and the object's key, joined by "|".
package object
