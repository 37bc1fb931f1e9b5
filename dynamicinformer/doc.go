// Package dynamicinformer owns dynwatch's caches: for every configured resource it runs
// client-go's informer machinery over unstructured.Unstructured through the dynamic client,
// keyed by GroupVersionResource (one list and watch per listed namespace, or one for all
// namespaces): a Reflector lists and watches into a RealFIFO, which hands every change, in the
// order received, to the resource's store instead of client-go's indexer. The store keeps the
// objects in list order and by the values of their indexers, with the resourceVersion through
// which each stream's changes are applied, and is read through Snapshots taken in O(1): a
// snapshot shows every change up to its resourceVersion and none after, as the apiserver's
// watch cache does.
//
// Vocabulary: the Manager resolves each configured resource through discovery, starts its
// informers when the apiserver serves it and stops them when it no longer does (a CRD deleted),
// and reports readiness and status. A Resource is one configured entry and its informers. A
// whole group is an entry with resource "*": at each discovery the Manager expands it into its
// members, one Resource per resource of the API group (resource.version.group), each with the
// entry's settings and a state of its own; a member Stale before its first list holds back
// neither readiness nor the others. A member no longer served or no longer selected is retired:
// the objects its cache still held are handed out as deleted. A change becomes an object.Event:
// Added, Modified (with the old object) or Deleted (with the last known object: the watch's,
// or for a delete a relist found, the one the cache held).
//
// With a namespaceSelector, one informer watches the resource cluster-wide and a reflector
// follows the Namespaces the selector matches (the selection): objects of other namespaces are
// dropped before the cache, and when the selection changes the informer's watch brings the
// namespaces that joined in as ADDED and those that left out as DELETED, listed at the
// revision the watch has reached (for those that joined, at least the selection's). Such
// events, and deletes a relist found, carry the range of revisions the change happened in
// (object.Event's Since to Revision) rather than one, and are not in the watch's order; a
// resource's SelectionRevision is the selection's revision whose changes have been emitted.
//
// Whole objects are listed and watched as JSON (NewJSONClient), and each object, as it streams
// in, is cut to what the cache keeps (the managedFields and the last-applied annotation, as the
// transforms say) without being decoded: the cache keeps the apiserver's bytes less the cut
// ones. A resource whose transforms need the object as a value (a secret's data, removeFields
// paths, a jsonPath indexer), whose cache keeps metadata only, or whose namespaces a
// namespaceSelector picks, is decoded into unstructured and passes the resource's Transform
// there. Either way objects are kept as Objects: their JSON, and a header read once (namespace,
// name, uid, resourceVersion, labels, the values of the resource's indexers). Neither a list
// being received nor the cache holds a decoder's tree of maps; what needs an object as a value
// decodes it on demand. Lists, watches and webhook bodies are written from the kept JSON as it
// is. The transform is idempotent, as client-go requires. Objects handed out by the cache and
// in Events are shared and read-only.
//
// A subscriber that records every event of a stream in order (a Resumer: the journal) holds
// the stream's objects as of a revision; an informer of whole objects starts its stream from
// there, the recorded objects as its initial list and its watch from that revision, so that
// what changed while dynwatch was not running arrives version by version, in order.
//
// Concurrency: Subscribers are called from the informers' processing goroutines, one goroutine
// per list and watch, in the order it received the changes, each change's events once the
// store shows it, and for a retired member from the Manager's goroutine once its informers
// have stopped; they must return quickly and do no I/O: the list and watch waits for them. All
// Manager and Resource methods are safe for concurrent use.
package dynamicinformer
