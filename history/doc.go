// Package history keeps the past versions of the objects of every resource configured with a
// history (resources[].history), on disk, and reads them back for the query API: a watch from
// an older resourceVersion, a list at one, an object's revisions, the objects deleted.
//
// Vocabulary: a resource's history is a Log, a directory of segments (package wal) under
// state.path/history. A record is one change (an object's state after it, its revision, when it
// was observed, the field managers behind it) or a gap. Records are written in blocks of about
// blockSize (32 KiB), compressed together with zstd: a read of one record decodes its block; a
// segment is a run of blocks, begun when the last holds an eighth of what the history may keep
// or reaches back an eighth of its retention. The index is every change's key hash, revision
// and place, per segment, in memory: in the order written for the segment written to, sorted
// by key once sealed. An epoch is a run of changes with nothing left out between them (a gap
// that may hide changes begins one; a list's records belong to the one its end begins), and
// each block is of one. The first record of a key in a segment or an epoch carries the object
// before it too, so that a segment is read alone: retention drops whole segments, oldest first,
// once their newest change is older than Retain or the history is past MaxBytes. Else the
// object before a change is read from the key's record before it, of the same epoch: a list's
// records lie in key order, and a page of objects as a list found them reads a few blocks. The
// floor is the revision from which a Log holds every change: a gap moves it (a list the history
// does not reach, a relist, a block that could not be written, a change dropped while too many
// waited), and so does retention.
//
// Guarantees:
//   - A change is readable once its block is written, at most linger after the informer
//     handed it over (at once for a reader that waits: Barrier, Sync). The blocks of a batch
//     are written as they fill, and synced by the writer's next tick (every syncEvery): a
//     crash of the machine loses at most those not yet synced, and the history says so at the
//     next start, as a gap at the list's revision if the watch cannot resume past it.
//   - Between the floor and the last change written, the history is exact: Past(rev) tells
//     which objects changed after rev from the index alone and reads each one's state at rev
//     on demand, and Changes(rev) gives every change after it, in order. Before the floor it
//     is not asked: the query API answers 410 Expired. Retention writes the floor it leaves
//     as a gap before it removes a segment.
//   - Memory is the index (about 24 bytes a change), the block being filled and, while the disk
//     stalls, at most maxQueued bytes of changes waiting (an initial list's objects, the
//     cache's own, are not counted): past it, changes are left out, counted
//     (Stats.Lost) and the floor moved past them. Reads stream from disk a block at a time.
//
// Concurrency: OnEvent and ListSynced never block and do no I/O; Run's goroutine alone writes.
// Reads (Revisions, Changes, Past, Deleted, Floor, Stats) may run from any goroutine at once with
// it: each sees the segments as they were when it began, and fails with ErrMovedOn if
// retention dropped one it was reading.
package history
