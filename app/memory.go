package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of the container's memory limit that the Go runtime gets as
// its soft memory limit. The rest is headroom for what the garbage collector does not see and
// the container's limit counts all the same: the state store's page cache, kernel buffers,
// stacks and the runtime's own overhead. The Go GC guide asks for 5–10%.
const memoryLimitRatio = 0.9

// memoryLimitRefresh is how often the cgroup's limit is read again, so that an in-place
// resize of the pod's memory limit moves the Go limit with it.
const memoryLimitRefresh = time.Minute

// gcPercent is dynwatch's GOGC: how far the heap grows past what the last collection left
// before the next one. The cache is kept as bytes (see object.Object), which the
// collector does not scan, so a collection costs little and comes often: at 20,000 configmaps,
// going from Go's 100 to 25 took resident anonymous memory after sync from 263 to 137 MiB
// (live heap 77 MiB) for CPU per update within the runs' spread (736 and 774 µs). Measured
// again once the objects' headers held no pointers: 15 saved a few MiB (anonymous memory after
// sync 88–95 MiB against 93–94) for 1.08–1.11x B0's CPU per update against 1.05–1.06x, and
// one of its four runs had an update → receipt p99 130 ms over B0's; 25 stays
// (docs/benchmarks.md, "The cache's own bytes"). Against 50 once a webhook's requests reused
// what they are made of: 50 cost 1.01–1.02x B0's CPU per update against 1.02–1.15x, for 8 to
// 10 MB more anonymous memory at 10,000 configmaps; 25 stays (docs/benchmarks-history.md,
// "Less made per request and per commit").
const gcPercent = 25

// setGCPercent sets the runtime's GOGC to gcPercent, unless GOGC is in the environment.
func setGCPercent(log *slog.Logger) {
	if v, ok := os.LookupEnv("GOGC"); ok {
		log.Info("GOGC is set in the environment: dynwatch leaves it alone", "gogc", v)
		return
	}
	debug.SetGCPercent(gcPercent)
}

// setMemoryLimit sets the Go runtime's soft memory limit to memoryLimitRatio of the memory
// limit of the process' cgroup (v1 or v2), and keeps it there until ctx ends. GOMEMLIMIT in
// the environment wins; AUTOMEMLIMIT sets another ratio, or "off". Without a cgroup limit the
// Go limit stays unset. The library logs what it set, and why it set nothing; where no cgroup
// can be read at all, that is said once, not at every refresh.
func setMemoryLimit(ctx context.Context, log *slog.Logger) {
	if _, err := memlimit.FromCgroup(); err != nil && !errors.Is(err, memlimit.ErrNoLimit) {
		log.Info("no cgroup memory limit can be read: the Go memory limit is the environment's", "err", err)
		return
	}
	_, _ = memlimit.Set( // a failure is logged by the library and leaves the runtime's default
		memlimit.WithRatio(memoryLimitRatio),
		memlimit.WithProvider(memlimit.FromCgroup),
		memlimit.WithLogger(log),
		memlimit.WithRefreshInterval(ctx, memoryLimitRefresh),
	)
}

// burstBacklog is the journal's backlog (journal.Backlog: events not yet committed, outbox
// entries not yet acknowledged) that makes a burst: an initial list's deliveries, a replay, a
// sink's outage caught up. What a burst held (its events, their queues, their requests' bodies)
// is garbage once it drains, and the collector would keep its pages until the runtime's
// background scavenger, paced to a small share of a processor, gave them back: at 10,000
// configmaps with two webhooks, 24 MB of a heap of 40 MB live after the initial deliveries.
// Steady traffic is not a burst: its entries wait up to a second for their acknowledgements
// to commit, so 300 updates a second to two sinks keep a backlog of about 600 (1,000 at
// times), and returning the memory after each lull would cost a collection and the pages'
// faults again for a few MB.
const burstBacklog = 10000

// returnMemoryEvery is how often returnMemoryAfterBursts looks at the backlog.
const returnMemoryEvery = 250 * time.Millisecond

// returnMemoryAfterBursts gives back the memory a burst left once the burst is over: after every
// resource's first sync (the initial lists are the first burst), and after each time the
// backlog reached burstBacklog, once ready says synced and the backlog is empty, it calls
// release (releaseBurstMemory), and logs what the heap returned and the process's file-backed
// resident memory before and after. It runs until ctx ends. A backlog that never drains (a sink
// down) is never a burst over: nothing is returned then, as before.
func returnMemoryAfterBursts(ctx context.Context, log *slog.Logger, ready func() bool, backlog func() int, release func() error) {
	t := time.NewTicker(returnMemoryEvery)
	defer t.Stop()
	burst := true // the start: the initial lists
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := backlog()
		if n >= burstBacklog {
			burst = true
		}
		if !burst || n > 0 || !ready() {
			continue
		}
		burst = false
		before, fileBacked := heapReleased(), residentFileBacked()
		err := release()
		attrs := []any{"releasedMiB", (heapReleased() - before) >> 20, "fileBackedBeforeMiB", fileBacked >> 20, "fileBackedAfterMiB", residentFileBacked() >> 20}
		if err != nil {
			attrs = append(attrs, "err", err) // the heap was returned; the executable's pages were not
		}
		log.Info("returned the memory a burst of events left free to the OS", attrs...)
	}
}

// releaseBurstMemory is what returnMemoryAfterBursts releases once a burst is over: the heap's
// free pages, after a collection (debug.FreeOSMemory), then the executable's read-only pages
// (releaseStartPages). A burst maps code and tables that steady running does not touch (a
// list's decoding, the initial deliveries, a replay's), and so does the collection, which reads
// the tables of every function on the goroutines' stacks: at 10,000 configmaps, 20 to 31 MB of
// the executable were resident once the initial deliveries were over, 5 to 13 MB once released
// (docs/benchmarks-history.md, "The executable's pages a burst mapped, released once it is over").
// What running uses is mapped again, from the page cache, as it is touched.
func releaseBurstMemory() error {
	debug.FreeOSMemory()
	return releaseStartPages()
}

// heapReleased is what the Go heap holds returned to the OS, in bytes.
func heapReleased() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
