package app

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dynwatch/dynwatch/httpapi"
)

// Starting touches code and tables that running never touches again: every package's
// initialisation (the client's scheme registers every API type), the configuration's
// parsing and checks, CEL's compilers, discovery, the informers' first lists. Their pages of
// the executable stay mapped, and counted in the process's resident memory (RssFile), for as
// long as the process runs: at 10,000 configmaps, the executable's resident pages were 54 to
// 56 MB after sync, and 20 to 23 MB once released (docs/benchmarks.md). Every startPagesEvery
// while dynwatch starts (startRelease), once every resource has synced, and once each burst of
// events is over (releaseBurstMemory), releaseStartPages unmaps the executable's read-only
// pages (MADV_DONTNEED): they are clean copies of the file, which the kernel maps again, from
// its page cache, when they are next touched, so what running uses comes back and the rest
// does not. Writable mappings (the executable's initialised data, which running has changed)
// are never touched. The pages stay in the page cache, where the kernel reclaims unmapped ones
// first.

// releaseStartPagesEvery is how often releaseStartPagesOnceReady asks whether every resource
// has synced.
const releaseStartPagesEvery = 250 * time.Millisecond

// Starting touches more of the executable than releases once built and once synced could
// bound: at 10,000 configmaps it was 24 to 41 MB resident again through the informers' lists,
// with the faults' read-around, a third of the peak to synced (12 to 18 MB with startRelease). While dynwatch
// starts, startRelease looks at its file-backed resident memory every startPagesEvery and
// releases the executable's pages whenever they have grown by startPagesGrowth over what
// running maps again after a release (the code and tables it keeps touching), so that what
// starting touches once does not stay (docs/benchmarks-history.md, "The executable's pages
// released while starting"). A start that touches nothing new (a sink down from the start,
// its initial deliveries retried) grows nothing, and is not released again and again.
const (
	startPagesEvery  = 20 * time.Millisecond
	startPagesGrowth = 4 << 20
)

// startPagesFor bounds how long startRelease runs: a start whose first burst never ends (a
// sink down from the start holds its initial deliveries) does not look at its memory, and
// release what grows, for as long as it runs.
const startPagesFor = time.Minute

// startRelease releases the executable's read-only pages, while they grow, from its start until
// Stop, until its bound has passed, or until its context ends, whichever comes first, and logs
// then how many releases it made and what they took.
type startRelease struct {
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// releaseWhileStarting starts looking at the process's file-backed resident memory every
// period, and releasing the executable's read-only pages each time they have grown by growth,
// for at most bound.
func releaseWhileStarting(ctx context.Context, log *slog.Logger, period time.Duration, growth uint64, bound time.Duration) *startRelease {
	r := &startRelease{log: log, stop: make(chan struct{}), done: make(chan struct{})}
	go r.run(ctx, period, growth, bound)
	return r
}

func (r *startRelease) run(ctx context.Context, period time.Duration, growth uint64, bound time.Duration) {
	defer close(r.done)
	t := time.NewTicker(period)
	defer t.Stop()
	end := time.NewTimer(bound)
	defer end.Stop()
	// floor is what running mapped again in the period after the last release: growth over it
	// is what starting touched since.
	var floor uint64
	settling := false
	releases, spent, why := 0, time.Duration(0), ""
	for why == "" {
		switch resident := residentFileBacked(); {
		case settling:
			floor, settling = resident, false
		case resident >= floor+growth:
			began := time.Now()
			if err := releaseStartPages(); err != nil {
				r.log.Info("stopped releasing the executable's pages while starting: a release failed", "err", err)
				return
			}
			releases, spent, settling = releases+1, spent+time.Since(began), true
		}
		select {
		case <-ctx.Done():
			return
		case <-r.stop:
			why = "the start is over"
		case <-end.C:
			why = "the start lasted longer than " + bound.String()
		case <-t.C:
		}
	}
	r.log.Info("stopped releasing the executable's pages while starting", "why", why, "releases", releases,
		"spent", spent.Round(time.Millisecond).String(), "fileBackedMiB", residentFileBacked()>>20)
}

// Stop ends the releases and returns once they have ended. Later calls do nothing.
func (r *startRelease) Stop() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

// releasingReadiness is the informers' readiness, releasing the start's pages the first time
// it finds every resource synced, before it says so. So /readyz's first 200 comes after the
// release, and so does anything a caller measures then; releaseStartPagesOnceReady asks it too,
// for a process nobody probes.
type releasingReadiness struct {
	httpapi.Readiness
	log  *slog.Logger
	once sync.Once
}

func (r *releasingReadiness) Ready() (bool, []string) {
	ready, why := r.Readiness.Ready()
	if ready {
		r.once.Do(func() { releaseStartPagesLogged(r.log) })
	}
	return ready, why
}

// releaseStartPagesOnceReady asks r every releaseStartPagesEvery until it is ready (and so has
// released the start's pages) or ctx ends.
func releaseStartPagesOnceReady(ctx context.Context, r *releasingReadiness) {
	t := time.NewTicker(releaseStartPagesEvery)
	defer t.Stop()
	for ready, _ := r.Ready(); !ready; ready, _ = r.Ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// releaseStartPagesLogged releases the start's pages once every resource has synced, and logs
// what it did.
func releaseStartPagesLogged(log *slog.Logger) {
	const now = "every resource has synced"
	before := residentFileBacked()
	if err := releaseStartPages(); err != nil {
		log.Info("the executable's pages touched while starting were not released", "now", now, "err", err)
		return
	}
	log.Info("released the executable's pages touched while starting", "now", now, "fileBackedBeforeMiB", before>>20, "fileBackedAfterMiB", residentFileBacked()>>20)
}

// residentFileBacked is the process's file-backed resident memory (RssFile) in bytes; 0 if it
// cannot be read.
func residentFileBacked() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// releaseStartPages unmaps every read-only mapping of the process's executable. The kernel
// maps a page again when it is next touched.
func releaseStartPages() error {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return err
	}
	ranges, err := readOnlyMappings("/proc/self/maps", exe)
	if err != nil {
		return err
	}
	for _, r := range ranges {
		// The mapping's address is not memory Go allocated: unix.Madvise's []byte cannot name it.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r[0], r[1]-r[0], unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("madvise %#x-%#x: %w", r[0], r[1], errno)
		}
	}
	return nil
}

// readOnlyMappings is the [start, end) of each mapping of path in the maps file that can be
// neither written nor shared.
func readOnlyMappings(maps, path string) ([][2]uintptr, error) {
	f, err := os.Open(maps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	var ranges [][2]uintptr
	s := bufio.NewScanner(f)
	for s.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(s.Text())
		if len(fields) != 6 || fields[5] != path {
			continue
		}
		if perms := fields[1]; len(perms) != 4 || perms[1] != '-' || perms[3] != 'p' {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(start, 16, 64)
		b, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			return nil, fmt.Errorf("%s: the line %q", maps, s.Text())
		}
		ranges = append(ranges, [2]uintptr{uintptr(a), uintptr(b)})
	}
	return ranges, s.Err()
}
