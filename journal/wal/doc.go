// Package wal is the journal's log on disk: a directory of append-only files of checksummed
// frames, read back in order when it is opened.
//
// Vocabulary: a frame is one payload the caller appends, with its length and two CRC-32C
// checksums (of the length, and of the payload). A segment (seg-<id>.wal) is a file frames are
// appended to; a new one is begun when the last reaches SegmentSize, or on Rotate. A snapshot
// (snap-<id>.wal) is a file of frames the caller writes in one go, standing for everything in
// the segments before segment <id>: once it is written, Compact drops them. A Pos is where a
// payload lies, so that it can be read again without reading its file.
//
// Guarantees:
//   - Write hands its frame to the kernel (one pwritev): the process may die at once without
//     losing it. Sync makes every frame written durable (one fdatasync): a crash of the machine
//     loses no frame written before a Sync returned. StartSync runs that fdatasync on a
//     goroutine of its own, so that Write may go on meanwhile; the frames written before it
//     began are durable once FinishSync has returned nil. Append is Write then Sync. Once a MiB is
//     synced (dropBatch), its pages are dropped from the page cache: nothing of the log is
//     mapped, and what it wrote is not left charged to the process's memory. If a Sync fails, the frames it was
//     to make durable are written again before anything else is.
//   - A frame cut short by a crash (a torn tail: the last frame of the last segment reaching
//     past the end of the file, or a tail of zeros) is truncated at Open; what came before it
//     is read back. Any other frame that does not check is damage: it and everything after it
//     (the rest of its file, and every later file) are moved into a directory beside the log,
//     named <dir>.damaged-<time>, and Open reports it; what came before is read back.
//   - A failed Write or Append leaves the segment as it was before it (the partial frame is cut
//     off), so the caller may write the same payload again. Rotate and Close sync first: only
//     the last segment may end in a torn frame.
//   - A snapshot is written to a temporary file, synced and renamed into place: it is there
//     whole or not at all.
//
// Concurrency: Write, Sync, StartSync, FinishSync, Append, Written, Durable, Unsynced, Rotate,
// Compact, Sizes and Close are called from one goroutine (Sync, Rotate and Close wait for a sync
// StartSync began); WriteSnapshot from that one or from one of its own, at once with Append
// and Rotate; the removal Compact returns, and ReadAt and Release, from any, at once with
// those. A Pos stays readable until Compact drops its file: the caller must not read a Pos of
// a file it has compacted away.
package wal
