package journal

import (
	"context"
	"fmt"
	"time"

	"github.com/dynwatch/dynwatch/object"
)

// ackDelay bounds how long an acknowledgement waits for a commit. Acknowledgements do
// not start commits of their own: they go with the next one that events start, and only
// when none has started for this long with one of their own. Under a steady stream of events
// that removes a commit (an fdatasync) per delivery; an acknowledgement lost in a crash is a
// delivery repeated with the same id, never one lost.
const ackDelay = time.Second

// Run flushes whenever something is pending that should commit now, and acknowledgements
// within ackDelay, until ctx ends; then it flushes and syncs once more. What a flush writes is
// handed to the sinks at once and synced within syncEvery, one fdatasync for every commit
// written meanwhile; the fdatasync runs on a goroutine of its own, and Run goes on committing
// while it does. Every releaseEvery it drops the pages reads of the store brought into the
// page cache. After a failed commit or sync it tries again with exponential backoff, from
// 100ms to 5s, not on every event.
func (j *Journal) Run(ctx context.Context) {
	retry := newStoppedTimer()
	acks := newStoppedTimer()
	syncs := newStoppedTimer()
	acksArmed, syncArmed := false, false
	var syncing <-chan struct{} // closed once the fdatasync in flight has returned
	var release <-chan time.Time
	if j.store != nil {
		t := time.NewTicker(releaseEvery)
		defer t.Stop()
		release = t.C
	}
	delay := time.Duration(0)
	failed := func(err error) {
		if err != nil {
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			retry.Reset(delay)
		} else {
			delay = 0
		}
	}
	// armSync starts the timer of the next sync, if something is left to sync and none is
	// in flight.
	armSync := func() {
		if delay == 0 && !syncArmed && syncing == nil && j.store != nil && j.store.log.Unsynced() {
			syncs.Reset(syncEvery)
			syncArmed = true
		}
	}
	for {
		select {
		case <-release:
			j.store.log.Release()
			continue
		case c := <-j.compacted:
			j.finishCompaction(c)
			j.maybeCompact() // the log may have outgrown the new snapshot meanwhile
			continue
		case <-j.wake:
			if delay > 0 {
				continue // failing: the timer decides when to try again
			}
		case <-j.lazy:
			if !acksArmed {
				acks.Reset(ackDelay)
				acksArmed = true
			}
			continue
		case <-acks.C:
			acksArmed = false
			if delay > 0 {
				continue
			}
		case <-syncs.C:
			syncArmed = false
			if delay == 0 && syncing == nil {
				var err error
				syncing, err = j.startSync()
				failed(err)
			}
			continue
		case <-syncing:
			syncing = nil
			failed(j.syncFinished())
			armSync() // what was committed while it ran
			continue
		case <-retry.C:
			failed(j.Flush())
			continue
		case <-ctx.Done():
			j.finish()
			return
		}
		failed(j.flush())
		armSync()
	}
}

func newStoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// syncEvery bounds how long a commit written stays unsynced: a delivery does not wait for its
// commit to be durable (see the package's guarantees), and the commits written within it share
// one fdatasync. What it bounds is what a power loss makes the next start derive and deliver
// again (never what it loses); an acknowledgement already waits up to ackDelay. At 20 ms the
// fdatasyncs of a steady 300 updates a second were 5% of dynwatch's CPU; at 100 ms, 1%.
const syncEvery = 100 * time.Millisecond

// sync makes what the commits wrote durable, waiting for a sync begun by startSync first.
func (j *Journal) sync() error {
	if j.store == nil || !j.store.log.Unsynced() {
		return nil
	}
	return j.syncDone(j.store.sync())
}

// startSync begins making what the commits wrote durable on a goroutine of its own, and
// returns the channel closed once it has returned (nil when nothing is unsynced): Run goes on
// committing meanwhile, then calls syncFinished.
func (j *Journal) startSync() (<-chan struct{}, error) {
	if j.store == nil || !j.store.log.Unsynced() {
		return nil, nil
	}
	done, err := j.store.startSync()
	if err != nil {
		j.failed(err)
	}
	return done, err
}

// syncFinished puts into effect the outcome of the sync startSync began.
func (j *Journal) syncFinished() error { return j.syncDone(j.store.finishSync()) }

// syncDone notes a sync's outcome: counted when it succeeded, readiness failed until one does
// when it did not.
func (j *Journal) syncDone(err error) error {
	if err != nil {
		j.failed(err)
		return err
	}
	j.m.syncs.Inc()
	j.recovered()
	return nil
}

// failed notes that a commit or a sync failed: readiness fails, naming the store, until one
// succeeds.
func (j *Journal) failed(err error) {
	j.m.commitErrors.Inc()
	msg := fmt.Sprintf("state store %s: commit failed: %v", j.store.Path, err)
	if j.failure.Swap(&msg) == nil {
		j.log.Error("state store commit failed: nothing more is delivered until a commit succeeds", "path", j.store.Path, "err", err)
	}
}

// recovered notes that a commit or a sync succeeded.
func (j *Journal) recovered() {
	if j.failure.Swap(nil) != nil {
		j.log.Info("state store commits again", "path", j.store.Path)
	}
}

// finish commits and syncs what is pending and what the workers still evaluate, until a commit
// fails.
func (j *Journal) finish() {
	for j.Flush() == nil && j.pre != nil && !j.pre.empty() {
		select {
		case <-j.wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// releaseEvery is how often the pages that reads of the log brought into the page cache
// are dropped: appends drop their own once a MiB of them is synced (wal's dropBatch).
const releaseEvery = 10 * time.Second

// syncBytes bounds what a flush leaves written and not synced: the log holds each commit's
// frame in memory until its fdatasync (to write it again if the sync fails) and the kernel
// holds its pages dirty, both counted against the pod's memory limit. Without it, the
// initial list of 20,000 configmaps, one flush of twenty commits, held 109 MB of commit
// buffers at once: half the heap at its peak.
const syncBytes = 8 << 20

// maxBatch bounds the operations of one commit, so that the first events of an initial list
// of many objects reach the sinks while the rest are still being written.
const maxBatch = 1024

// minBlock is the capacity a block of pending operations starts at when none waits before it
// (see Journal.submit).
const minBlock = 32

// maxCommitBytes bounds what one commit writes, as opSize estimates it: each object and, for
// each sink, an entry with the object and its old one. An initial list of large objects
// (etcd allows 1.5 MB each) made commits of gigabytes. A commit far smaller would part an
// event from those that arrived with it: with one fdatasync every syncBytes between commits,
// the others would wait for it.
const maxCommitBytes = 64 << 20

// Flush applies everything pending, as flush does, and syncs what it wrote.
func (j *Journal) Flush() error {
	if err := j.flush(); err != nil {
		return err
	}
	return j.sync()
}

// flush applies everything pending, in commits of a batch each (see batchLen), and queues each
// commit's entries once it is written; once the commits written since the last fdatasync pass
// syncBytes, it syncs them before the next. If a commit fails, nothing of it is queued and its
// operations wait for the next try, ahead of any that arrive meanwhile.
func (j *Journal) flush() error {
	for {
		j.mu.Lock()
		n := len(j.pending) + len(j.acks)
		j.mu.Unlock()
		if n == 0 {
			return nil
		}
		if err := j.flushBatch(); err != nil {
			return err
		}
		if j.store != nil && j.store.log.UnsyncedBytes() >= syncBytes {
			if err := j.sync(); err != nil {
				return err
			}
		}
	}
}

// flushBatch applies a batch of pending operations (see batchLen) in one commit.
func (j *Journal) flushBatch() error {
	targets := j.targets()
	ops, acks := j.takeBatch(len(targets))
	if len(ops) == 0 && len(acks) == 0 {
		return nil
	}
	seq, sinks, first, floor := j.seq, j.sinks, j.first, j.floor // put back if the commit fails
	j.sinks = cloneSinks(sinks)
	b := &j.batch
	defer b.reset()
	var tx *txn
	if j.store != nil {
		tx = j.store.begin(commitSize(ops, len(targets)) + len(acks)*ackSize)
		defer tx.end()
	}
	j.see(tx, targets, b)
	for _, a := range acks {
		if tx != nil && tx.ack(a.sink, a.seq) {
			b.removed = append(b.removed, removed(a))
		}
	}
	for _, o := range ops {
		if err := j.apply(tx, targets, o, b); err != nil {
			j.m.writeErrors.Inc()
			j.log.Error("state store operation failed: it is skipped, the rest of its batch commits", "op", o.String(), "err", err)
			if o.kind == opEvent && tx != nil {
				// Forget the object's state, so that the next start derives it again from the cache.
				tx.del(object.ResourceName(o.event.Resource), object.KeyOf(o.event.Object))
			}
		}
	}
	if tx != nil {
		// A process killed before its commit is written (a failpoint, for the tests of faults:
		// see test/runner.BuildWithFailpoints).
		// gofail: var beforeCommit struct{}
		p, err := tx.commit()
		if err != nil {
			j.seq, j.sinks, j.first, j.floor = seq, sinks, first, floor
			j.failed(err)
			j.mu.Lock()
			if len(ops) > 0 {
				j.pending = append([][]op{ops}, j.pending...)
			}
			j.acks = append(acks, j.acks...)
			j.mu.Unlock()
			return err
		}
		for i := range b.added {
			b.added[i].x.at = at(p, b.added[i].off)
		}
		j.m.commits.Inc()
		// A process killed once its commit is written, before its events reach the sinks.
		// gofail: var afterCommit struct{}
		j.recovered()
	}
	j.committed(b)
	j.pressure.give(eventBytes(ops))
	if b.sinks {
		j.publishSinks()
	}
	if j.pre != nil {
		for _, o := range ops {
			if o.pre != nil {
				j.pre.committed(o)
			}
		}
	}
	for _, gvr := range b.finished {
		delete(j.lists, gvr)
	}
	for _, q := range b.out {
		q.target.Queue(q.e)
	}
	for _, t := range b.retired {
		j.retired(t)
	}
	for _, reply := range b.replies {
		reply()
	}
	j.batchDone(ops, acks)
	j.maybeCompact()
	return nil
}

// takeBatch takes the pending operations one commit for that many sinks applies (see
// batchLen), oldest first, and every acknowledgement pending. Operations wait in blocks of up
// to maxBatch, so that a backlog (an initial list's 20,000 events, recorded at once) is not an
// array grown by copies (18 MB of garbage in a tenth of a second), and a batch is taken from
// the first block as it lies: the rest of the block when a commit holds all of it, or else
// its first slots, capped so that nothing is appended into them. batchDone clears them once
// applied, so that they keep no event, and its objects, alive, and keeps a block for the
// next.
func (j *Journal) takeBatch(sinks int) (ops []op, acks []ack) {
	j.mu.Lock()
	defer j.mu.Unlock()
	acks, j.acks, j.spareAcks = j.acks, j.spareAcks, nil
	if len(j.pending) == 0 {
		return nil, acks
	}
	first := j.pending[0]
	n := batchLen(first, sinks, j.commitBytes)
	if n < len(first) {
		j.pending[0] = first[n:]
		return first[:n:n], acks
	}
	n = copy(j.pending, j.pending[1:])
	j.pending[n] = nil // the last block, now also in the slot before
	j.pending = j.pending[:n]
	return first, acks
}

// batchLen is how many of ops, from the first, one commit for that many sinks applies: up to
// maxBatch, and no more than limit bytes as opSize estimates them, or the first alone when
// it is larger.
func batchLen(ops []op, sinks, limit int) int {
	size := 0
	for i, o := range ops {
		if i == maxBatch {
			return i
		}
		if size += opSize(o, sinks, false); i > 0 && size > limit {
			return i
		}
	}
	return len(ops)
}

// batchDone clears the operations of a batch applied and committed, so that they keep no
// event alive, and keeps their block for the next operations if it is larger than the one
// spare (never more than maxBatch). The acknowledgements' array is kept so too, unless a
// backlog grew it.
func (j *Journal) batchDone(ops []op, acks []ack) {
	clear(acks)
	clear(ops)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.spareAcks == nil && cap(acks) <= 2*maxBatch {
		j.spareAcks = acks[:0]
	}
	if cap(ops) <= maxBatch && cap(ops) > cap(j.spare) {
		j.spare = ops[:0]
	}
}
