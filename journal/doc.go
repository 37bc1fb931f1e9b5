// Package journal owns the durability of dynwatch's events: the state store, the outboxes, the
// comparison of an initial list with what was stored before a restart, and the checkpoints
// that let several replicas share the work of one leader.
//
// The journal alone opens, reads and closes the store: New opens it (setting aside a damaged
// file, upgrading an older format), ReadOutbox is the one way an outbox is read back, Close
// closes it.
//
// Vocabulary: the store is a bbolt file holding, per resource, the last state of every object
// handed to the sinks and, per sink, the outbox: the entries recorded for it and not yet
// acknowledged. A Target is a sink as the journal sees it: a name, a filter and a queue. An
// Entry is one event recorded for one target, with its stable id and its ordering key. A
// Checkpoint is a revision per sink and per resource through which every event has been
// acknowledged; one resource's resourceVersions compare as integers, so a checkpoint means the
// same on every replica.
//
// Guarantees:
//   - An entry is queued only once it is committed, so what a target is handed survives a crash;
//     the state of an object is committed with the entries it produced, never ahead of them.
//     What a crash cuts short before a commit is derived again at the next start, by comparing
//     the initial list with the stored state: a changed object is recorded as MODIFIED (or as
//     DELETED and ADDED when its uid changed), an object gone as DELETED.
//   - An entry leaves its outbox only when it is acknowledged: by Ack (delivered or
//     dead-lettered), or by a checkpoint at or past its revision (Trim). An acknowledgement
//     commits with the next transaction events start, or alone within ackDelay: a crash
//     repeats at most that much of what was delivered, with the same ids.
//   - A failed commit queues nothing and loses nothing: its operations are committed again,
//     ahead of later ones, until a commit succeeds. An operation that fails on its own (a
//     corrupt entry) is counted and skipped.
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
// Concurrency: Record, Ack and the other operations never block and do no I/O (ListStarted and
// ListSynced wait, with workers, for the preselector to empty); one goroutine (Run) applies
// them, a batch per transaction. Targets' Queue is called from that goroutine; their Selects
// from it and, with workers, from the workers at once. Checkpoints, OutboxLen, ReadOutbox and
// Sinks may be called from any goroutine.
package journal
