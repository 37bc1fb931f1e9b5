package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime/debug"
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
// before the next one. The cache is kept as bytes with headers of offsets (see
// dynamicinformer.Object), none of which the collector scans, so a collection costs little and
// comes often: at 20,000 configmaps, going from Go's 100 to 25 took resident anonymous memory
// after sync from 263 to 137 MiB (live heap 77 MiB), and from 25 to 15, once the headers held
// no pointers, from 94 to 88 MiB, and the peak through the initial deliveries from 172 to 159
// MiB, for 1.08x B0's CPU per update against 1.06x (docs/benchmarks.md, "The cache's own
// bytes"); 10 cost 1.18x.
const gcPercent = 15

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
