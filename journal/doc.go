// Package journal owns the durability of dynwatch's events: the state store, the outboxes, the
// comparison of an initial list with what was stored before a restart, and the checkpoints
// that let several replicas share the work of one leader.
//
// The journal alone opens, reads and closes the store: New opens it (dropping a torn tail,
// setting damage aside), ReadOutbox is the
// one way an outbox is read back, Close closes it.
//
// Vocabulary: the store is a log (package wal) in the directory state.path: each commit is one
// frame of records appended and synced, the records holding, per resource, the last state of
// every object handed to the sinks and, per sink, the outbox: the entries recorded for it and
// not yet acknowledged. When the log has outgrown the state it leads to, a snapshot of that
// state replaces it (compact.go). In memory the journal keeps each object's state as the
// cache's own object (or, read back at start, where its JSON lies), and each outbox entry's
// index: its revision and where it lies; an entry's body is read from the log when it is
// read back. An entry's body refers to the objects its commit wrote before it (the object's
// new state, another sink's entry of the same event) rather than holding them again; a
// snapshot writes each entry whole. A Target is a sink as the journal sees it: a name, a filter and a queue. An
// Entry is one event recorded for one target, with its stable id and its ordering key. A
// Checkpoint is a revision per sink and per resource through which every event has been
// acknowledged; one resource's resourceVersions compare as integers, so a checkpoint means the
// same on every replica.
//
// Guarantees:
//   - An entry is queued only once its commit is written to the log (the kernel has it: the
//     process may die at once and lose nothing), and the commits written within syncEvery are
//     then made durable by one fdatasync, sooner once they hold syncBytes. The fdatasync runs
//     on a goroutine of its own: commits go on while it runs, and the next sync covers them.
//     The state of an object is committed with the entries it produced, in the same frame,
//     never ahead of them. So what a crash of the machine loses, at most the commits of the
//     last syncEvery and of the fdatasync in flight, it loses whole: entries and states
//     together, with the revision its stream was recorded through. What a crash cuts short is
//     derived again at the next start: the stream resumes (Resume) from the revision the last
//     surviving commit recorded, and its watch sends the lost events again, under the same
//     ids; where it cannot resume, by comparing the initial list with the stored state: a
//     changed object is recorded as MODIFIED (or as DELETED and ADDED when its uid changed),
//     an object gone as DELETED, under the ids the lost entries had.
//   - An entry leaves its outbox only when it is acknowledged: by Ack (delivered or
//     dead-lettered), or by a checkpoint at or past its revision (Trim). An acknowledgement
//     commits with the next commit events start, or alone within ackDelay: a crash
//     repeats at most that much of what was delivered, with the same ids.
//   - A failed commit queues nothing and loses nothing: the log is cut back to where it was,
//     and its operations are committed again, ahead of later ones, until a commit succeeds. An
//     operation that fails on its own (a stored object that does not decode) is counted and
//     skipped.
//   - A crash loses at most the commit being written (a torn tail, dropped at the next start).
//     Damage to the log is set aside from where it begins; what came before is kept, and what
//     followed is derived again by the next start's comparison: the events repeated carry the
//     ids they had.
//   - Checkpoints computed by a replica that delivers are true: every change of the resource up
//     to the revision has been recorded (each stream's initial list has synced and its watch
//     has passed the revision) and every entry up to it has left the outbox. A replica that
//     trims to them keeps everything the deliverer might not have acknowledged, so the one
//     that delivers next loses nothing; it repeats at most what was acknowledged after the
//     last checkpoint it received.
//   - Events of one object are committed in the order they were recorded. With Options.Workers,
//     events of different objects may be committed in another order (each is filtered by the
//     preselector's workers, off the writer, so that one tenant's costly object holds up only
//     its own events); checkpoints then stay below every event the
//     preselector still holds, and a list's start and end wait until it holds nothing.
//
// Files: journal.go holds the contract and the operations callers submit, ops.go what a commit
// is made of, writer.go the loop that commits them (Run), apply.go the restart decision
// (decide) and the fan-out, outbox.go the reading of outboxes, store.go and txn.go the store
// and one commit's transaction, records.go the records' encoding.
//
// Concurrency: OnEvent, Ack and the other operations never block and do no I/O (ListStarted and
// ListSynced wait, with workers, for the preselector to empty); one goroutine (Run) applies
// them, a batch per commit (one frame appended, one fdatasync). Targets' Queue is called from that goroutine; their Selects
// from it and, with workers, from the workers at once. Checkpoints, OutboxLen, ReadOutbox and
// Sinks may be called from any goroutine.
package journal
