// Package walbench compares, side by side, the logs the journal could keep its records in,
// under the journal's own workload. It has no code of its own: only a test, which checks that
// every candidate holds what the workload left it, and BenchmarkCommit.
//
// The workload is a run of group commits. Each commit is 8 records of about 2 KiB of random
// bytes (1792 to 2303), numbered in sequence, made durable with one sync; each also
// acknowledges, and so may remove, every record that has fallen out of a window of the last
// 256 (acknowledgements, as delivery would make them). The candidates, each as the journal
// would use it:
//
//   - wal: journal/wal. A commit is one Append of its records and acknowledgement; once the
//     segments pass four windows' bytes, the log is rotated, the live window written as a
//     snapshot (read back with ReadAt) and the old segments compacted away.
//   - bbolt: what the journal used before journal/wal, with its options (NoFreelistSync, the map freelist).
//     A commit is one Update that puts the 8 records under big-endian sequence keys and
//     deletes the acknowledged ones.
//   - raftwal: github.com/hashicorp/raft-wal. A commit is one StoreLogs of 8 raft.Log entries
//     (index = sequence + 1) followed by a DeleteRange of the acknowledged head;
//     raftwal-trim64 removes the head every 64 commits instead, as raft-wal's design expects.
//   - pebble-record: only the WAL writer of github.com/cockroachdb/pebble (record.LogWriter,
//     with fdatasync as Pebble's own files sync). A commit is one SyncRecord of the records and
//     acknowledgement; nothing is ever removed (Pebble frees a WAL once its memtable is
//     flushed, which this does not model), so it is the floor: append and sync alone.
//
// Besides ns/op (one commit), BenchmarkCommit reports for each candidate, from /proc, per
// record: the bytes the process handed to write(2) (wchar-B/record) and the bytes it sent to
// storage (disk-write-B/record: whole pages, counted again each time a synced page is written
// again); and once the commits are done: the directory's allocated size (dir-KiB), its files'
// pages in the page cache (page-cache-KiB, charged to the process's memory cgroup) and the
// process's resident memory mapped from them (mapped-KiB, from /proc/self/smaps).
//
// Run it with a short, fixed count: go test -run XXX -bench . -benchtime 300x ./test/walbench/
package walbench
